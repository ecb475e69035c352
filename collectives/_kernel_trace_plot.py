"""Drawing a :class:`~collectives._kernel_trace.KernelTrace` as a step diagram.

Devices are rows, steps columns (see :mod:`collectives._kernel_trace`). In
each step an arrow runs from every device that starts a remote DMA to the
device it writes into, coloured by the sender; a dashed grey arrow is a
semaphore signal to another device; a black bar at a column's right edge
marks a device waiting on a semaphore before its next step; a grey square
(left in its column), a copy within the device. The bytes of the DMAs stand
in the heading where every DMA carries the same, else over their column or
on the arrow.

Kept apart from ``_kernel_trace`` so that matplotlib (the ``docs`` extra) is
imported only when a picture is asked for; saved through
:func:`collectives._figure.save` for each column width.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collectives import _figure
from collectives._kernel_trace import KernelTrace

_WIDTH_IN = {"wide": 7.6, "narrow": 3.4}  # within the column at 96 px an inch
_ROW_IN = {"wide": 0.34, "narrow": 0.34}
_LABEL_IN = {"wide": 0.75, "narrow": 0.3}  # the device names at the left
_TOP_IN = 0.75  # the heading and the step numbers
_KEY_IN = {"wide": 0.4, "narrow": 0.6}


def size_text(n_bytes: float) -> str:
    """``n_bytes`` as a reader counts them.

    Examples:
      >>> size_text(2048), size_text(3 * 2 ** 19), size_text(96)
      ('2 KiB', '1.5 MiB', '96 B')
    """
    for unit, size in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n_bytes >= size:
            return f"{n_bytes / size:g} {unit}"
    return f"{n_bytes:g} B"


def _colour(device: int) -> Any:
    import matplotlib  # optional: the docs extra

    palette = [i for i in range(10) if i != 7]  # (tab10's grey is the signals')
    return matplotlib.colormaps["tab10"](palette[device % len(palette)])


def bytes_note(trace: KernelTrace) -> str | None:
    """The heading's line on the DMAs' size where all carry the same, else None."""
    sizes = {d.bytes for d in trace.remote_dmas()}
    if len(sizes) != 1:
        return None
    return f"every arrow: one remote DMA of {size_text(sizes.pop())}"


def figure(trace: KernelTrace, width: str = "wide") -> Any:
    """The matplotlib ``Figure`` of ``trace`` for ``width``'s column."""
    from matplotlib.figure import Figure  # optional: the docs extra
    from matplotlib.patches import FancyArrowPatch

    _figure._check_width(width)
    pt = _figure.font_pt(width, 10)
    n, steps = trace.n_devices, trace.steps
    rows_in = n * _ROW_IN[width]
    fig_w, fig_h = _WIDTH_IN[width], _TOP_IN + rows_in + _KEY_IN[width]
    fig = Figure(figsize=(fig_w, fig_h))
    left = _LABEL_IN[width]
    ax = fig.add_axes((left / fig_w, _KEY_IN[width] / fig_h,
                       (fig_w - left - 0.1) / fig_w, rows_in / fig_h))
    ax.set_xlim(0, steps)
    ax.set_ylim(n - 0.5, -0.5)  # device 0 on top
    ax.axis("off")
    note = bytes_note(trace)
    heading = (f"{trace.name}: {n} devices, {steps} steps"
               if len(shown_senders(trace)) == n
               else f"{trace.name}: device 0's sends of {n}, {steps} steps")
    fig.text(0.01, 1 - 0.08 / fig_h, heading, va="top", fontsize=pt,
             weight="bold")
    fig.text(0.01, 1 - 0.3 / fig_h, note or "bytes on each arrow", va="top",
             fontsize=pt, color="#333333")
    for device in range(n):
        ax.text(-0.01, device, f"device {device}" if width == "wide" else str(device),
                ha="right", va="center", fontsize=pt, color="#444444",
                transform=ax.get_yaxis_transform())  # (x: of the axes' width)
        ax.axhline(device, color="#eeeeee", lw=0.8, zorder=0)
    for step in range(steps):
        ax.text(step + 0.5, -0.6, str(step), ha="center", va="bottom", fontsize=pt,
                color="#444444")
        if step:
            ax.axvline(step, color="#dddddd", lw=0.8, zorder=0)
    shown = shown_senders(trace)
    per_step: dict[int, set[int]] = {}
    for dma in trace.remote_dmas():
        per_step.setdefault(dma.step, set()).add(dma.bytes)
    for dma in trace.dmas:
        if dma.remote and dma.device not in shown:
            continue
        if not dma.remote:
            ax.plot([dma.step + 0.06], [dma.device], marker="s", markersize=6,
                    color="#aaaaaa", linestyle="none")
            continue
        ax.add_patch(FancyArrowPatch(
            (dma.step + 0.12, dma.device), (dma.step + 0.82, dma.target),
            arrowstyle="-|>", mutation_scale=8, lw=1.4, color=_colour(dma.device),
            connectionstyle=_bend(dma.device, dma.target), shrinkA=0, shrinkB=0))
        if note is None and len(per_step[dma.step]) > 1:
            ax.text(dma.step + 0.47, (dma.device + dma.target) / 2,
                    size_text(dma.bytes), ha="center", va="center", fontsize=pt,
                    backgroundcolor="white")
    if note is None:
        for step, sizes in per_step.items():
            if len(sizes) == 1:
                ax.text(step + 0.5, n - 0.45, size_text(next(iter(sizes))),
                        ha="center", va="top", fontsize=pt)
    for op in trace.semaphore_ops:
        if op.kind == "signal" and op.target != op.device and op.device in shown:
            ax.add_patch(FancyArrowPatch(
                (op.step + 0.12, op.device), (op.step + 0.82, op.target),
                arrowstyle="-|>", mutation_scale=6, lw=0.9, ls=(0, (2, 2)),
                color="#888888", connectionstyle=_bend(op.device, op.target),
                shrinkA=0, shrinkB=0))
    for device, step in {(op.device, op.step) for op in trace.waits()}:
        ax.plot([step + 0.93, step + 0.93], [device - 0.3, device + 0.3],
                color="black", lw=2.2, solid_capstyle="butt")
    _key(fig, width, pt)
    return fig


