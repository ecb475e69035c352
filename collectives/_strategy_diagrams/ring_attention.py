"""Ring attention's K/V rotation, traced from a real run of its recipe file.

:func:`trace` runs ``recipes/ring_attention.py``'s ``ring_attention_body``
under ``jax.shard_map`` on marker inputs, once plain and once causal, and
reads off what happened:

* which K and V block every device holds at every ring step: the body's
  ``shift`` parameter gets the file's own ``ring_shift`` wrapped with a
  ``jax.experimental.io_callback`` that reports the block that just arrived
  (K blocks are filled with their block id, V rows are one-hot position
  markers); the callback's result (``0``) is added to the shifted block, so
  each step's report is finished before the next step can shift it on, and a
  device's reports come in step order (step 0, the device's own block, is
  read from the input shard it was given);
* which (query, key) pairs the online softmax folded in: with ``q = 0`` every
  score is 0, so output row ``p`` is the mean of the one-hot V rows it saw,
  and ``output > 0`` is the attention pattern the run computed (for the
  causal run its last key is the query's own position: the query block);
* the collective-permutes in the compiled program of the plain body.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import numpy as np
from jax import lax
from jax.experimental import io_callback
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from collectives import _figure
from collectives._devices import make_mesh
from collectives._strategy_diagrams import on_its_own_mesh
from collectives.hlo import collective_stats
from collectives.recipes import ring_attention as ring_file

AXIS = "i"
VARIANTS = ("ring_attention", "ring_attention_causal")
# what a causal step does with the block it folds in (see folds())
SKIPPED, PARTIAL, FULL = 0, 1, 2

CAPTION = (
    "Ring attention on 8 devices, recorded from a real run: every device keeps "
    "its query block and, at each ring step, folds the K/V block it holds into "
    "its online softmax, then passes K and V on to the next device with a "
    "ppermute. Under a causal mask the later blocks count for nothing and the "
    "device's own block is half masked.")


@dataclass(frozen=True, eq=False)
class RingAttentionTrace:
    """What a run of ``ring_attention_body`` did, per ring step and device.

    Variant ``0`` is ``ring_attention``, ``1`` is ``ring_attention_causal``.
    """

    n_devices: int
    rows: int  # sequence positions per block (per device)
    query_block: tuple[int, ...]  # [device] the query block of its output rows
    k_block: np.ndarray  # [variant, step, device] K block folded in at that step
    v_block: np.ndarray  # [variant, step, device] V block folded in at that step
    visible: np.ndarray  # [variant, device, block] share of (query, key) pairs
    #                      whose softmax weight came out nonzero
    permutes: int  # collective-permutes in the compiled plain body
    permute_bytes: float  # bytes each device sends in them


def _markers(n: int, rows: int):
    """q = 0 (every score 0), K filled with its block id, V one-hot per
    position: ``[S, 1, S]`` each, ``S = n * rows``."""
    seq = n * rows
    q = np.zeros((seq, 1, seq), np.float32)
    block_of = np.repeat(np.arange(n, dtype=np.float32), rows)
    k = np.broadcast_to(block_of[:, None, None], (seq, 1, seq)).copy()
    v = np.eye(seq, dtype=np.float32)[:, None, :]
    return q, k, v


def _decode(x: np.ndarray, rows: int) -> tuple[str, int]:
    """A marker block -> ("K" or "V", its block id); -1 if it is neither."""
    if x.min() == x.max():  # K: filled with its block id
        return "K", int(x.flat[0])
    positions = x[:, 0, :].argmax(-1)  # V: row r is one-hot at its position
    block = int(positions[0]) // rows
    ok = (np.array_equal(positions, block * rows + np.arange(rows))
          and np.array_equal(x[:, 0, :].sum(-1), np.ones(rows)))
    return "V", block if ok else -1


def _reporting_shift(log: list, rows: int):
    """The file's ``ring_shift``, reporting (device, kind, block) of what arrives."""
    def report(device, x):
        log.append((int(device), *_decode(np.asarray(x), rows)))
        return np.zeros((), x.dtype)

    def shift(x, axis=AXIS, shift=1):
        out = ring_file.ring_shift(x, axis, shift)
        done = io_callback(report, jax.ShapeDtypeStruct((), x.dtype),
                           lax.axis_index(axis), out)
        return out + done  # + 0: the next step's shift waits for this report
    return shift


