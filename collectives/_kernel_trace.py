"""What a kernel recipe does on the wire, recorded from a real run.

A kernel recipe (``family="kernel"``) moves its data with remote DMAs and
synchronises with semaphores. :func:`record` runs one call of its shard_map
form in Pallas's TPU interpret mode on the simulated CPU devices and writes
down, per device and in program order, every DMA it starts (to which
device, how many bytes, which semaphores it signals) and every semaphore it
signals or waits on: a :class:`KernelTrace`. The docs draw it as a step
diagram (:mod:`collectives._kernel_trace_plot`); the tests check it against
what the kernel is meant to send.

A device's *step* (:attr:`Dma.step`, :attr:`SemaphoreOp.step`) is a run of
operations that ends in waits: step 0 runs up to and including the
device's first waits, step 1 from the next operation to the waits after it,
and so on. Every device of these kernels runs the same
program, so step ``s`` on one device is step ``s`` on every other: the
columns of the diagram.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from collectives import _compat

WAIT_KINDS = ("wait", "dma_wait")
"""Semaphore operations that block the device until a count arrives."""


@dataclasses.dataclass(frozen=True)
class Dma:
    """One DMA: ``device`` copies ``bytes`` to ``target`` in step ``step``,
    signalling its send semaphore ``send_sem`` (None where it has none) and
    the receiver's ``recv_sem``; ``order`` is its place in the device's
    program."""

    device: int
    target: int
    bytes: int
    send_sem: int | None
    recv_sem: int
    step: int
    order: int

    @property
    def remote(self) -> bool:
        """Whether it leaves the device."""
        return self.target != self.device


@dataclasses.dataclass(frozen=True)
class SemaphoreOp:
    """``device`` signals (``kind="signal"``: adds ``amount`` to semaphore
    ``sem`` of ``target``) or waits (``"wait"``: until ``sem`` counts
    ``amount``; ``"dma_wait"``: until ``amount`` bytes of a DMA have
    arrived or left) in step ``step``; ``order`` as for :class:`Dma`."""

    device: int
    kind: str
    sem: int
    amount: int
    target: int
    step: int
    order: int

    @property
    def waits(self) -> bool:
        return self.kind in WAIT_KINDS


@dataclasses.dataclass(frozen=True)
class KernelTrace:
    """One kernel call, as each simulated device ran it."""

    name: str
    n_devices: int
    dmas: tuple[Dma, ...]
    semaphore_ops: tuple[SemaphoreOp, ...]
    barrier_sems: frozenset[int]

    def remote_dmas(self) -> list[Dma]:
        """The DMAs that leave their device, by device and program order."""
        return sorted((d for d in self.dmas if d.remote),
                      key=lambda d: (d.device, d.order))

    def waits(self) -> list[SemaphoreOp]:
        """Every wait, by device and program order."""
        return sorted((op for op in self.semaphore_ops if op.waits),
                      key=lambda op: (op.device, op.order))

    @property
    def steps(self) -> int:
        """How many steps the longest device's program has."""
        return 1 + max((e.step for e in (*self.dmas, *self.semaphore_ops)),
                       default=0)

    def sem_name(self, sem: int) -> str:
        """A semaphore's role, read off its use: ``barrier``, ``recv[k]``
        (a remote DMA's receive semaphore, ``k`` in id order), ``send[k]``
        or ``local[k]``."""
        if sem in self.barrier_sems:
            return "barrier"
        remote = [d for d in self.dmas if d.remote]
        for role, found in (("recv", {d.recv_sem for d in remote}),
                            ("send", {d.send_sem for d in remote} - {None})):
            if sem in found and len(found) == 1:
                return role
            if sem in found:
                return f"{role}[{sorted(found).index(sem)}]"
        local = sorted({d.recv_sem for d in self.dmas if not d.remote}
                       | {d.send_sem for d in self.dmas if not d.remote} - {None})
        return f"local[{local.index(sem)}]" if sem in local else f"sem {sem}"

    def summary(self) -> str:
        """A line a device of what it sends: the diagram in a few words."""
        from collections import Counter

        lines = [f"{self.name} on {self.n_devices} devices, {self.steps} steps."]
        for device in range(self.n_devices):
            sent = Counter((d.target, d.bytes) for d in self.remote_dmas()
                           if d.device == device)
            parts = [f"{count} x {size} bytes to device {target}"
                     for (target, size), count in sorted(sent.items())]
            lines.append(f"Device {device} sends {', '.join(parts) or 'nothing'}.")
        return " ".join(lines)

    def text(self) -> str:
        """The trace in words, a line a device: what the diagram shows."""
        lines = [f"{self.name} on {self.n_devices} devices, {self.steps} steps"]
        for device in range(self.n_devices):
            parts = []
            for event in sorted(
                    [e for e in (*self.dmas, *self.semaphore_ops)
                     if e.device == device], key=lambda e: e.order):
                if isinstance(event, Dma):
                    where = (f"to device {event.target}" if event.remote
                             else "local copy")
                    parts.append(f"step {event.step}: DMA {where}, "
                                 f"{event.bytes} bytes")
                elif event.waits:
                    parts.append(f"step {event.step}: wait "
                                 f"{self.sem_name(event.sem)}")
                elif event.target != device:
                    parts.append(f"step {event.step}: signal device "
                                 f"{event.target}")
            lines.append(f"device {device}: " + "; ".join(parts))
        return "\n".join(lines)


