"""The registry is the one list: a recipe registered anywhere reaches the CLI's
``list`` and ``check``, the hypothesis strategies and the conformance suite
with no other edit."""

import dataclasses
import re
import textwrap

import pytest

import collectives as cx
from collectives._registry import register
from helpers import ROOT
from helpers import run_python

THROWAWAY = textwrap.dedent('''
    """A recipe defined outside the package: twice the psum of the blocks."""
    import numpy as np
    from jax import lax

    from collectives import Recipe
    from collectives._costs import one_collective
    from collectives._layout import grid_shape
    from collectives._layout import make_spec
    from collectives._numpy import blocks
    from collectives._registry import register

    register(Recipe(
        name="throwaway_double_psum", summary="2 * psum, a recipe from outside",
        body=lambda x, *, axis: 2 * lax.psum(x, axis),
        program=lambda x, *, axes: 2 * blocks(x, axes.size).sum(0, dtype=x.dtype),
        oracle=lambda x, *, axes: (2 * blocks(x, axes.size).sum(0)).astype(x.dtype),
        in_specs=lambda axes: (make_spec(axes.entry, axes.others_entry),),
        out_specs=lambda axes: make_spec(None, axes.others_entry),
        example_shapes=lambda axes, dims: (grid_shape(axes, dims),),
        count_terms=lambda axes: axes.size + 1, dtype_kinds=frozenset({"float", "int"}),
        hlo=one_collective("all-reduce"), source="reductions.py"))

    def pytest_configure(config):
        del config  # imported as a plugin (-p) so it registers before collection
''')


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("throwaway")
    (path / "throwaway_recipe.py").write_text(THROWAWAY)
    return path


def _env(plugin_dir):
    return {"PYTHONPATH": f"{plugin_dir}:{ROOT}", "JAX_NUM_CPU_DEVICES": "8"}


def test_a_new_recipe_reaches_list_and_check(plugin_dir):
    script = ("import throwaway_recipe\n"
              "from collectives._cli import main\n"
              "main(['list']); raise SystemExit(main(['check', "
              "'throwaway_double_psum']))")
    out = run_python("-c", script, cwd=ROOT, env=_env(plugin_dir)).stdout
    assert re.search(r"^throwaway_double_psum +2 \* psum", out, re.M), out
    rows = re.findall(r"^throwaway_double_psum +\S+ +\S+ +float32 .* ok$", out, re.M)
    assert len(rows) == 4, out  # check's four mesh configurations
    assert "4 agree, 0 disagree" in out, out


def test_a_new_recipe_reaches_the_conformance_suite(plugin_dir):
    args = ("-m", "pytest", "-p", "throwaway_recipe", "-p", "no:cacheprovider",
            "tests/test_conformance.py", "-q")
    collected = run_python(*args, "--collect-only", "-k", "throwaway_double_psum",
                           cwd=ROOT, env=_env(plugin_dir)).stdout
    ids = [line for line in collected.splitlines() if "throwaway_double_psum" in line]
    assert len(ids) >= 5, collected
    # Run the value, cost-model and retrace checks on it.
    ran = run_python(
        *args, "-k", "throwaway_double_psum and (oracle or cost_model or retrace)",
        cwd=ROOT, env=_env(plugin_dir)).stdout
    assert re.search(r"\b[5-9] passed|\b\d\d passed", ran), ran
    assert "failed" not in ran, ran


def test_a_new_recipe_reaches_the_strategies():
    from hypothesis import given
    from hypothesis import settings

    from collectives.testing import assert_forms_agree
    from collectives.testing.strategies import recipe_cases

    recipe = cx.Recipe(
        name="throwaway_identity", summary="x as it is",
        body=lambda x, *, axis: x, program=lambda x, *, axes: x,
        oracle=lambda x, *, axes: x, in_specs=lambda axes: (cx.RECIPES[
            "axis_index"].in_specs(axes)[0],),
        out_specs=lambda axes: cx.RECIPES["axis_index"].out_specs(axes),
        example_shapes=lambda axes, dims: cx.RECIPES["axis_index"].example_shapes(
            axes, dims))
    seen = []

    @settings(max_examples=3, database=None)
    @given(case=recipe_cases(recipe))
    def run(case):
        seen.append(case)
        assert_forms_agree(recipe, *case.args, mesh=case.mesh,
                           axis=case.axis, rtol=0, atol=0)

    run()
    assert seen


def test_exact_dtypes_limit_the_drawn_dtypes_and_are_checked():
    from hypothesis import given
    from hypothesis import settings

    from collectives.testing.strategies import recipe_cases

    grads = cx.RECIPES["dp_grads"]
    assert grads.draws_exact("float32") and not grads.draws_exact("bfloat16")
    assert not grads.draws_exact("int32")  # not a kind it accepts
    assert cx.RECIPES["psum"].draws_exact("bfloat16")  # None: every dtype
    drawn = set()

    def draw(dtypes):
        @settings(max_examples=20, database=None)
        @given(case=recipe_cases(grads, max_dim=1, dtypes=dtypes))
        def run(case):
            drawn.add(case.dtype)
        run()

    draw(("float32", "int32", "float16", "bfloat16"))
    assert drawn == {"float32"}
    with pytest.raises(ValueError, match=r"dtypes=\('bfloat16',\) holds none.*"
                                         r"exact_dtypes=\['float32', 'float64'\]"):
        draw(("bfloat16",))
    with pytest.raises(ValueError, match=r"exact_dtypes=\['int32'\] names .*"
                                         "dtype_kinds=\\['float'\\]"):
        dataclasses.replace(grads, exact_dtypes=frozenset({"int32"}))


def test_registering_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="'psum' is already registered"):
        register(cx.RECIPES["psum"])


def test_the_registry_lists_core_recipes_first_then_by_family():
    families = [recipe.family for recipe in cx.RECIPES.values()]
    order = {family: index for index, family in enumerate(cx.FAMILIES)}
    assert families == sorted(families, key=order.__getitem__)