def _per_device(sharded) -> list[np.ndarray]:
    """The blocks of a sequence-sharded array, in device (axis index) order."""
    shards = sorted(sharded.addressable_shards, key=lambda s: s.index[0].start or 0)
    return [np.asarray(s.data) for s in shards]


def _run(mesh, n: int, rows: int, causal: bool):
    q, k, v = _markers(n, rows)
    sharding = NamedSharding(mesh, P(AXIS))
    q, k, v = (jax.device_put(x, sharding) for x in (q, k, v))
    log: list = []
    body = functools.partial(ring_file.ring_attention_body, axis=AXIS, causal=causal,
                             shift=_reporting_shift(log, rows))
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(AXIS),) * 3,
                              out_specs=P(AXIS)))
    out = f(q, k, v)
    out.block_until_ready()
    held = {kind: np.full((n, n), -1) for kind in "KV"}
    # step 0 folds the device's own block: what its input shards hold
    for kind, x in (("K", k), ("V", v)):
        for device, block in enumerate(_per_device(x)):
            held[kind][0, device] = _decode(block, rows)[1]
    step = {(device, kind): 1 for device in range(n) for kind in "KV"}
    for device, kind, block in log:  # a device's reports come in step order
        if step[device, kind] < n:
            held[kind][step[device, kind], device] = block
        step[device, kind] += 1
    if any(count != n for count in step.values()):
        raise AssertionError(f"expected {n - 1} shifts of K and of V per device, "
                             f"got {sorted(step.items())}")
    pattern = np.asarray(out)[:, 0, :] > 0  # [query, key] folded with weight > 0
    visible = pattern.reshape(n, rows, n, rows).mean(axis=(1, 3))
    query = tuple(int(np.flatnonzero(block[:, 0, :].sum(0) > 0).max()) // rows
                  for block in _per_device(out))
    return held["K"], held["V"], visible, query


@on_its_own_mesh
def trace(n_devices: int = 8, rows: int = 2) -> RingAttentionTrace:
    """Run ``ring_attention_body`` (plain and causal) on ``n_devices`` devices,
    ``rows`` sequence positions each, and record the rotation."""
    mesh = make_mesh((n_devices,), AXIS)
    runs = [_run(mesh, n_devices, rows, causal) for causal in (False, True)]
    q, k, v = _markers(n_devices, rows)
    plain = jax.shard_map(functools.partial(ring_file.ring_attention_body, axis=AXIS),
                          mesh=mesh, in_specs=(P(AXIS),) * 3, out_specs=P(AXIS))
    stats = collective_stats(jax.jit(plain), q, k, v)
    arrays = [np.array([run[i] for run in runs]) for i in range(3)]
    for array in arrays:
        array.flags.writeable = False
    return RingAttentionTrace(
        n_devices=n_devices, rows=rows, query_block=runs[1][3],
        k_block=arrays[0], v_block=arrays[1], visible=arrays[2],
        permutes=stats.count("collective-permute"),
        permute_bytes=float(stats.bytes("collective-permute")))


def folds(record: RingAttentionTrace, variant: int = 1) -> np.ndarray:
    """``[step, device]``: FULL, PARTIAL or SKIPPED (every score masked), from
    the share of the held K block's keys the run's output gave weight."""
    steps = np.arange(record.n_devices)[:, None]
    devices = np.arange(record.n_devices)[None, :]
    share = record.visible[variant][devices, record.k_block[variant][steps, devices]]
    return np.where(share >= 1, FULL, np.where(share > 0, PARTIAL, SKIPPED))


_MARK = {FULL: " ", PARTIAL: "~", SKIPPED: "x"}


