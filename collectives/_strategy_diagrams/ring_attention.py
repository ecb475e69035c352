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
from collectives.hlo import collective_stats
from collectives.recipes import ring_attention as ring_file

AXIS = "i"
VARIANTS = ("ring_attention", "ring_attention_causal")
# what a causal step does with the block it folds in (see folds())
SKIPPED, PARTIAL, FULL = 0, 1, 2

CAPTION = (
    "Ring attention on 8 devices: at each ring step (column) every device (row) "
    "keeps its query block and folds the K/V block it holds into its online "
    "softmax, then passes K and V on to the next device. Drawn from a real run "
    "of recipes/ring_attention.py's ring_attention_body under shard_map, its "
    "ring_shift reporting each arriving block (K filled with block ids, V "
    "one-hot, q = 0); the causal run's output shows which blocks are wholly "
    "masked (folded as zeros) and which are the partly masked diagonal.")


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


def draw(record: RingAttentionTrace, path, width: str = "wide") -> None:
    """Write the SVG: one panel per variant, steps as columns, devices as rows."""
    import matplotlib  # optional: the docs extra

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.patches import Polygon
    from matplotlib.patches import Rectangle

    n = record.n_devices
    fig = Figure(figsize=(10, 6.6))
    axes = fig.subplots(1, 2, gridspec_kw=dict(wspace=0.06))
    fig.subplots_adjust(left=0.14, right=0.99, top=0.85, bottom=0.2)
    titles = ("ring_attention", "ring_attention_causal")
    for variant, ax in enumerate(axes):
        marks = folds(record, variant)
        for step in range(n):
            for device in range(n):
                block = int(record.k_block[variant][step, device])
                mark = int(marks[step, device])
                x, y = step, device
                if mark == SKIPPED:
                    ax.add_patch(Rectangle((x, y), 1, 1, facecolor="#f2f2f2",
                                           edgecolor="white", linewidth=1.5,
                                           hatch="xx"))
                    ax.add_patch(Rectangle((x, y), 1, 1, fill=False,
                                           edgecolor="white", linewidth=1.5))
                else:
                    ax.add_patch(Rectangle((x, y), 1, 1, facecolor=_colour(block),
                                           edgecolor="white", linewidth=1.5))
                if mark == PARTIAL:  # corner: the keys after each query, masked
                    ax.add_patch(Polygon([(x + 0.5, y + 0.04), (x + 0.96, y + 0.04),
                                          (x + 0.96, y + 0.5)], closed=True,
                                         facecolor="white", edgecolor="#333333",
                                         hatch="////", linewidth=0.8))
                ax.text(x + 0.5, y + 0.5, str(block), ha="center", va="center",
                        fontsize=13, weight="bold",
                        color="#9a9a9a" if mark == SKIPPED else "black")
        ax.set_xlim(0, n)
        ax.set_ylim(n, 0)
        ax.set_aspect("equal")
        ax.set_xticks(np.arange(n) + 0.5, [str(s) for s in range(n)], fontsize=11)
        ax.set_yticks(np.arange(n) + 0.5,
                      [f"{d}  (q {record.query_block[d]})" for d in range(n)],
                      fontsize=11)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.set_xlabel("ring step", fontsize=11)
        ax.set_title(titles[variant], fontsize=13, family="monospace")
        if variant:
            ax.set_yticklabels([])
        else:
            ax.set_ylabel("device  (query block, stays put)", fontsize=11)
    fig.suptitle(f"Ring attention on {n} devices: the K/V block each device "
                 "folds into its online softmax", fontsize=14, weight="bold",
                 y=0.98)
    fig.text(0.565, 0.91, "step 0: the device's own block; each later step: one "
             "ppermute of K and one of V, device d \u2192 d + 1", ha="center",
             fontsize=11, color="#333333")
    handles = [
        Patch(facecolor=_colour(2), edgecolor="white",
              label="K/V block folded in (number, colour: block id)"),
        Patch(facecolor=_colour(2), edgecolor="#555555", hatch="////",
              label="diagonal block: keys after each query masked"),
        Patch(facecolor="#f2f2f2", edgecolor="#c8c8c8", hatch="xx",
              label="wholly masked (a later block): folds in zeros"),
        Patch(facecolor="none", edgecolor="none",
              label=f"{record.permutes} collective-permutes in the compiled body"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=11,
               frameon=False, bbox_to_anchor=(0.54, 0.0))
    _figure.save(fig, path)
