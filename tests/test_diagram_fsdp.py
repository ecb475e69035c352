"""The FSDP diagram's trace: the per-layer gathers and scatters of the compiled
shard_map form of ``recipes/fsdp.py``, and what one device holds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import collectives as cx
from collectives._strategy_diagrams import fsdp as diagram
from collectives.hlo import bytes_moved
from collectives.recipes import fsdp as file
from helpers import assert_draws_svg

N, LAYERS = 8, 4


@pytest.fixture(scope="module")
def record():
    return diagram.trace(N)


def layers_of(steps):
    return [s.layer for s in steps]


def test_one_forward_gather_per_layer_then_scatters_in_reverse(record):
    forward = record.of(diagram.FORWARD)
    scatters = record.of(diagram.GRADIENT)
    assert layers_of(forward) == [1, 2, 3, 4]
    assert layers_of(scatters) == [4, 3, 2, 1]
    assert all(s.kind == "all-gather" for s in forward)
    assert all(s.kind == "reduce-scatter" for s in scatters)
    # every collective is a layer's, but the loss's scalar all-reduce
    (loss,) = [s for s in record.steps if s.phase == diagram.OTHER]
    assert (loss.kind, loss.layer, loss.operand_bytes) == ("all-reduce", 0, 4)
    order = record.steps.index
    assert order(forward[-1]) < order(loss) < order(scatters[0])
    assert all(s.group == N for s in record.steps)


def test_backward_regathers_are_kept_or_merged(record):
    # as written: layers 2.. gathered again backward (no gradient flows into x)
    assert record.written_regathers == (2, 3, 4)
    kept = layers_of(record.of(diagram.BACKWARD))
    assert sorted(kept + list(record.merged)) == [2, 3, 4]
    assert kept == sorted(kept, reverse=True)  # backward: last layer first
    if jax.__version__.startswith("0.10.") and record.backend == "cpu":
        assert record.merged == (2, 3, 4) and not kept  # see docs/strategies.md


def test_each_collective_sends_the_cost_models_bytes(record):
    for step in record.steps:
        if step.layer:  # (n-1)/n of the whole layer buffer, gather or scatter
            whole = int(record.held[step.layer - 1]) * N
            assert step.bytes == bytes_moved(step.kind, whole, N)
    recipe = cx.RECIPES["fsdp_mlp"]
    mesh = cx.make_mesh((N,), diagram.DATA)
    params = file.init_params(diagram.SIZES)
    x = np.zeros((diagram.ROWS * N, diagram.SIZES[0]), np.float32)
    y = np.zeros((diagram.ROWS * N, diagram.SIZES[-1]), np.float32)
    counts, sent = {}, {}
    for step in record.steps:
        counts[step.kind] = counts.get(step.kind, 0) + 1
        sent[step.kind] = sent.get(step.kind, 0.0) + step.bytes
    matches = [
        dict(e.counts) == counts
        and all(sent[k] == pytest.approx(b) for k, b in e.bytes.items())
        for e in recipe.expected_costs("shard_map", recipe.axes(mesh), (params, x, y))]
    assert any(matches), (counts, sent)


def test_one_device_holds_one_nth_of_each_layer(record):
    sizes = diagram.SIZES
    whole = [4 * (sizes[k - 1] * sizes[k] + sizes[k]) for k in range(1, LAYERS + 1)]
    np.testing.assert_array_equal(record.gathered, whole)
    np.testing.assert_array_equal(record.held * N, whole)
    for k, owners in enumerate(record.owners, 1):
        # the gathered weight's rows: device 0's block, then 1's, ... 7's
        np.testing.assert_array_equal(
            owners, np.repeat(np.arange(N), sizes[k - 1] // N))


def test_the_traced_run_is_the_recipe(record):
    assert record.loss == pytest.approx(record.loss_oracle, rel=1e-5)


def test_text_lists_every_collective(record):
    table = diagram.text(record)
    assert "JAX " + jax.__version__ in table
    assert table.count("reduce-scatter of grad") == LAYERS
    assert "400 B" in table and "3,200 B" in table  # layer 3: held, gathered


def test_saving_the_gathered_weights_drops_the_regathers(monkeypatch):
    # mutation: a remat policy that saves everything keeps the gathered
    # weights for the backward pass, so not even the program as written
    # gathers them again
    monkeypatch.setattr(file, "POLICY", jax.checkpoint_policies.everything_saveable)
    broken = diagram.trace(N)
    assert broken.written_regathers == () and broken.merged == ()
    assert layers_of(broken.of(diagram.FORWARD)) == [1, 2, 3, 4]


class _GatherByPsum:
    """``lax`` whose all_gather is a psum of zero-padded blocks (DP-style)."""

    def __getattr__(self, name):
        return getattr(lax, name)

    @staticmethod
    def all_gather(x, axis_name, *, tiled=False):
        assert tiled
        n = lax.axis_size(axis_name)
        buffer = jnp.zeros((n * x.shape[0], *x.shape[1:]), x.dtype)
        start = lax.axis_index(axis_name) * x.shape[0]
        return lax.psum(lax.dynamic_update_slice_in_dim(buffer, x, start, 0),
                        axis_name)


def test_a_gather_written_as_psum_shows_in_the_trace(record, monkeypatch):
    monkeypatch.setattr(file, "lax", _GatherByPsum())
    broken = diagram.trace(N)
    assert broken.loss == pytest.approx(broken.loss_oracle, rel=1e-5)
    # no gathers or scatters: all-reduces of the whole layers instead (XLA
    # combines the four forward ones into one), each sending twice what a
    # gather of its buffer sends
    assert not broken.of(diagram.FORWARD) and not broken.of(diagram.GRADIENT)
    assert {s.kind for s in broken.steps} == {"all-reduce"}
    assert N * int(record.held.sum()) in [s.operand_bytes for s in broken.steps]
    for step in broken.steps:
        assert step.bytes == 2 * bytes_moved("all-gather", step.operand_bytes, N)
    # more than twice what the gathers and scatters it replaces send (the
    # backward re-gathers are left out: XLA merges them in either program on
    # some releases, and not on others)
    replaced = record.of(diagram.FORWARD) + record.of(diagram.GRADIENT)
    assert sum(s.bytes for s in broken.steps) > 2 * sum(s.bytes for s in replaced)


def test_equal_layer_blocks_are_refused():
    with pytest.raises(ValueError, match="distinct widths"):
        diagram.trace(N, sizes=(8, 16, 16, 16, 8))


def test_fsdp_x_tp_gathers_over_the_data_axis():
    tp = diagram.trace(N, model=2)
    assert tp.recipe == "fsdp_tp_mlp" and tp.devices == N // 2
    assert layers_of(tp.of(diagram.FORWARD)) == [1, 2, 3, 4]
    assert layers_of(tp.of(diagram.GRADIENT)) == [4, 3, 2, 1]
    assert all(s.group == N // 2 for s in tp.steps if s.layer)
    # Megatron's blocks are also split over model: 1/(n t) of every weight
    # and of b1, b3; b2 and b4 are split over data alone (1/n)
    n, t = N // 2, 2
    sizes = diagram.SIZES
    for k in range(1, LAYERS + 1):
        weight = sizes[k - 1] * sizes[k] // (n * t)
        bias = sizes[k] // (n * t if k % 2 else n)
        assert tp.held[k - 1] == 4 * (weight + bias), k
    # and each device's gathered layer is its model block: whole over data
    assert list(tp.gathered * t) == [
        4 * (sizes[k - 1] * sizes[k] + sizes[k] * (t if k % 2 == 0 else 1))
        for k in range(1, LAYERS + 1)]
    assert tp.loss == pytest.approx(tp.loss_oracle, rel=1e-5)


def test_draw_writes_an_svg(record, tmp_path):
    assert_draws_svg(diagram, record, tmp_path, widths=("wide", "narrow"))
    assert "JAX " + jax.__version__ in diagram.CAPTION


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_the_drawing_names_collectives_in_words_inside_their_boxes(record, width):
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    fig, boxed = diagram.figure(record, width)
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    # every collective drawn, the re-gathers the compiler merged included
    assert len(boxed) == len(record.steps) + len(record.merged)
    for label, box in boxed:  # 2 px clear of the box's border on every side
        inside = box.get_window_extent(renderer).padded(-2)
        extent = label.get_window_extent(renderer)
        assert (inside.x0 <= extent.x0 and extent.x1 <= inside.x1
                and inside.y0 <= extent.y0 and extent.y1 <= inside.y1), (
                    label.get_text(), extent, inside)
    words = [t.get_text() for t in fig.findobj(Text) if t.get_text().strip()]
    names = {s.kind for s in record.steps}
    assert names == {"all-gather", "reduce-scatter", "all-reduce"}
    for name in names:
        assert any(name in w or name.replace("-", "-\n") in w for w in words), name
    for internal in ("gather_layer", "value_and_grad", "AG", "RS", "AR "):
        assert not any(internal in w for w in words), internal
    # one line, not the title, says where the compiler merged the re-gathers
    merges = [w for w in words if "merges" in w]
    assert len(merges) == (1 if record.merged else 0)
    assert not any("merge" in w for w in words if "ZeRO-3" in w)
