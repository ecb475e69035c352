"""Drawing a :class:`~collectives._diagram.Diagram` with matplotlib.

Kept apart from ``_diagram`` so that matplotlib (the ``docs`` extra) is
imported only when a picture is asked for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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


def _draw_panel(ax: Any, blocks, sources, x0: float, title: str) -> float:
    """Draw one column per device from ``x0``; return the x where it ends."""
    from matplotlib.patches import Rectangle  # optional: the docs extra

    width = max(b.shape[1] for b in blocks)
    x = x0
    for device, (block, source) in enumerate(zip(blocks, sources, strict=True)):
        ax.text(x + block.shape[1] / 2, 0.35, f"device {device}", ha="center",
                va="bottom", fontsize=9, color="#444444")
        for (r, c), value in np.ndenumerate(block):
            combined = source[r, c] < 0
            ax.add_patch(Rectangle(
                (x + c, -r - 1), 1, 1, facecolor=_colour(int(source[r, c])),
                edgecolor="white", linewidth=1.5, hatch="///" if combined else None))
            text = (f"{value:g}" if isinstance(value, (float, np.floating))
                    else str(value))
            ax.text(x + c + 0.5, -r - 0.5, text, ha="center", va="center",
                    fontsize=10, family="monospace")
        x += width + _GAP
    end = x - _GAP
    ax.text((x0 + end) / 2, 1.05, title, ha="center", va="bottom", fontsize=11,
            weight="bold")
    return end


def figure(diagram: Any) -> Any:
    """The matplotlib ``Figure`` for ``diagram``: before → after, devices as columns."""
    try:  # optional: the docs extra
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError(
            "Diagram.figure needs matplotlib. Fix: pip install matplotlib (or "
            "jax-collectives' 'docs' extra; in a checkout: pip install "
            "'.[docs]'); Diagram.text() "
            "needs nothing.") from error

    rows = max(b.shape[0] for b in diagram.before + diagram.after)
    before_width = (max(b.shape[1] for b in diagram.before) + _GAP) * diagram.n_devices
    after_width = (max(b.shape[1] for b in diagram.after) + _GAP) * diagram.n_devices
    arrow = max(1.6, 0.13 * len(diagram.name) + 0.6)  # room for the label
    total = before_width + arrow + after_width
    fig = Figure(figsize=(total * _CELL, (rows + 2.2) * _CELL))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-0.2, total)
    ax.set_ylim(-rows - 0.3, 1.9)
    ax.set_aspect("equal")
    ax.axis("off")
    end = _draw_panel(ax, diagram.before, diagram.before_source, 0.0, "before")
    start = end + arrow
    _draw_panel(ax, diagram.after, diagram.after_source, start, "after")
    middle = -min(rows, 2) / 2
    ax.annotate("", xy=(start - 0.3, middle), xytext=(end + 0.3, middle),
                arrowprops=dict(arrowstyle="-|>", lw=2, color="#333333"))
    ax.text((end + start) / 2, middle + 0.25, diagram.name, ha="center",
            va="bottom", fontsize=8, family="monospace", color="#333333")
    return fig
