"""Memory per device, measured: FSDP stores 1/n of the parameters and of the
Adam state on each device, data parallelism all of it; the strategies table
agrees with its formulas."""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives import bench


def _placed_with_adam(name, mesh):
    recipe = cx.RECIPES[name]
    axes = recipe.axes(mesh)
    params, x, y = recipe.place(*recipe.example_args(mesh), axes=axes)
    optimizer = optax.adam(1e-3)
    # Adam's moments laid out like the parameters; its step count replicated
    shapes = jax.eval_shape(optimizer.init, params)
    specs = recipe.in_specs(axes)[0]
    shardings = jax.tree_util.tree_map(lambda _: NamedSharding(mesh, P()), shapes)
    shardings = (shardings[0]._replace(
        mu={k: NamedSharding(mesh, specs[k]) for k in params},
        nu={k: NamedSharding(mesh, specs[k]) for k in params}), *shardings[1:])
    state = jax.jit(optimizer.init, out_shardings=shardings)(params)
    return recipe, axes, (params, x, y), state


@pytest.mark.parametrize("name,share", [("fsdp_mlp", 1 / 8), ("dp_mlp", 1)])
def test_params_and_adam_state_per_device(name, share):
    mesh = cx.make_mesh((8,), "i")
    _, _, (params, _, _), state = _placed_with_adam(name, mesh)
    leaves = jax.tree_util.tree_leaves((params, state))
    total = sum(np.asarray(a).nbytes for a in leaves)
    count = 4  # Adam's step count, an int32 every device keeps
    per_device = cx.device_bytes((params, state))
    assert len(per_device) == 8
    for stored in per_device.values():
        assert stored == (total - count) * share + count, (stored, total)


def test_fsdp_program_arguments_are_one_eighth():
    mesh = cx.make_mesh((8,), "i")
    recipe, axes, placed, _ = _placed_with_adam("fsdp_mlp", mesh)
    total = sum(np.asarray(a).nbytes for a in jax.tree_util.tree_leaves(placed))
    for form in ("shard_map", "jit"):
        memory = cx.compiled_memory(recipe.compiled(form, axes), *placed)
        assert memory["arguments"] == total // 8, (form, memory)
        # outputs: the loss, 1/8 of the gradients, and (XLA:CPU counts it)
        # the output tuple's table of 8-byte pointers, one per output
        grads = sum(v.nbytes for v in placed[0].values())
        table = 8 * (1 + len(placed[0])) if jax.default_backend() == "cpu" else 0
        assert memory["outputs"] == 4 + grads // 8 + table, (form, memory)


def test_strategy_table_measurements_equal_their_formulas():
    rows = {row.label: row for row in cx.strategy_table()}
    assert set(rows) == {"DP", "DP x TP", "FSDP", "FSDP x TP", "PP"}
    for row in rows.values():
        assert row.sent == pytest.approx(row.sent_model), row
        assert row.params == row.params_model, row
    assert rows["DP"].params == rows["DP"].params_total
    assert rows["FSDP"].params * 8 == rows["FSDP"].params_total
    assert rows["PP"].params * 8 == rows["PP"].params_total
    assert rows["FSDP"].arguments < rows["DP"].arguments / 4
    assert set(rows["PP"].collectives) == {"collective-permute", "all-reduce"}


def test_the_bench_reads_memory_through_compiled_memory():
    fn = jax.jit(lambda x: 2 * x)
    x = np.ones(256, np.float32)
    memory = cx.compiled_memory(fn, x)
    assert bench.memory_per_device(fn, x) == {
        "argument_bytes": memory["arguments"], "output_bytes": memory["outputs"],
        "temp_bytes": memory["temporaries"], "alias_bytes": memory["aliased"]}
    with pytest.raises(TypeError, match=r"fn: expected a jax.jit .*Fix: wrap it"):
        cx.compiled_memory(lambda x: x, x)
