"""Figures drawn for the docs' content column, and what each records about itself.

Every figure the docs show is drawn twice, for the two columns a reader
meets: ``"wide"`` (the content column of a desktop browser, about 768 CSS px
at 1400 px) and ``"narrow"`` (a phone's, about 342 px at 390 px). The
narrow drawing is written beside the wide one as ``NAME.narrow.EXT``; the
docs show the one that fits the screen (``docs/conf.py``).

:func:`save` writes a figure and records in the file itself (PNG text chunk
or SVG description) what a reader's eye needs checked:

* ``text_px``: the smallest text, in the image's own pixels (a font of F
  points is F * 4/3 px in an SVG, whose size is in points, and F * dpi / 72
  px in a raster);
* ``legend_covers``: how many plotted lines or point sets run under a
  legend (0 for a legend that covers no data);
* ``width_px``: the image's natural width in CSS px.

``docs/browser_check.py`` reads the record and measures the text on screen
(its size times the shown width over the natural width).
"""

from __future__ import annotations

import html
import json
import re
import struct
import zlib
from pathlib import Path
from typing import Any

COLUMN_PX = {"wide": 768, "narrow": 342}
"""The content column's width in CSS px, as a browser lays the docs out at
1400 px (a desktop) and at 390 px (a phone) wide."""

MIN_TEXT_PX = 9.0
"""The smallest text a reader reads on screen, in CSS px."""

RECORD_KEY = "collectives-figure"
"""The key of a figure's record in its file."""

SVG_PX_PER_PT = 96 / 72


def narrow_path(path: str | Path) -> Path:
    """``NAME.EXT``'s narrow drawing: ``NAME.narrow.EXT``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.narrow{path.suffix}")


def columns(path: str | Path) -> tuple[tuple[str, Path], ...]:
    """Each column's width and the file drawn for it: ``path`` for the wide
    column, :func:`narrow_path` for the narrow one."""
    return (("wide", Path(path)), ("narrow", narrow_path(path)))


def legend_under(fig: Any, handles: list, labels: list[str], ncol: int,
                 fontsize: float) -> None:
    """One legend for every panel of ``fig``, under them, where it covers no
    line; then lay the panels out above it (``tight_layout``)."""
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=fontsize)
    rows = -(-len(labels) // ncol)
    fig.tight_layout(rect=(0, (0.25 + 0.17 * rows) / fig.get_figheight(), 1, 1))


def font_pt(width: str, points: float) -> float:
    """A font of ``points`` for the wide column, scaled for ``width``'s
    column where that is narrower (never under 7.5 pt: 10 px at 1:1)."""
    _check_width(width)
    return points if width == "wide" else max(7.5, points * 0.85)


def record(fig: Any, *, dpi: float | None = None, tight: bool = False) -> dict:
    """What :func:`save` records about ``fig``: see the module's docstring.

    ``dpi`` is the raster's resolution; ``None`` for SVG. ``tight``: the
    figure is saved cropped to what it draws (``bbox_inches="tight"``).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PathCollection
    from matplotlib.legend import Legend
    from matplotlib.text import Text

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()  # lays the figure out: legend places, text extents
    renderer = fig.canvas.get_renderer()
    px_per_pt = SVG_PX_PER_PT if dpi is None else dpi / 72
    sizes = [t.get_fontsize() for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip()
             and t.get_window_extent(renderer).width > 0]
    legends = [artist for artist in fig.findobj(Legend) if artist.get_visible()]
    covered = 0
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            for line in ax.get_lines():
                if not line.get_visible() or len(line.get_xydata()) == 0:
                    continue
                path = line.get_transform().transform_path(line.get_path())
                covered += bool(path.intersects_bbox(box, filled=False))
            for points in ax.findobj(PathCollection):
                offsets = points.get_offset_transform().transform(points.get_offsets())
                covered += any(box.contains(x, y) for x, y in offsets)
    inches = fig.get_figwidth()
    if tight:
        import matplotlib

        inches = (fig.get_tightbbox(renderer).width
                  + 2 * matplotlib.rcParams["savefig.pad_inches"])
    width_px = inches * (96 if dpi is None else dpi)
    return {"text_px": round(min(sizes) * px_per_pt, 2) if sizes else None,
            "legend_covers": covered, "width_px": round(width_px)}


