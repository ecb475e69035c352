"""All-to-all attention's head/sequence resharding, traced from a real run.

:func:`trace` runs ``recipes/all_to_all_attention.py``'s shard_map form
(``all_to_all_attention_shard_map``, i.e. ``all_to_all_attention_body`` under
``jax.shard_map``) on marker inputs, with the file module's ``lax`` swapped
for a tap (:mod:`._tap`, restored afterwards) whose ``all_to_all`` calls the
real one and then reports, with ``jax.experimental.io_callback``, each
device's ``lax.axis_index``, input block and output block. The body makes
four calls, in this order: ``to_heads`` of q, of k and of v, then the
all-to-all that brings the attention output back.

The markers say which (sequence position, head) every element is: with
``code = t * heads + h``, ``q[t, h, 0]``, ``k[t, h, 1]`` and ``v[t, h, 0]``
hold the code (the other of channels 0, 1 is 0), so channel 0 + channel 1 of
any block names its elements. Channels ``2 + t`` of q and k are a large
one-hot of the position, so each query's softmax puts all its weight (in
float32, exactly) on its own key: the attention output at ``(t, h)`` is
``v[t, h]``, and the output blocks carry the same codes. Decoding each
reported block gives, per call, which device holds each (position, head)
going in and coming out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from collectives import _figure
from collectives._devices import make_mesh
from collectives._strategy_diagrams import on_its_own_mesh
from collectives._strategy_diagrams._tap import tapped
from collectives.hlo import collective_stats
from collectives.recipes import all_to_all_attention as a2a_file

AXIS = "i"
CALLS = ("q", "k", "v", "output")  # the body's all_to_all calls, in order
MISSING, SEVERAL = -1, -2  # held by no device / by more than one
_DIMS = ("seq", "heads", "head_dim")
_ONE_HOT = 30.0  # score gap 30**2 / sqrt(head_dim): exp(-gap) is 0 in float32

CAPTION = (
    "All-to-all attention on 8 devices, recorded from a real run: which device "
    "holds each (sequence position, head) before the all-to-alls of q, k and v, "
    "between them, where each device runs attention over every position of its "
    "own heads, and after the all-to-all that brings the output back.")


@dataclass(frozen=True, eq=False)
class AllToAllAttentionTrace:
    """Who held what around each ``all_to_all`` of one run of the body.

    ``held_in[c, t, h]`` / ``held_out[c, t, h]``: the device whose block held
    element (position ``t``, head ``h``) entering / leaving call ``c`` (see
    :data:`CALLS`); ``MISSING`` or ``SEVERAL`` if none or more than one did.
    """

    n_devices: int
    seq: int
    heads: int
    calls: tuple[str, ...]
    split_axis: tuple[int, ...]  # per call, as the body passed it
    concat_axis: tuple[int, ...]
    block_in: tuple[tuple[int, ...], ...]  # per call, one device's block shape
    block_out: tuple[tuple[int, ...], ...]
    held_in: np.ndarray  # [call, seq, heads]
    held_out: np.ndarray  # [call, seq, heads]
    matches_oracle: bool  # the run's output equals attention_numpy's
    all_to_alls: int  # in the compiled program of the untapped body
    all_to_all_bytes: float  # bytes each device sends in them


def _markers(seq: int, heads: int):
    """q, k, v ``[seq, heads, seq + 2]``: channel 0 (q, v) or 1 (k) holds
    ``t * heads + h``, channels ``2 + t`` of q and k a large one-hot of ``t``."""
    t, h = np.meshgrid(np.arange(seq), np.arange(heads), indexing="ij")
    code = (t * heads + h).astype(np.float32)
    q, k, v = (np.zeros((seq, heads, seq + 2), np.float32) for _ in range(3))
    q[..., 0], k[..., 1], v[..., 0] = code, code, code
    one_hot = _ONE_HOT * np.eye(seq, dtype=np.float32)[:, None, :]
    q[..., 2:] += one_hot
    k[..., 2:] += one_hot
    return q, k, v


def _holders(blocks: dict[int, np.ndarray], seq: int, heads: int) -> np.ndarray:
    """``[seq, heads]``: the device whose block carries each element's code."""
    held = np.full((seq, heads), MISSING)
    for device, block in blocks.items():
        codes = np.rint(block[..., 0] + block[..., 1]).astype(int).ravel()
        for t, h in {divmod(c, heads) for c in codes if 0 <= c < seq * heads}:
            held[t, h] = device if held[t, h] == MISSING else SEVERAL
    return held