class _Recorder:
    """Collects :func:`collectives._compat.interpret_events` from every
    simulated device's thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, dict]] = []

    def __call__(self, kind: str, fields: dict) -> None:
        with self.lock:
            self.events.append((kind, dict(fields)))

    def trace(self, name: str, n_devices: int) -> KernelTrace:
        sizes = {f["dma"]: f["bytes"] for kind, f in self.events
                 if kind == "dma_bytes"}
        step = [0] * n_devices
        order = [0] * n_devices
        waited = [False] * n_devices
        dmas, ops, barriers = [], [], set()
        for kind, f in self.events:
            if kind in ("dma_bytes", "barrier"):
                if kind == "barrier":
                    barriers.add(f["sem"])
                continue
            device = f["device"]
            if waited[device] and kind not in WAIT_KINDS:
                step[device] += 1  # the first operation after waits opens a step
                waited[device] = False
            here = dict(device=device, step=step[device], order=order[device])
            order[device] += 1
            if kind == "dma_start":
                dmas.append(Dma(target=f["target"], bytes=sizes.get(f["dma"], 0),
                                send_sem=f["send_sem"], recv_sem=f["recv_sem"],
                                **here))
            elif kind == "signal":
                ops.append(SemaphoreOp(kind="signal", sem=f["sem"],
                                       amount=f["inc"], target=f["target"], **here))
            else:
                amount = f["bytes"] if kind == "dma_wait" else f["value"]
                ops.append(SemaphoreOp(kind=kind, sem=f["sem"], amount=amount,
                                       target=device, **here))
                waited[device] = True
        return KernelTrace(name, n_devices, tuple(dmas), tuple(ops),
                           frozenset(barriers))


def record(name: str, mesh: Any = None, axis: str | None = None,
           dims: tuple[int, ...] = (4, 128)) -> KernelTrace:
    """Run kernel recipe ``name``'s shard_map form once, on its example
    arguments (``dims`` as for :meth:`collectives.Recipe.example_args`), and
    return what each device did.

    The call runs bounded in time like every kernel form
    (:class:`collectives._kernels.KernelTimeout`); JAX's caches are cleared
    first, so the kernel is traced again with the recording in place.

    Raises:
      ValueError: ``name`` is not a kernel recipe.
      RuntimeError: this JAX runs no kernels in interpret mode (before
        0.10.2; ``tests/test_kernel_trace.py`` shows a recording's use).
    """
    import collectives as cx

    recipe = cx.RECIPES.get(name)
    if recipe is None or recipe.family != "kernel":
        kernels = sorted(n for n, r in cx.RECIPES.items() if r.family == "kernel")
        raise ValueError(f"record({name!r}): not a kernel recipe. Fix: one of "
                         f"{', '.join(kernels)}.")
    axes = recipe.axes(mesh, axis)
    args = recipe.example_args(mesh, axis, dims=dims, exact=True)
    recorder = _Recorder()
    with _compat.interpret_events(recorder):
        recipe.run("shard_map", args, axes)
    return recorder.trace(name, axes.size)
