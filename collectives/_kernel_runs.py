"""A kernel's runs with interpret mode's detectors on, and what they found.

A kernel that returns the right values can still be wrong: a DMA read before
its wait returns stale data only when the DMA happens late, a send never
waited for leaves the DMA in flight when the kernel ends (on a TPU, the next
kernel's memory is overwritten), and a race changes the answer only
sometimes. Pallas's TPU interpret mode exposes each of these on the CPU: it
runs DMAs eagerly (at ``.start()``) or as late as possible (at the matching
wait), detects races between devices, fills memory nobody wrote with NaN, and
prints each semaphore not back at zero when the kernel ends.

:func:`detected_run` runs a kernel once that way and names what it found;
:class:`StrictKernelForm` is the kernel form that ``check`` compares, run in
every DMA mode and failing with :class:`KernelBugError` on any finding;
``collectives.testing.check_kernel`` does the same for any kernel.

Each finding starts with its kind (:data:`FINDING_KINDS`) and a colon.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from collectives import _compat
from collectives import _kernels

DMA_MODES: tuple[str, ...] = ("on_wait", "eager")
"""Interpret mode's two DMA schedules: ``"on_wait"`` runs a DMA as late as
its first wait (a read of the destination before the wait sees stale data),
``"eager"`` at ``.start()`` (a DMA into a peer that has not entered the
kernel fails)."""

FINDING_KINDS: tuple[str, ...] = (
    "race", "semaphores left non-zero", "unwritten memory", "wrong values",
    "modes disagree", "exception", "hang")
"""What a finding can be, the word each finding's text starts with."""


class KernelBugError(AssertionError):
    """A kernel's runs found a race, a semaphore left non-zero (a DMA in
    flight or a signal without its wait at the kernel's end), NaN where data
    should be, a wrong result, an exception or a hang; the message's first
    line names the kinds, the next lines each finding by DMA mode."""


@dataclasses.dataclass(frozen=True)
class KernelRun:
    """One run of the kernel: its DMA mode, what it found (empty: nothing),
    and how long it took."""

    mode: str
    findings: tuple[str, ...]
    seconds: float


def detector_params(mode: str) -> Any:
    """Interpret mode with every detector on, in DMA mode ``mode``."""
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams(dma_execution_mode=mode, detect_races=True,
                                 uninitialized_memory="nan")


def nan_finding(out: Any, expected: Any) -> str | None:
    """NaN in ``out`` where ``expected`` (or, without it, every element) holds
    a number: memory the kernel never wrote (interpret mode fills it with NaN)."""
    got = np.asarray(out)
    if not np.issubdtype(got.dtype, np.inexact):
        return None
    unwritten = np.isnan(got)
    if expected is not None:
        unwritten &= ~np.isnan(np.asarray(expected, dtype=got.dtype))
    count = int(unwritten.sum())
    if not count:
        return None
    first = tuple(int(i) for i in np.argwhere(unwritten)[0])
    return (f"unwritten memory: NaN where data should be, {count} of {got.size} "
            f"elements, the first at index {first} (memory no DMA or store "
            "wrote: a missing wait, a wrong slot, or a dropped copy)")


def _printed_findings(text: str) -> list[str]:
    """What interpret mode printed but did not raise: races, and semaphores
    left counting at the kernel's end (a real TPU fails on those)."""
    found = []
    races = [line for line in text.splitlines() if "RACE DETECTED" in line]
    if races:
        found.append(f"race: {len(races)} reported, the first: {races[0].strip()}")
    counts = [line for line in text.splitlines() if "non-zero count" in line]
    if counts:
        found.append(
            f"semaphores left non-zero: {len(counts)} semaphore(s) not back at 0 "
            "when the kernel ended (a DMA still in flight: a send or receive "
            f"never waited for; or a signal without its wait), the first: "
            f"{counts[0].strip()}")
    return found


def _exception_finding(err: Exception) -> str:
    """One line for an exception a kernel raised; a race that interpret mode
    raised (JAX 0.11 on) is named a race."""
    text = str(err)
    lines = [line.strip() for line in text.splitlines() if line.strip()] or [""]
    if "RACE DETECTED" in text:
        at = lines.index(next(line for line in lines if "RACE DETECTED" in line))
        detail = " ".join(lines[at + 1:at + 3])
        return f"race: interpret mode's detector stopped the kernel: {detail}"
    cause = next((line for line in reversed(lines)
                  if line.split(":")[0].endswith(("Error", "Exception"))), lines[-1])
    return f"exception: {type(err).__name__}: {lines[0][:200]}" + (
        f" ... {cause[:300]}" if cause != lines[0] else "")