def text(record: RingAttentionTrace) -> str:
    """The K/V block each device folds in at each step, as a plain-text table."""
    n = record.n_devices
    lines = [f"Ring attention, {n} devices: the K/V block each device (row) "
             "folds in at each ring step (column)",
             "device  query | " + " ".join(f"{s:>3}" for s in range(n))]
    marks = folds(record, 1)
    for d in range(n):
        cells = []
        for s in range(n):
            k, v = record.k_block[1][s, d], record.v_block[1][s, d]
            cell = f"{k}" if k == v else f"{k}/{v}"
            cells.append(f"{cell}{_MARK[int(marks[s, d])]}".rjust(3))
        lines.append(f"{d:>6}  {record.query_block[d]:>5} | " + " ".join(cells))
    lines.append("causal: x = wholly masked (folded as zeros), ~ = diagonal block "
                 "(keys after the query masked); plain: every block folded whole.")
    lines.append(f"compiled plain body: {record.permutes} collective-permutes "
                 f"(K and V, {n - 1} steps), {record.permute_bytes:g} bytes "
                 "per device.")
    return "\n".join(lines)


def _colour(block: int):
    import matplotlib  # optional: the docs extra

    red, green, blue, _ = matplotlib.colormaps["tab10"](block % 10)
    return (0.45 + 0.55 * red, 0.45 + 0.55 * green, 0.45 + 0.55 * blue)


def _bytes(n: float) -> str:
    return f"{n:,.0f} bytes" if n < 10_000 else f"{n / 1024:,.1f} KiB"


_MASKED = dict(facecolor="#f2f2f2", edgecolor="#c8c8c8", hatch="xx")


def draw(record: RingAttentionTrace, path, width: str = "wide") -> None:
    """Write the SVG: one panel per variant, steps as columns, devices as
    rows; side by side for the ``"wide"`` column, stacked for ``"narrow"``."""
    import matplotlib  # optional: the docs extra

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    n = record.n_devices
    narrow = width == "narrow"
    # inches: figure size, panel size and where each panel's top-left sits
    if narrow:
        cell, left, top = 0.33, 0.62, 1.05
        fig_w = 3.7
        grid = n * cell
        spots = [(left, top), (left, top + grid + 0.78)]
        legend_top = spots[1][1] + grid + 0.5
        fig_h = legend_top + 1.05
    else:
        cell, left, top = 0.5, 1.05, 0.95
        fig_w = 10
        grid = n * cell
        spots = [(left, top), (left + grid + 0.35, top)]
        legend_top = top + grid + 0.62
        fig_h = legend_top + 0.6
    fig = Figure(figsize=(fig_w, fig_h))
    for variant, (x0, y0) in enumerate(spots):
        ax = fig.add_axes((x0 / fig_w, 1 - (y0 + grid) / fig_h, grid / fig_w,
                           grid / fig_h))
        _panel(ax, record, variant, width)
    _headings(fig, record, width, fig_h)
    _legend(fig, width, 1 - legend_top / fig_h)
    _figure.save(fig, path)


def _panel(ax, record: RingAttentionTrace, variant: int, width: str) -> None:
    """One variant (0: no mask, 1: causal): the K/V block each device folds
    in at each ring step, its mask drawn over it."""
    n = record.n_devices
    marks = folds(record, variant)
    for step in range(n):
        for device in range(n):
            _cell(ax, step, device, int(record.k_block[variant][step, device]),
                  int(marks[step, device]), width)
    _axes(ax, record, variant, width)


def _cell(ax, x: int, y: int, block: int, mark: int, width: str) -> None:
    """One fold: the block's colour (grey where wholly masked), the masked
    half of a diagonal block hatched, the block's number."""
    from matplotlib.patches import Polygon
    from matplotlib.patches import Rectangle

    if mark == SKIPPED:
        ax.add_patch(Rectangle((x, y), 1, 1, linewidth=0, **_MASKED))
    else:
        ax.add_patch(Rectangle((x, y), 1, 1, facecolor=_colour(block), linewidth=0))
    if mark == PARTIAL:  # the keys after each query: masked
        ax.add_patch(Polygon([(x, y), (x + 1, y), (x + 1, y + 1)],
                             closed=True, linewidth=0, **_MASKED))
    ax.add_patch(Rectangle((x, y), 1, 1, fill=False, edgecolor="white",
                           linewidth=1.5))
    # on a diagonal block, the number sits in its unmasked half
    at = (x + 0.3, y + 0.66) if mark == PARTIAL else (x + 0.5, y + 0.5)
    ax.text(*at, str(block), ha="center", va="center",
            fontsize=_figure.font_pt(width, 13) if width != "narrow" else 8,
            weight="bold", color="#8a8a8a" if mark == SKIPPED else "black")


