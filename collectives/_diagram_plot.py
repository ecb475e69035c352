"""Drawing a :class:`~collectives._diagram.Diagram` with matplotlib.

Kept apart from ``_diagram`` so that matplotlib (the ``docs`` extra) is
imported only when a picture is asked for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collectives import _figure

_CELL = 0.55  # inches per element
_GAP = 0.35  # between device columns, in elements
_COMBINED_COLOUR = "#d9d9d9"


def _colour(source: int) -> Any:
    import matplotlib  # optional: the docs extra

    if source < 0:
        return _COMBINED_COLOUR
    red, green, blue, _ = matplotlib.colormaps["tab10"](source % 10)
    # Halfway to white, so the black labels stay readable.
    return (0.5 + red / 2, 0.5 + green / 2, 0.5 + blue / 2)


_LABEL = 1.6  # elements of height above each row of devices (names, title)
_ARROW_PT = 9  # the collective's name on the arrow: the smallest text


def _panel_size(blocks, per_row: int) -> tuple[float, float]:
    """(width, height) in elements of one panel, ``per_row`` devices a row."""
    cols = max(b.shape[1] for b in blocks)
    rows = max(b.shape[0] for b in blocks)
    lines = -(-len(blocks) // per_row)
    return (cols + _GAP) * per_row - _GAP, lines * (rows + _LABEL) - _LABEL + 0.4


def _draw_panel(ax: Any, blocks, sources, x0: float, y0: float, title: str,
                per_row: int) -> None:
    """Draw one column per device, ``per_row`` devices a row, with its top
    left at ``(x0, y0)``."""
    from matplotlib.patches import Rectangle  # optional: the docs extra

    width = max(b.shape[1] for b in blocks)
    rows = max(b.shape[0] for b in blocks)
    panel_width, _ = _panel_size(blocks, per_row)
    ax.text(x0 + panel_width / 2, y0 + 1.05, title, ha="center", va="bottom",
            fontsize=11, weight="bold")
    for device, (block, source) in enumerate(zip(blocks, sources, strict=True)):
        line, place = divmod(device, per_row)
        x = x0 + place * (width + _GAP)
        y = y0 - line * (rows + _LABEL)
        ax.text(x + block.shape[1] / 2, y + 0.35, f"device {device}", ha="center",
                va="bottom", fontsize=9, color="#444444")
        for (r, c), value in np.ndenumerate(block):
            combined = source[r, c] < 0
            ax.add_patch(Rectangle(
                (x + c, y - r - 1), 1, 1, facecolor=_colour(int(source[r, c])),
                edgecolor="white", linewidth=1.5, hatch="///" if combined else None))
            text = (f"{value:g}" if isinstance(value, (float, np.floating))
                    else str(value))
            ax.text(x + c + 0.5, y - r - 0.5, text, ha="center", va="center",
                    fontsize=10, family="monospace")


def _fits(width_elements: float, width: str) -> bool:
    """Whether a drawing ``width_elements`` wide shows its smallest text at
    9 px or more in ``width``'s column."""
    natural = (width_elements * _CELL + 0.2) * 96  # (+ the saved margin)
    scale = min(1.0, _figure.COLUMN_PX[width] / natural)
    return _ARROW_PT * _figure.SVG_PX_PER_PT * scale >= _figure.MIN_TEXT_PX


def figure(diagram: Any, width: str = "wide") -> Any:
    """The matplotlib ``Figure`` for ``diagram``, laid out for ``width``'s
    column (see :mod:`collectives._figure`): before → after side by side
    where that reads, else before above after; devices as columns, wrapped
    into rows where a row of every device would not read."""
    try:  # optional: the docs extra
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError(
            "Diagram.figure needs matplotlib. Fix: pip install matplotlib (or "
            "jax-collectives' 'docs' extra; in a checkout: pip install "
            "'.[docs]'); Diagram.text() "
            "needs nothing.") from error

    n = diagram.n_devices
    arrow = max(1.6, 0.13 * len(diagram.name) + 0.6)  # room for the label
    (bw, bh), (aw, ah) = (_panel_size(diagram.before, n),
                          _panel_size(diagram.after, n))
    side_by_side = _fits(bw + arrow + aw + 0.2, width)
    per_row = {"before": n, "after": n}
    if not side_by_side:
        for panel, blocks in (("before", diagram.before), ("after", diagram.after)):
            while (per_row[panel] > 1
                   and not _fits(_panel_size(blocks, per_row[panel])[0] + 0.2, width)):
                per_row[panel] -= 1
        (bw, bh), (aw, ah) = (_panel_size(diagram.before, per_row["before"]),
                              _panel_size(diagram.after, per_row["after"]))
    fig_w = bw + arrow + aw if side_by_side else max(bw, aw)
    fig_h = max(bh, ah) if side_by_side else bh + ah + 1.6 + 1.9
    fig = Figure(figsize=((fig_w + 0.2) * _CELL, (fig_h + 1.9 + 0.3) * _CELL))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-0.2, fig_w)
    ax.set_ylim(-fig_h - 0.3, 1.9)
    ax.set_aspect("equal")
    ax.axis("off")
    arrows = dict(arrowstyle="-|>", lw=2, color="#333333")
    label = dict(fontsize=_ARROW_PT, family="monospace", color="#333333")
    _draw_panel(ax, diagram.before, diagram.before_source, 0.0, 0.0, "before",
                per_row["before"])
    if side_by_side:
        start = bw + arrow
        _draw_panel(ax, diagram.after, diagram.after_source, start, 0.0, "after",
                    per_row["after"])
        middle = -min(max(b.shape[0] for b in diagram.before), 2) / 2
        ax.annotate("", xy=(start - 0.3, middle), xytext=(bw + 0.3, middle),
                    arrowprops=arrows)
        ax.text((bw + start) / 2, middle + 0.25, diagram.name, ha="center",
                va="bottom", **label)
    else:
        top = -bh - 1.6 - 1.9  # the after panel's top (its title above it)
        _draw_panel(ax, diagram.after, diagram.after_source, 0.0, top, "after",
                    per_row["after"])
        x = 0.5  # left of the after panel's centred title
        ax.annotate("", xy=(x, top + 1.0), xytext=(x, -bh - 0.2), arrowprops=arrows)
        ax.text(x + 0.4, (top + 1.0 - bh - 0.2) / 2, diagram.name, ha="left",
                va="center", **label)
    return fig