def detected_run(call: Callable[[], Any], mode: str, *,
                 hang_is_finding: bool = True) -> tuple[Any, list[str]]:
    """``call()``, which runs interpreted kernels bounded in time (e.g. a
    kernel form, or :func:`collectives._kernels.call_bounded`), with
    :func:`detector_params` in force and interpret mode's printing captured.

    Returns:
      Its result (None where it raised) and the findings: races, semaphores
      left non-zero, an exception or (``hang_is_finding``) a hang.

    Raises:
      KernelTimeout: the kernel was stopped, and either ``hang_is_finding``
        is off or it still holds XLA:CPU's threads
        (:func:`collectives._kernels.wedged`: nothing more can run).
    """
    from jax.experimental.pallas import tpu as pltpu

    printed = io.StringIO()
    findings: list[str] = []
    out, races = None, False
    with pltpu.force_tpu_interpret_mode(detector_params(mode)), \
            contextlib.redirect_stdout(printed):
        try:
            out = call()
            races = _compat.interpret_races_found()
        except _kernels.KernelTimeout as err:
            if not hang_is_finding or _kernels.wedged() is not None:
                raise
            findings.append(f"hang: {err}")
        except Exception as err:  # the kernel's own failure is a finding
            findings.append(_exception_finding(err))
    found_printed = _printed_findings(printed.getvalue())
    if races and not any(f.startswith("race") for f in found_printed):
        found_printed.insert(0, "race: reported by interpret mode's detector")
    findings += found_printed
    if races or findings:
        _compat.reset_interpret()
    return out, findings


def _modes_disagree(a: Any, b: Any) -> str | None:
    """Where two results of one kernel, run in two DMA modes, differ (they
    must be equal bit for bit: the same arithmetic in the same order)."""
    for got, other in zip(jax.tree_util.tree_leaves(a),
                          jax.tree_util.tree_leaves(b), strict=True):
        got, other = np.asarray(got), np.asarray(other)
        if got.shape != other.shape:
            return (f"modes disagree: the DMA modes' results have shapes "
                    f"{got.shape} and {other.shape}")
        differ = got != other
        if np.issubdtype(got.dtype, np.inexact):
            differ &= ~(np.isnan(got) & np.isnan(other))
        if differ.any():
            first = tuple(int(i) for i in np.argwhere(differ)[0])
            return (f"modes disagree: {int(differ.sum())} of {got.size} elements "
                    f"differ between the DMA modes, the first at index {first}: "
                    "the result depends on when DMAs land")
    return None


def bug_error(label: str, runs: Sequence[KernelRun]) -> KernelBugError:
    """The error naming every finding of ``runs``: a first line with the
    kinds found, then one line per finding under its DMA mode."""
    bad = [run for run in runs if run.findings]
    kinds = [kind for kind in FINDING_KINDS
             if any(f.startswith(kind) for run in bad for f in run.findings)]
    lines = [f"{label}: {'; '.join(kinds)} "
             f"({sum(len(r.findings) for r in bad)} finding(s) in interpret "
             "mode's runs with its detectors on):"]
    for run in bad:
        lines += [f"  [dma_execution_mode={run.mode!r}] {finding}"
                  for finding in run.findings]
    return KernelBugError("\n".join(lines))


def kinds_named(message: str) -> str | None:
    """The kinds a :class:`KernelBugError` message's first line names, or
    None for any other message."""
    first = message.split("\n", 1)[0]
    _, _, rest = first.rpartition(": ")
    kinds = rest.split(" (", 1)[0] if "finding(s) in interpret mode" in first else ""
    return kinds if kinds and all(k in FINDING_KINDS for k in kinds.split("; ")) \
        else None


class StrictKernelForm:
    """A kernel form run in every DMA mode with interpret mode's detectors
    on, as ``check`` runs the kernel recipes' shard_map form: it returns the
    first mode's result, and raises :class:`KernelBugError` naming each
    race, semaphore left non-zero, NaN where ``expected`` holds a number or
    exception, and any difference between the modes' results. A hang raises
    its :class:`~collectives.KernelTimeout` (which names its causes, a
    starved CPU among them) without running the other modes.

    ``form`` must bound its own calls in time and carry the interpret mode
    in force into the thread that runs the kernel (the kernel recipes'
    forms do: :class:`collectives._kernels.Bounded`); ``expected`` computes
    the oracle's result from the same arguments.
    """

    def __init__(self, form: Callable[..., Any], name: str,
                 expected: Callable[..., Any] | None = None,
                 modes: Sequence[str] = DMA_MODES) -> None:
        self._form, self._name = form, name
        self._expected, self._modes = expected, tuple(modes)

    def __call__(self, *args: Any) -> Any:
        runs, outs = [], []
        want = None
        for mode in self._modes:
            start = time.perf_counter()
            out, findings = detected_run(lambda: self._form(*args), mode,
                                         hang_is_finding=False)
            if out is not None:
                if want is None and self._expected is not None:
                    want = self._expected(*args)
                findings += self._unwritten(out, want)
                if outs:
                    findings += filter(None, [_modes_disagree(outs[0], out)])
                outs.append(out)
            runs.append(KernelRun(mode, tuple(findings), time.perf_counter() - start))
        if any(run.findings for run in runs):
            raise bug_error(self._name, runs)
        return outs[0]

    @staticmethod
    def _unwritten(out: Any, want: Any) -> list[str]:
        leaves = jax.tree_util.tree_leaves(out)
        wants = ([None] * len(leaves) if want is None
                 else jax.tree_util.tree_leaves(want))
        return [found for got, leaf in zip(leaves, wants, strict=True)
                if (found := nan_finding(got, leaf))]
