"""collectives._figure: what a figure records about itself, and the problems
a reader would meet in it."""

import pytest

from collectives import _figure

matplotlib = pytest.importorskip("matplotlib")


def _figure_with_legend(where):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    ax = fig.add_subplot()
    ax.plot([0, 1, 2], [0.5, 0.5, 0.5], label="flat")
    ax.plot([0, 1, 2], [0, 0.05, 0.1], label="low")
    ax.set_ylim(0, 1)  # (the top of the axes is empty)
    ax.legend(loc=where, fontsize=7)
    ax.set_title("title", fontsize=9)
    return fig


@pytest.mark.parametrize("suffix,dpi", [(".png", 110), (".svg", None)])
def test_the_record_travels_in_the_file(tmp_path, suffix, dpi):
    path = tmp_path / f"figure{suffix}"
    facts = _figure.save(_figure_with_legend("upper left"), path, dpi=dpi)
    assert _figure.read_record(path) == facts
    px_per_pt = dpi / 72 if dpi else 4 / 3
    assert facts["text_px"] == pytest.approx(7 * px_per_pt, abs=0.01)  # legend
    assert facts["width_px"] == round(4 * (dpi or 96))
    assert facts["legend_covers"] == 0


def test_a_legend_over_a_line_is_counted():
    facts = _figure.record(_figure_with_legend("center left"), dpi=110)
    assert facts["legend_covers"] == 1  # the flat line at mid-height
    assert _figure.problems(facts, "wide") == [
        "a legend covers 1 plotted line(s)"]


def test_text_too_small_on_screen_is_a_problem():
    # 12 px in a 960 px image: 4.3 px when a phone shows it 342 px wide
    facts = {"text_px": 12.0, "legend_covers": 0, "width_px": 960}
    assert _figure.problems(facts, "wide") == []
    (problem,) = _figure.problems(facts, "narrow")
    assert problem.startswith("text 4.3px on screen, under 9px")
    assert _figure.problems(None, "wide") == [
        "no record of its text size (draw it with collectives._figure.save)"]
    with pytest.raises(ValueError, match="width 'phone': not a column"):
        _figure.problems(facts, "phone")


def test_a_file_without_a_record_has_none(tmp_path):
    from matplotlib.figure import Figure

    path = tmp_path / "plain.png"
    Figure(figsize=(2, 2)).savefig(path)
    assert _figure.read_record(path) is None
    assert _figure.narrow_path(path).name == "plain.narrow.png"