@on_its_own_mesh
def trace(n_devices: int = 8, rows: int = 2,
          heads_per_device: int = 1) -> AllToAllAttentionTrace:
    """Run the file's shard_map form on ``n_devices`` devices (``rows``
    positions and ``heads_per_device * n_devices`` heads) and record who holds
    each (position, head) around its all-to-alls."""
    seq, heads = n_devices * rows, n_devices * heads_per_device
    mesh = make_mesh((n_devices,), AXIS)
    q, k, v = _markers(seq, heads)
    with tapped(a2a_file, "all_to_all") as tap:
        out = np.asarray(a2a_file.all_to_all_attention_shard_map(q, k, v, mesh))
    if len(tap.sites) != len(CALLS):
        raise AssertionError(f"expected {len(CALLS)} all_to_all calls in the body, "
                             f"got {len(tap.sites)}")
    held_in, held_out, block_in, block_out = [], [], [], []
    for site in range(len(CALLS)):
        runs = tap.by_device(site)
        if sorted(runs) != list(range(n_devices)) or any(
                len(r) != 1 for r in runs.values()):
            raise AssertionError(f"call {site}: expected one report per device, got "
                                 f"{ {d: len(r) for d, r in runs.items()} }")
        ins = {d: r[0].inputs[0] for d, r in runs.items()}
        outs = {d: r[0].outputs[0] for d, r in runs.items()}
        held_in.append(_holders(ins, seq, heads))
        held_out.append(_holders(outs, seq, heads))
        block_in.append(tuple(ins[0].shape))
        block_out.append(tuple(outs[0].shape))
    want = a2a_file.attention_numpy(q, k, v)
    body = jax.shard_map(functools.partial(a2a_file.all_to_all_attention_body,
                                           axis=AXIS),
                         mesh=mesh, in_specs=(P(AXIS),) * 3, out_specs=P(AXIS))
    stats = collective_stats(jax.jit(body), q, k, v)
    arrays = [np.array(held_in), np.array(held_out)]
    for array in arrays:
        array.flags.writeable = False
    return AllToAllAttentionTrace(
        n_devices=n_devices, seq=seq, heads=heads, calls=CALLS,
        split_axis=tuple(int(s.params.get("split_axis", s.params.get("arg0", -1)))
                         for s in tap.sites),
        concat_axis=tuple(int(s.params.get("concat_axis", s.params.get("arg1", -1)))
                          for s in tap.sites),
        block_in=tuple(block_in), block_out=tuple(block_out),
        held_in=arrays[0], held_out=arrays[1],
        matches_oracle=bool(np.allclose(out, want, rtol=1e-6, atol=1e-6)),
        all_to_alls=stats.count("all-to-all"),
        all_to_all_bytes=float(stats.bytes("all-to-all")))


