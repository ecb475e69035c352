"""``collectives.diagram``: the before/after blocks come from running the collective."""

import numpy as np
import pytest

import collectives as cx
from collectives import _cli
from collectives import _figure
from collectives._diagram import COMBINED
from collectives._diagram import diagram_names

DIAGRAM_NAMES = diagram_names()
N = 4


@pytest.fixture(scope="module")
def diagrams():
    return {name: cx.diagram(name, n_devices=N) for name in DIAGRAM_NAMES}


def test_inputs_are_labelled_by_device_and_position(diagrams):
    for name, d in diagrams.items():
        assert d.n_devices == N, name
        for device, (block, source) in enumerate(
                zip(d.before, d.before_source, strict=True)):
            np.testing.assert_array_equal(
                block.ravel(), 10 * device + np.arange(block.size), err_msg=name)
            assert (source == device).all(), name


@pytest.mark.parametrize("name, reduce", [
    ("psum", np.sum), ("pmean", np.mean), ("pmax", np.max), ("pmin", np.min)])
def test_all_reduce_gives_every_device_the_reduction(diagrams, name, reduce):
    d = diagrams[name]
    want = reduce(np.stack(d.before), axis=0)
    for block in d.after:
        np.testing.assert_array_equal(block, want)


def test_sums_are_marked_combined_and_max_min_keep_their_source(diagrams):
    for name in ("psum", "pmean", "psum_scatter"):
        assert all((s == COMBINED).all() for s in diagrams[name].after_source), name
    # Labels grow with the device, so the max comes from the last device and
    # the min from the first.
    assert all((s == N - 1).all() for s in diagrams["pmax"].after_source)
    assert all((s == 0).all() for s in diagrams["pmin"].after_source)


def test_all_gather_columns_hold_every_source_device(diagrams):
    whole = np.concatenate(diagrams["all_gather"].before)
    for block, source in zip(diagrams["all_gather"].after,
                             diagrams["all_gather"].after_source, strict=True):
        np.testing.assert_array_equal(block, whole)
        assert set(source.ravel()) == set(range(N))


def test_all_gather_stacked_has_one_row_per_device(diagrams):
    d = diagrams["all_gather_stacked"]
    for block, source in zip(d.after, d.after_source, strict=True):
        assert block.shape[0] == N
        for device in range(N):
            np.testing.assert_array_equal(block[device], d.before[device].ravel())
            assert (source[device] == device).all()


def test_psum_scatter_keeps_one_slice_of_the_sum_per_device(diagrams):
    d = diagrams["psum_scatter"]
    total = np.sum(np.stack(d.before), axis=0)  # [N * c, 1]
    chunks = np.split(total, N)
    for device, block in enumerate(d.after):
        np.testing.assert_array_equal(block, chunks[device])


def test_all_to_all_sends_chunk_j_to_device_j(diagrams):
    d = diagrams["all_to_all"]
    for device, (block, source) in enumerate(
            zip(d.after, d.after_source, strict=True)):
        want = [d.before[s][0, device] for s in range(N)]
        assert block.ravel().tolist() == want
        assert source.ravel().tolist() == list(range(N))


def test_ppermute_ring_receives_from_the_previous_device(diagrams):
    d = diagrams["ppermute_ring"]
    for device, (block, source) in enumerate(
            zip(d.after, d.after_source, strict=True)):
        np.testing.assert_array_equal(block, d.before[(device - 1) % N])
        assert (source == (device - 1) % N).all()


def test_axis_index_adds_the_device_index(diagrams):
    d = diagrams["axis_index"]
    for device, (block, source) in enumerate(
            zip(d.after, d.after_source, strict=True)):
        np.testing.assert_array_equal(block, d.before[device] + device)
        assert (source == device).all()


def test_text_grid_has_a_column_per_device_and_both_grids(diagrams):
    text = diagrams["psum"].text()
    prose, grid = text.split("\n\n", 1)
    assert prose.startswith("psum over 4 devices")
    assert "* = combined from every device" in " ".join(prose.splitlines())
    lines = grid.splitlines()
    header = next(line for line in lines if "device 0" in line)
    assert all(f"device {d}" in header for d in range(N))
    before = next(line for line in lines if line.startswith("before"))
    after = next(line for line in lines if line.startswith("after"))
    assert before.split()[1:] == ["0", "10", "20", "30"]
    assert after.split()[1:] == ["*60"] * N
    # A copy is not marked: no star in ppermute's grid.
    grid = diagrams["ppermute_ring"].text().split("\n\n", 1)[1].splitlines()
    assert not any("*" in line for line in grid)


def test_text_prose_fits_a_terminal(diagrams):
    # the header and legend wrap at 79 columns (a summary runs longer)
    for name, d in diagrams.items():
        prose = d.text().split("\n\n", 1)[0].splitlines()
        assert max(map(len, prose)) <= 79, (name, prose)
    assert len(diagrams["psum_scatter"].text().split("\n\n", 1)[0].splitlines()) > 2


def test_eight_devices():
    d = cx.diagram("ppermute_ring", n_devices=8)
    assert [int(b[0, 0]) for b in d.after] == [70, 0, 10, 20, 30, 40, 50, 60]


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="dp_grads"), "no diagram for 'dp_grads'"),
    (dict(name="psum", n_devices=1), "n_devices: expected an int from 2 to 10"),
    (dict(name="psum", n_devices=True), "n_devices"),
    (dict(name="psum", n_devices=16), "n_devices"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cx.diagram(**kwargs)


def test_figure_colours_by_source_and_saves_svg(diagrams, tmp_path):
    pytest.importorskip("matplotlib")
    fig = diagrams["all_gather"].figure()
    ax = fig.axes[0]
    # before: 4 devices x 2 elements; after: 4 devices x 8 elements
    assert len(ax.patches) == N * 2 + N * 2 * N
    path = tmp_path / "all_gather.svg"
    diagrams["all_gather"].save(str(path))
    assert "<svg" in path.read_text()


@pytest.mark.parametrize("name", ["psum", "all_to_all", "all_gather_stacked"])
@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_each_column_gets_a_legible_layout(diagrams, tmp_path, name, width):
    # side by side where that reads in the column, else before above after,
    # devices wrapped into rows: the smallest text >= 9 px on screen
    pytest.importorskip("matplotlib")
    path = tmp_path / f"{name}.svg"
    diagrams[name].save(str(path), width=width)
    facts = _figure.read_record(path)
    assert _figure.problems(facts, width) == []
    fig = diagrams[name].figure(width)
    tall = fig.get_figheight() > fig.get_figwidth()
    assert tall == (width == "narrow")


def test_show_prints_the_grid_above_the_source(capsys):
    assert _cli.main(["show", "ppermute_ring"]) == 0
    out = capsys.readouterr().out
    grid_at = out.index("# ppermute_ring over 4 devices")
    source_at = out.index("def ppermute_ring_body")
    assert grid_at < source_at
    after = next(line for line in out.splitlines() if line.startswith("# after"))
    assert after.split()[2:] == ["30", "0", "10", "20"]


def test_show_without_a_diagram_prints_only_the_source(capsys):
    assert _cli.main(["show", "dp_grads"]) == 0
    out = capsys.readouterr().out
    assert "over 4 devices" not in out and "def " in out