def shown_senders(trace: KernelTrace) -> frozenset[int]:
    """The devices whose remote DMAs the diagram draws: every device's in a
    ring (DMAs between neighbours), only device 0's where most DMAs cross
    rows (all-to-all: n (n - 1) arrows, most of them crossing, teach less
    than one device's n - 1, which every other device repeats, shifted)."""
    remote = trace.remote_dmas()
    n = trace.n_devices
    far = [d for d in remote if min((d.target - d.device) % n,
                                    (d.device - d.target) % n) > 1]
    return frozenset({0}) if len(far) > len(remote) // 2 else frozenset(range(n))


def _bend(source: int, target: int) -> str:
    """Arrows between neighbours run straight; longer ones bow out."""
    return "arc3,rad=0" if abs(target - source) <= 1 else "arc3,rad=-0.25"


def _key(fig: Any, width: str, pt: float) -> None:
    """What the marks mean, under the rows: a line of text, two on a phone."""
    items = ["\N{RIGHTWARDS ARROW} remote DMA (colour: sender)",
             "\N{RIGHTWARDS DASHED ARROW} semaphore signal",
             "\N{BLACK VERTICAL RECTANGLE} wait", "\N{BLACK SQUARE} local copy"]
    text = ("    ".join(items) if width == "wide"
            else "    ".join(items[:2]) + "\n" + "    ".join(items[2:]))
    fig.text(0.01, 0.06 / fig.get_figheight(), text, va="bottom", fontsize=pt,
             color="#333333", linespacing=1.4)


def save(trace: KernelTrace, path: str | Path) -> dict[str, dict]:
    """Draw ``trace`` for both columns: ``path`` (wide) and its narrow
    sibling (:func:`collectives._figure.narrow_path`); each file's record
    by width."""
    records = {}
    for width, file in _figure.columns(path):
        fig = figure(trace, width)
        records[width] = _figure.save(fig, file)
    return records
