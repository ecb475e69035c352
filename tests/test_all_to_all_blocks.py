"""``all_to_all_blocks``: the exchange form of all_to_all (split = concat = dim 0)."""

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings

import collectives as cx
from collectives.hlo import collective_stats
from collectives.testing import assert_forms_agree
from collectives.testing.strategies import recipe_cases
from helpers import load_recipe

NAME = "all_to_all_blocks"


@settings(max_examples=6)
@given(case=recipe_cases(cx.RECIPES[NAME]))
def test_forms_match_oracle_exactly(case):
    assert_forms_agree(cx.RECIPES[NAME], *case.args, mesh=case.mesh,
                       axis=case.axis, rtol=0, atol=0)


def test_one_dimensional_input_of_n_n_c_elements():
    recipe = cx.RECIPES[NAME]
    mesh = cx.make_mesh((4,), "i")
    x = np.arange(4 * 4 * 2, dtype=np.int32)  # device d holds 8d .. 8d+7
    got = np.asarray(recipe.shard_map(x, mesh=mesh))
    # device j gets chunk j (2 elements) of every device, in device order
    want = np.concatenate([x[8 * d + 2 * j: 8 * d + 2 * j + 2]
                           for j in range(4) for d in range(4)])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(recipe.reference(x, mesh=mesh), want)
    assert_forms_agree(recipe, x, mesh=mesh, rtol=0, atol=0)


@pytest.mark.parametrize("shape, names, axis", [
    ((8,), ("i",), None), ((4, 2), ("i", "j"), None), ((4, 2), ("i", "j"), "j")])
def test_applied_twice_is_the_identity(shape, names, axis):
    recipe = cx.RECIPES[NAME]
    mesh = cx.make_mesh(shape, names)
    (x,) = recipe.example_args(mesh, axis, dims=(1, 2), exact=True)
    once = recipe.shard_map(x, mesh=mesh, axis=axis)
    np.testing.assert_array_equal(recipe.jit(once, mesh=mesh, axis=axis), x)


@pytest.mark.parametrize("form", ["shard_map", "jit", "explicit"])
@pytest.mark.parametrize("shape, names, axis", [
    ((8,), ("i",), None), ((4, 2), ("i", "j"), "i")])
def test_compiles_to_one_all_to_all_of_one_block(form, shape, names, axis):
    recipe = cx.RECIPES[NAME]
    mesh = cx.make_mesh(shape, names)
    axes = recipe.axes(mesh, axis)
    args = recipe.example_args(mesh, axis, dims=(2, 3))
    placed = recipe.place(*args, axes=axes, form=form)
    stats = collective_stats(recipe.compiled(form, axes), *placed)
    assert stats.nonzero() == {"all-to-all": 1}
    # each device keeps 1 of its n chunks and sends n - 1
    block = args[0].nbytes // (axes.size * axes.others_size)
    assert stats.bytes("all-to-all") == block * (axes.size - 1) / axes.size
    assert recipe.cost_model(axes, tuple(args), form).mismatch(stats) is None


def test_dim_zero_not_a_multiple_of_n_squared_is_refused():
    mesh = cx.make_mesh((4,), "i")
    with pytest.raises(ValueError, match=r"multiple of n\*n = 16"):
        cx.RECIPES[NAME].shard_map(np.zeros(8, np.float32), mesh=mesh)


def test_diagram_sends_chunk_j_to_device_j():
    d = cx.diagram(NAME, n_devices=4)
    for device, (block, source) in enumerate(zip(d.after, d.after_source, strict=True)):
        assert source.ravel().tolist() == [0, 1, 2, 3]
        assert block.ravel().tolist() == [d.before[s][device, 0] for s in range(4)]


def test_recipe_file_agrees_with_the_library():
    module = load_recipe(NAME)
    mesh = cx.make_mesh((8,), "i")
    x = np.arange(8 * 8 * 3 * 2, dtype=np.float32).reshape(-1, 2)
    want = cx.RECIPES[NAME].reference(x, mesh=mesh)
    for got in (module.all_to_all_blocks_shard_map(x, mesh),
                module.all_to_all_blocks_jit(x, mesh),
                module.all_to_all_blocks_explicit(
                    x, module.make_mesh(8, jax.sharding.AxisType.Explicit)),
                module.all_to_all_blocks_numpy(x, 8)):
        np.testing.assert_array_equal(np.asarray(got), want)
