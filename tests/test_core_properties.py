"""Every core recipe: pmap == shard_map == jit == the NumPy oracle, on drawn cases."""

import re

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import collectives as cx
from collectives._registry import core_names
from collectives.testing import assert_forms_agree
from collectives.testing.strategies import meshes
from helpers import ROOT
from helpers import assert_exact_on_a_drawn_case

CORE = core_names()


def test_core_names_are_the_readme_contract_and_registered_first():
    # The README's "Core recipes" bullet is the contract (its names); the
    # registry lists those recipes first.
    text = (ROOT / "README.md").read_text()
    bullet = text[text.index("- **Core recipes**"):].split("\n- ")[0]
    contract = re.findall(r"`([a-z_]+)`", bullet)
    assert sorted(contract) == sorted(CORE) and len(set(contract)) == len(contract)
    assert tuple(cx.RECIPES)[: len(CORE)] == CORE


@pytest.mark.parametrize("name", CORE)
@given(data=st.data())
def test_forms_match_oracle_exactly(name, data):
    assert_exact_on_a_drawn_case(name, data)


@pytest.mark.parametrize("name", CORE)
@given(mesh=meshes(), seed=st.integers(0, 2**16),
       dtype=st.sampled_from(["float32", "float16", "bfloat16"]))
def test_forms_match_oracle_within_policy(name, mesh, seed, dtype):
    # Gaussian data: the sums round, so the tolerance policy applies.
    recipe = cx.RECIPES[name]
    args = recipe.example_args(mesh, dtype=dtype, seed=seed, dims=(2, 3))
    assert_forms_agree(recipe, *args, mesh=mesh)


@pytest.mark.parametrize("name", CORE)
def test_float64_under_x64(name):
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    with jax.enable_x64(True):
        args = recipe.example_args(mesh, dtype="float64", seed=1)
        assert args[0].dtype == np.float64
        report = assert_forms_agree(recipe, *args, mesh=mesh)
        for form in cx.FORMS:
            assert report.results[form].dtype == np.float64, form
