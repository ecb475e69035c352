"""FSDP (ZeRO-3) and FSDP x TP: loss and gradients equal one device's
``jax.value_and_grad`` and the NumPy oracle, come back sharded like the
parameters, and compile to per-layer all-gathers and reduce-scatters."""

import re

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import collectives as cx
from collectives._recipes.fsdp import N_LAYERS
from collectives.hlo import collective_stats
from collectives.testing import assert_forms_agree
from collectives.testing.strategies import recipe_cases
from helpers import assert_loss_and_grads_match
from helpers import examples

NAMES = ("fsdp_mlp", "fsdp_tp_mlp")
RTOL, ATOL = 1e-5, 1e-5  # float32 through eight chained matmuls of width <= 16



def _gaussian(args, seed):
    # Weights scaled by 1/sqrt(fan_in), as init_mlp does, keep activations O(1).
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda a: (rng.standard_normal(a.shape)
                   / np.sqrt(a.shape[0] if a.ndim == 2 else 4)).astype(a.dtype), args)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=examples(2))
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_forms_equal_one_device_value_and_grad(name, data, seed):
    recipe = cx.RECIPES[name]
    case = data.draw(recipe_cases(recipe, dtypes=("float32",), ndim=(1,)))
    args = _gaussian(case.args, seed)
    report = assert_forms_agree(recipe, *args, mesh=case.mesh, axis=case.axis)
    want_loss, want = jax.jit(jax.value_and_grad(cx.mlp_loss))(*args)
    assert_loss_and_grads_match(report, want_loss, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name,axis", [("fsdp_mlp", None), ("fsdp_mlp", "j"),
                                       ("fsdp_tp_mlp", None),
                                       ("fsdp_tp_mlp", ("j", "i"))])
def test_gradients_come_back_sharded_like_the_parameters(name, axis):
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    axes = recipe.axes(mesh, axis)
    args = recipe.example_args(mesh, axis)
    specs = recipe.in_specs(axes)[0]
    for form in ("shard_map", "jit"):
        _, grads = recipe.compiled(form, axes)(*recipe.place(*args, axes=axes))
        for key, grad in grads.items():
            want = jax.sharding.NamedSharding(mesh, specs[key])
            assert grad.sharding.is_equivalent_to(want, grad.ndim), (form, key)
            block = grad.addressable_shards[0].data
            assert block.shape == want.shard_shape(grad.shape), (form, key)
            assert block.size < grad.size, (form, key)  # a block, not a copy


def test_fsdp_tp_needs_a_data_and_a_model_axis():
    recipe = cx.RECIPES["fsdp_tp_mlp"]
    mesh = cx.make_mesh((8,), "i")
    args = cx.RECIPES["fsdp_mlp"].example_args(mesh)
    with pytest.raises(ValueError,
                       match=r"needs two collective axes .*\(data, model\)"):
        recipe.shard_map(*args, mesh=mesh)


def test_a_parameter_that_does_not_split_is_named():
    mesh = cx.make_mesh((8,), "i")
    params = cx.init_mlp((8, 12, 16, 16, 8))
    x, y = np.ones((16, 8), np.float32), np.ones((16, 8), np.float32)
    with pytest.raises(ValueError, match=r"params\['b1'\]: dimension 0 has size 12"):
        cx.RECIPES["fsdp_mlp"].jit(params, x, y, mesh=mesh)


# -- HLO --------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_the_program_gathers_each_layer_twice_and_scatters_once(name):
    # The shard_map form as written (StableHLO, before XLA's passes): per
    # layer one all-gather forward and one backward (no gradient flows into
    # x, so layer 1 has none backward), one reduce-scatter per layer.
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    axes = recipe.axes(mesh)
    args = recipe.place(*recipe.example_args(mesh), axes=axes)
    text = recipe.compiled("shard_map", axes).lower(*args).as_text()
    assert len(re.findall(r"stablehlo\.all_gather", text)) == 2 * N_LAYERS - 1
    assert len(re.findall(r"stablehlo\.reduce_scatter", text)) == N_LAYERS
    assert len(re.findall(r"stablehlo\.all_reduce", text)) == (
        1 if name == "fsdp_mlp" else 3)


@pytest.mark.parametrize("form", ["shard_map", "jit"])
@pytest.mark.parametrize("name,shape,axis", [
    ("fsdp_mlp", (8,), None), ("fsdp_mlp", (4, 2), "j"),
    ("fsdp_tp_mlp", (4, 2), None)])
def test_compiled_collectives_meet_the_cost_model(form, name, shape, axis):
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh(shape, ("i", "j")[:len(shape)])
    axes = recipe.axes(mesh, axis)
    args = recipe.example_args(mesh, axis)
    stats = collective_stats(recipe.compiled(form, axes),
                             *recipe.place(*args, axes=axes))
    problems = [e.mismatch(stats) for e in recipe.expected_hlo(form, axes, args)]
    assert None in problems, problems
    if form == "shard_map":
        # No full parameter is all-reduced: the only all-reduces are the
        # loss (one scalar) and, with TP, the two [rows, hidden] activations.
        biggest = max(v.nbytes for v in args[0].values())
        assert all(op.operand_bytes < biggest for op in stats.ops
                   if op.kind == "all-reduce"), stats