def save(fig: Any, path: str | Path, *, dpi: float | None = None,
         **savefig: Any) -> dict:
    """Write ``fig`` to ``path`` (``.svg``, or a raster at ``dpi``) with its
    record (:func:`record`) in the file; return the record."""
    path = Path(path)
    facts = record(fig, dpi=dpi, tight=savefig.get("bbox_inches") == "tight")
    text = f"{RECORD_KEY} {json.dumps(facts, sort_keys=True)}"
    if path.suffix == ".svg":
        fig.savefig(path, format="svg", metadata={"Description": text}, **savefig)
    else:
        fig.savefig(path, dpi=dpi, metadata={"Description": text}, **savefig)
    return facts


def read_record(path: str | Path) -> dict | None:
    """The record :func:`save` wrote into ``path``; ``None`` where it has none."""
    data = Path(path).read_bytes()
    if data.startswith(b"\x89PNG"):
        text = _png_description(data)
    else:
        match = re.search(rb"<dc:description>(.*?)</dc:description>", data, re.S)
        text = match.group(1).decode() if match else None
    if not text or not text.startswith(RECORD_KEY + " "):
        return None
    # (an SVG's description is XML text: its quotes escaped)
    return json.loads(html.unescape(text[len(RECORD_KEY) + 1:]))


def _png_description(data: bytes) -> str | None:
    """The ``Description`` text chunk of a PNG file (tEXt, zTXt or iTXt)."""
    at = 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        at += 12 + length
        if kind not in (b"tEXt", b"zTXt", b"iTXt"):
            continue
        key, _, rest = body.partition(b"\0")
        if key != b"Description":
            continue
        if kind == b"tEXt":
            return rest.decode("latin-1")
        if kind == b"zTXt":
            return zlib.decompress(rest[1:]).decode("latin-1")
        compressed, rest = rest[0], rest[2:]
        rest = rest.split(b"\0", 2)[2]  # language tag, translated keyword
        return (zlib.decompress(rest) if compressed else rest).decode()
    return None


def _check_width(width: str) -> None:
    if width not in COLUMN_PX:
        raise ValueError(f"width {width!r}: not a column. Fix: one of "
                         f"{', '.join(map(repr, COLUMN_PX))}.")


def problems(facts: dict | None, width: str,
             shown_px: float | None = None) -> list[str]:
    """What a reader would not read in a figure with record ``facts`` shown
    in ``width``'s column (at ``shown_px`` where given, else at its natural
    width or the column's, whichever is less): text under
    :data:`MIN_TEXT_PX` on screen, a legend over data, no record at all."""
    _check_width(width)
    if facts is None:
        return ["no record of its text size (draw it with collectives._figure.save)"]
    out = []
    if shown_px is None:
        shown_px = min(facts["width_px"], COLUMN_PX[width])
    if facts["text_px"] is not None:
        on_screen = facts["text_px"] * shown_px / facts["width_px"]
        if on_screen < MIN_TEXT_PX - 0.05:
            out.append(f"text {on_screen:.1f}px on screen, under {MIN_TEXT_PX:g}px "
                       f"(drawn at {facts['text_px']:g}px in a {facts['width_px']}px "
                       f"image shown {shown_px:.0f}px wide)")
    if facts["legend_covers"]:
        out.append(f"a legend covers {facts['legend_covers']} plotted line(s)")
    return out


def heading(fig: Any, title: str, note: str, note_pt: float) -> None:
    """A narrow drawing's heading at its top left: ``title`` in bold, and
    under it ``note`` (a few short lines) at ``note_pt`` points."""
    height = fig.get_figheight()
    fig.text(0.04, 1 - 0.1 / height, title, va="top", fontsize=9.5, weight="bold")
    fig.text(0.04, 1 - 0.35 / height, note, va="top", fontsize=note_pt,
             color="#333333", linespacing=1.25)