def panels(record: AllToAllAttentionTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[seq, heads]`` holders: q entering the first all-to-all (before), q
    leaving it (between: where attention runs), the output leaving the last
    (after)."""
    return record.held_in[0], record.held_out[0], record.held_out[-1]


PANEL_TITLES = ("before: q, k, v as given",
                "between: attention runs here",
                "after: the output")


_WORDS = {"seq": "positions", "heads": "heads", "head_dim": "channels"}


def _move(record: AllToAllAttentionTrace, call: int) -> str:
    """What an all-to-all did, in words: 'split heads, join positions'."""
    return (f"split {_WORDS[_DIMS[record.split_axis[call]]]}, "
            f"join {_WORDS[_DIMS[record.concat_axis[call]]]}")


def _cell(device: int) -> str:
    return {MISSING: ".", SEVERAL: "*"}.get(device, str(device))


def text(record: AllToAllAttentionTrace) -> str:
    """The three layouts as a plain-text table: the device holding each
    (position, head)."""
    n, heads = record.n_devices, record.heads
    width = max(2, len(str(n - 1)) + 1)
    lines = [f"All-to-all attention, {n} devices, {record.seq} positions x "
             f"{heads} heads: the device holding each (position, head)"]
    lines.append("  pos | " + " | ".join(
        f"{title.split(':')[0]:<{width * heads}}" for title in PANEL_TITLES))
    lines.append("      | " + " | ".join(
        "".join(f"{h:>{width}}" for h in range(heads)) for _ in PANEL_TITLES))
    grids = panels(record)
    for t in range(record.seq):
        lines.append(f"{t:>5} | " + " | ".join(
            "".join(f"{_cell(int(g[t, h])):>{width}}" for h in range(heads))
            for g in grids))
    lines.append(f"before -> between: all-to-all of q, k, v ({_move(record, 0)}), "
                 f"block {record.block_in[0]} -> {record.block_out[0]}; "
                 "attention on whole sequences")
    lines.append(f"between -> after: all-to-all of the output ({_move(record, -1)}), "
                 f"block {record.block_in[-1]} -> {record.block_out[-1]}")
    lines.append(f"compiled body: {record.all_to_alls} all-to-alls, "
                 f"{record.all_to_all_bytes:g} bytes per device; output "
                 f"{'equals' if record.matches_oracle else 'DIFFERS FROM'} "
                 "attention_numpy")
    return "\n".join(lines)


def _colour(device: int):
    import matplotlib  # optional: the docs extra

    if device < 0:
        return (1.0, 1.0, 1.0) if device == MISSING else (0.3, 0.3, 0.3)
    red, green, blue, _ = matplotlib.colormaps["tab10"](device % 10)
    return (0.4 + 0.6 * red, 0.4 + 0.6 * green, 0.4 + 0.6 * blue)


def _bytes(n: float) -> str:
    return f"{n:,.0f} bytes" if n < 10_000 else f"{n / 1024:,.1f} KiB"


def _fill(ax, grid: np.ndarray, transposed: bool, fontsize: float) -> None:
    """Colour each (position, head) cell by its holder, white lines only
    between different holders, the device's number at its cells' centre."""
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Rectangle

    seq, heads = grid.shape

    def xy(t, h):  # a cell's lower corner in the panel's (x, y)
        return (t, h) if transposed else (h, t)

    for t in range(seq):
        for h in range(heads):
            face = _colour(int(grid[t, h]))
            ax.add_patch(Rectangle(xy(t, h), 1, 1, facecolor=face, edgecolor=face,
                                   linewidth=0.5))
    lines = []
    for t in range(seq):
        for h in range(heads):
            if t + 1 < seq and grid[t, h] != grid[t + 1, h]:
                lines.append([xy(t + 1, h), xy(t + 1, h + 1)])
            if h + 1 < heads and grid[t, h] != grid[t, h + 1]:
                lines.append([xy(t, h + 1), xy(t + 1, h + 1)])
    ax.add_collection(LineCollection(lines, colors="white", linewidths=2))
    for device in sorted({int(d) for d in grid.ravel()} - {MISSING, SEVERAL}):
        ts, hs = np.nonzero(grid == device)
        x, y = xy(ts.mean() + 0.5, hs.mean() + 0.5)
        ax.text(x, y, str(device), ha="center", va="center", fontsize=fontsize,
                weight="bold")
    ax.set_xlim(0, seq if transposed else heads)
    ax.set_ylim(heads if transposed else seq, 0)
    ax.tick_params(length=0, pad=2)
    for side in ax.spines.values():
        side.set_visible(False)


def draw(record: AllToAllAttentionTrace, path, width: str = "wide") -> None:
    """Write the SVG: three layouts (before, between, after), each cell a
    (position, head) coloured by the device holding it; side by side with
    positions down for the ``"wide"`` column, stacked with positions across
    for ``"narrow"``."""
    import matplotlib  # optional: the docs extra

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    place = _Placement.of(record, width)
    fig = Figure(figsize=(place.fig_w, place.fig_h))
    for i, (grid, title, (x0, y0)) in enumerate(zip(panels(record), PANEL_TITLES,
                                                    place.spots, strict=True)):
        ax = fig.add_axes((*place.frac(x0, y0 + place.panel_h),
                           place.panel_w / place.fig_w, place.panel_h / place.fig_h))
        _fill(ax, grid, place.narrow, place.pt(13) if not place.narrow else 8)
        _panel_axes(ax, record, place, i, title)
    _moves(fig, record, place)
    _headings(fig, record, place)
    _figure.save(fig, path)


@dataclass(frozen=True)
class _Placement:
    """The figure's size and each panel's top-left corner, in inches:
    side by side (wide) or stacked (narrow)."""

    width: str
    fig_w: float
    fig_h: float
    left: float
    panel_w: float
    panel_h: float
    spots: tuple

    @classmethod
    def of(cls, record: AllToAllAttentionTrace, width: str) -> _Placement:
        seq, heads = record.seq, record.heads
        if width == "narrow":
            fig_w, cell, left, top, gap = 3.7, 0.19, 0.5, 1.3, 1.0
            panel_w, panel_h = seq * cell, heads * cell
            spots = [(left, top + i * (panel_h + gap)) for i in range(3)]
            fig_h = spots[-1][1] + panel_h + 0.95
        else:
            fig_w, cell, left, top, gap = 10, 0.23, 0.75, 1.2, 1.7
            panel_w, panel_h = heads * cell, seq * cell
            spots = [(left + i * (panel_w + gap), top) for i in range(3)]
            fig_h = top + panel_h + 0.95
        return cls(width, fig_w, fig_h, left, panel_w, panel_h, tuple(spots))

    @property
    def narrow(self) -> bool:
        return self.width == "narrow"

    def pt(self, points: float) -> float:
        return _figure.font_pt(self.width, points)

    def frac(self, x: float, y: float) -> tuple[float, float]:
        """Inches from the top-left -> figure fraction."""
        return x / self.fig_w, 1 - y / self.fig_h


def _panel_axes(ax, record: AllToAllAttentionTrace, place: _Placement, i: int,
                title: str) -> None:
    """Panel ``i``'s ticks (every other position), labels and title."""
    seq, heads, pt = record.seq, record.heads, place.pt
    positions = np.arange(0, seq, 2)
    if place.narrow:
        ax.set_xticks(positions + 0.5, [str(t) for t in positions],
                      fontsize=pt(10.5))
        ax.set_yticks(np.arange(heads) + 0.5, [str(h) for h in range(heads)],
                      fontsize=pt(10.5))
        ax.set_ylabel("head", fontsize=pt(11), labelpad=2)
        if i == 2:
            ax.set_xlabel("sequence position", fontsize=pt(11), labelpad=2)
        ax.set_title(title, fontsize=pt(11.5), weight="bold", loc="left",
                     pad=3)
    else:
        ax.set_xticks(np.arange(heads) + 0.5, [str(h) for h in range(heads)],
                      fontsize=pt(10.5))
        ax.set_yticks(positions + 0.5, [str(t) for t in positions],
                      fontsize=pt(10.5))
        ax.set_xlabel("head", fontsize=pt(11), labelpad=2)
        if i == 0:
            ax.set_ylabel("sequence position", fontsize=pt(11))
        ax.set_title(title.replace(": ", ":\n"), fontsize=pt(12), pad=5)


def _moves(fig, record: AllToAllAttentionTrace, place: _Placement) -> None:
    """The all-to-alls between the panels: an arrow each, and what it moves."""
    from matplotlib.patches import FancyArrowPatch

    first, last = _move(record, 0), _move(record, -1)
    narrow, frac, spots = place.narrow, place.frac, place.spots
    panel_w, panel_h = place.panel_w, place.panel_h
    if narrow:
        calls = (f"all-to-all \u00d73 (q, k, v):\n{first}",
                 f"all-to-all (the output):\n{last}")
    else:
        calls = ("all-to-all \u00d73\n(q, k, v)\n" + first.replace(", ", ",\n"),
                 "all-to-all\n(the output)\n" + last.replace(", ", ",\n"))
    for i, words in enumerate(calls):
        (xa, ya), (xb, yb) = spots[i], spots[i + 1]
        if narrow:  # down from one panel to the next, the words beside it
            x = place.left + 0.25
            start, end = frac(x, ya + panel_h + 0.22), frac(x, yb - 0.25)
            at, align = frac(x + 0.2, (ya + panel_h + yb) / 2), "left"
        else:
            y = ya + panel_h / 2
            start, end = frac(xa + panel_w + 0.1, y), frac(xb - 0.45, y)
            at, align = frac((xa + panel_w + xb - 0.35) / 2, y - 0.12), "center"
        fig.patches.append(FancyArrowPatch(
            start, end, transform=fig.transFigure, arrowstyle="-|>",
            mutation_scale=18 if narrow else 22, linewidth=2, color="#444444"))
        fig.text(*at, words, ha=align, va="center" if narrow else "bottom",
                 fontsize=place.pt(10.5), linespacing=1.25)


def _headings(fig, record: AllToAllAttentionTrace, place: _Placement) -> None:
    """The title and what the middle layout means above; the compiled
    program's all-to-alls and the check against one device below."""
    n, fig_h, pt = record.n_devices, place.fig_h, place.pt
    group = "head" if record.heads // n == 1 else "head block"
    footer = (f"{record.all_to_alls} all-to-alls in the compiled program, "
              f"{_bytes(record.all_to_all_bytes)} sent per device; the output "
              f"{'equals' if record.matches_oracle else 'DIFFERS FROM'} "
              "single-device attention")
    if place.narrow:
        _figure.heading(
            fig, f"All-to-all attention, {n} devices",
            "The number: the device holding each (position, head).\n"
            "Attention needs whole sequences: between the\n"
            f"all-to-alls, device d holds every position of {group} d.", pt(7.5))
        fig.text(0.04, 0.1 / fig_h, footer.replace("program, ", "program,\n")
                 .replace("; the output ", ";\noutput "),
                 va="bottom", fontsize=pt(10.5), color="#333333", linespacing=1.25)
    else:
        fig.text(0.5, 1 - 0.12 / fig_h, f"All-to-all attention on {n} devices: "
                 "which device holds each (position, head)", ha="center", va="top",
                 fontsize=14, weight="bold")
        fig.text(0.5, 1 - 0.45 / fig_h, "attention needs whole sequences: between "
                 f"the all-to-alls device d holds every position of {group} d",
                 ha="center", va="top", fontsize=11, color="#333333")
        fig.text(0.5, 0.12 / fig_h, footer, ha="center", va="bottom",
                 fontsize=pt(10.5), color="#333333")
