"""The DP and DP x TP diagram's trace: the all-reduces of the compiled
shard_map forms of ``recipes/dp_tp_mlp.py``, named by what they sum."""

import jax
import numpy as np
import pytest
from jax import lax

import collectives as cx
from collectives._compat import all_gather_invariant
from collectives._strategy_diagrams import dp_tp_mlp as diagram
from collectives.hlo import bytes_moved
from collectives.recipes import dp_tp_mlp as file
from helpers import assert_draws_svg

N = 8


@pytest.fixture(scope="module")
def record():
    return diagram.trace(N)


def test_data_parallel_sums_loss_and_gradients_once(record):
    dp = record.dp
    assert (dp.data, dp.model, dp.rows) == (N, 1, file.BATCH // N)
    (step,) = dp.steps
    assert (step.kind, step.axis, step.what, step.group) == (
        "all-reduce", "data", diagram.GRADIENTS, N)
    params = file.init_params(file.SIZES)
    assert step.operand_bytes == 4 * (1 + sum(a.size for a in params.values()))


def test_megatron_sums_each_pairs_output_and_one_gradient_over_model(record):
    tp = record.tp
    assert (tp.data, tp.model, tp.rows) == (N // 2, 2, file.BATCH // (N // 2))
    assert [s.what for s in tp.steps] == [diagram.PAIR1_OUT, diagram.PAIR2_OUT,
                                          diagram.INTO_HIDDEN2, diagram.GRADIENTS]
    assert [s.axis for s in tp.steps] == ["model"] * 3 + ["data"]
    assert [s.group for s in tp.steps] == [2, 2, 2, N // 2]
    h2, d_out = file.SIZES[2], file.SIZES[-1]
    assert [s.operand_bytes for s in tp.steps[:3]] == [
        4 * tp.rows * h2, 4 * tp.rows * d_out, 4 * tp.rows * h2]
    # each device holds half of W1..W4 and b1, b3; b2 and b4 whole
    params = file.init_params(file.SIZES)
    split = sum(params[k].size for k in ("w1", "b1", "w2", "w3", "b3", "w4"))
    whole = params["b2"].size + params["b4"].size
    assert tp.held_bytes == 4 * (split // 2 + whole)
    assert tp.steps[-1].operand_bytes == tp.held_bytes + 4


def test_each_collective_sends_the_cost_models_bytes(record):
    for layout, name in ((record.dp, "dp_mlp"), (record.tp, "dp_tp_mlp")):
        for step in layout.steps:
            assert step.bytes == bytes_moved(step.kind, step.operand_bytes, step.group)
        recipe = cx.RECIPES[name]
        shape, names = ((N,), ("i",)) if layout.model == 1 else ((N // 2, 2),
                                                                 ("i", "j"))
        mesh = cx.make_mesh(shape, names)
        params = file.init_params(file.SIZES)
        x = np.zeros((file.BATCH, file.SIZES[0]), np.float32)
        y = np.zeros((file.BATCH, file.SIZES[-1]), np.float32)
        (expected,) = recipe.expected_costs("shard_map", recipe.axes(mesh),
                                            (params, x, y))
        assert dict(expected.counts) == {"all-reduce": len(layout.steps)}
        assert sum(s.bytes for s in layout.steps) == pytest.approx(
            expected.bytes["all-reduce"])


def test_the_traced_runs_are_the_recipe(record):
    for layout in (record.dp, record.tp):
        assert layout.loss == pytest.approx(layout.loss_oracle, rel=1e-5)
        assert layout.grad_error < 1e-4


def test_text_lists_every_collective(record):
    table = diagram.text(record)
    assert "JAX " + jax.__version__ in table
    assert table.count("all-reduce | model (2)") == 3
    assert table.count("loss and every gradient") == 2
    assert "gradient into layer 3's input" in table


class _ModelSumByGather:
    """``lax`` whose psum over the model axis gathers every device's
    partial result and adds them up: the same numbers, another collective."""

    def __getattr__(self, name):
        return getattr(lax, name)

    @staticmethod
    def psum(x, axis_name):
        if axis_name != file.MODEL:
            return lax.psum(x, axis_name)
        return all_gather_invariant(x, axis_name).sum(0)


def test_a_sum_written_as_a_gather_shows_in_the_trace(record, monkeypatch):
    monkeypatch.setattr(file, "lax", _ModelSumByGather())
    broken = diagram.trace(N)
    assert broken.tp.loss == pytest.approx(broken.tp.loss_oracle, rel=1e-5)
    over_model = [s for s in broken.tp.steps if s.axis == "model"]
    # the same activations move, by another collective: the trace says which
    assert [s.what for s in over_model] == [diagram.PAIR1_OUT, diagram.PAIR2_OUT,
                                            diagram.INTO_HIDDEN2]
    assert {s.kind for s in over_model} == {"all-gather"}
    assert diagram.text(broken).count("all-gather | model (2)") == 3
    assert broken.dp.steps == record.dp.steps


def test_equal_h2_and_output_widths_are_refused():
    with pytest.raises(ValueError, match="different widths"):
        diagram.trace(N, sizes=(16, 64, 8, 64, 8))


def test_draw_writes_an_svg(record, tmp_path):
    assert_draws_svg(diagram, record, tmp_path, widths=("wide", "narrow"))
    assert "JAX " + jax.__version__ in diagram.CAPTION


def test_a_global_mesh_of_the_callers_changes_nothing(record):
    # On JAX's defaults (an Explicit mesh set with jax.set_mesh) the trace
    # runs on the meshes it builds, and records what it records without one.
    with jax.set_mesh(jax.make_mesh((4, 2), ("X", "Y"))):
        under = diagram.trace(N)
    assert [layout.steps for layout in (under.dp, under.tp)] == [
        layout.steps for layout in (record.dp, record.tp)]