def _axes(ax, record: RingAttentionTrace, variant: int, width: str) -> None:
    """A panel's ticks, labels and title."""
    n = record.n_devices
    narrow = width == "narrow"

    def pt(points):
        return _figure.font_pt(width, points)

    same_query = tuple(record.query_block) == tuple(range(n))
    ax.set_xlim(0, n)
    ax.set_ylim(n, 0)
    ax.set_xticks(np.arange(n) + 0.5, [str(s) for s in range(n)],
                  fontsize=pt(11))
    ax.set_yticks(np.arange(n) + 0.5,
                  [str(d) if same_query else f"{d} (q {record.query_block[d]})"
                   for d in range(n)], fontsize=pt(11))
    ax.tick_params(length=0, pad=2)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(("no mask", "causal mask")[variant], fontsize=pt(12.5),
                 weight="bold", pad=4)
    if narrow or variant == 0:
        ax.set_ylabel("device" if narrow else
                      "device  (keeps its query block)", fontsize=pt(11))
    else:
        ax.set_yticklabels([])
    ax.set_xlabel("ring step", fontsize=pt(11), labelpad=2)


def _headings(fig, record: RingAttentionTrace, width: str, fig_h: float) -> None:
    """The title and what a step does above, the compiled permutes below."""
    n = record.n_devices
    narrow = width == "narrow"
    pt = functools.partial(_figure.font_pt, width)
    if narrow:
        _figure.heading(
            fig, f"Ring attention, {n} devices",
            "each device keeps its query block; the number is\n"
            "the K/V block it folds in. Each step: one ppermute\n"
            "of K and one of V, device d \u2192 d + 1", pt(7.5))
    else:
        fig.text(0.5, 1 - 0.12 / fig_h, f"Ring attention on {n} devices: the K/V "
                 "block each device folds into its online softmax", ha="center",
                 va="top", fontsize=14, weight="bold")
        fig.text(0.5, 1 - 0.45 / fig_h, "step 0: the device's own block; each "
                 "later step: one ppermute of K and one of V, device d \u2192 d + 1",
                 ha="center", va="top", fontsize=11, color="#333333")
    sent = (f"{record.permutes} ppermutes in the compiled program,"
            f"{chr(10) if narrow else ' '}{_bytes(record.permute_bytes)} sent per "
            "device")
    fig.text(0.04 if narrow else 0.5, 0.1 / fig_h, sent,
             ha="left" if narrow else "center", va="bottom", fontsize=pt(10.5),
             color="#333333")


def _legend(fig, width: str, top: float) -> None:
    """The three kinds of fold: whole, diagonal, wholly masked."""
    from matplotlib.patches import Patch

    narrow = width == "narrow"
    handles = [
        Patch(facecolor=_colour(2), label="K/V block folded in (number: block id)"),
        Patch(facecolor=_colour(2), edgecolor="#c8c8c8", hatch="xx",
              label="diagonal block: later keys masked"),
        Patch(label="later block: wholly masked (adds zeros)", **_MASKED),
    ]
    if narrow:
        handles[0].set_label("K/V block folded in")
        handles[1].set_label("diagonal block: later keys masked")
        handles[2].set_label("later block: wholly masked")
    fig.legend(handles=handles, loc="upper left" if narrow else "upper center",
               ncol=1 if narrow else 3, fontsize=_figure.font_pt(width, 10.5),
               frameon=False, handlelength=1.6, columnspacing=1.5, borderaxespad=0,
               bbox_to_anchor=(0.04 if narrow else 0.5, top))
