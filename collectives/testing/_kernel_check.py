"""Run a Pallas kernel the ways that find its bugs: :func:`check_kernel`.

A kernel that passes one run can still be wrong: a DMA read before its wait
returns stale data only when the DMA happens late, a missing barrier breaks
only when a peer is slow, and a race changes the answer only sometimes.
Pallas's TPU interpret mode can expose each of these on the CPU: it runs
DMAs eagerly (at ``.start()``) or as late as possible (at the matching
wait), detects races between devices, and fills memory nobody wrote with
NaN. :func:`check_kernel` runs the kernel in both DMA modes with race
detection on and NaN for uninitialised memory, bounded in time, and fails
with one message naming everything it found.
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


class KernelBugError(AssertionError):
    """:func:`check_kernel` found a race, NaN where data should be, a wrong
    result, an exception or a hang; the message lists each, by DMA mode."""


@dataclasses.dataclass(frozen=True)
class KernelRun:
    """One run of the kernel: its DMA mode, what it found (empty: nothing),
    and how long it took."""

    mode: str
    findings: tuple[str, ...]
    seconds: float


def _nan_finding(out: Any, expected: Any) -> str | None:
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
    return (f"NaN where data should be: {count} of {got.size} elements, the first "
            f"at index {first} (memory no DMA or store wrote: a missing wait, a "
            "wrong slot, or a dropped copy)")


def _value_finding(out: Any, expected: Any, rtol: float, atol: float) -> str | None:
    got, want = np.asarray(out), np.asarray(expected)
    if got.shape != want.shape:
        return f"wrong shape: {got.shape}, expected {want.shape}"
    with np.errstate(invalid="ignore"):
        bad = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    if not bad.any():
        return None
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"wrong values: {int(bad.sum())} of {got.size} elements differ from the "
            f"expected result (rtol={rtol:g}, atol={atol:g}), the first at index "
            f"{first}: {got[first]!r}, expected {want[first]!r}")


def _printed_findings(text: str) -> list[str]:
    """What interpret mode printed but did not raise: races, and semaphores
    left counting at the kernel's end (a real TPU fails on those)."""
    found = []
    races = [line for line in text.splitlines() if "RACE DETECTED" in line]
    if races:
        found.append(f"{len(races)} race(s) reported, the first: {races[0].strip()}")
    counts = [line for line in text.splitlines() if "non-zero count" in line]
    if counts:
        found.append(f"{len(counts)} semaphore(s) not back at 0 when the kernel "
                     f"ended (a signal without its wait, or a wait too few), the "
                     f"first: {counts[0].strip()}")
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


def _one_run(fn: Callable[..., Any], args: Sequence[Any], mode: str, expected: Any,
             rtol: float, atol: float, limit_s: float | None, name: str) -> KernelRun:
    from jax.experimental.pallas import tpu as pltpu

    params = pltpu.InterpretParams(dma_execution_mode=mode, detect_races=True,
                                   uninitialized_memory="nan")
    printed = io.StringIO()
    findings: list[str] = []
    start = time.perf_counter()

    with pltpu.force_tpu_interpret_mode(params):
        # compiled first, outside the limit, where fn can be: the limit then
        # bounds the run alone
        lower = getattr(fn, "lower", None)
        call = lower(*args).compile() if lower is not None else fn

    def run() -> Any:  # in the bounded worker thread: JAX's contexts are per thread
        with pltpu.force_tpu_interpret_mode(params):
            return call(*args)

    out = None
    with contextlib.redirect_stdout(printed):
        try:
            out = _kernels.call_bounded(run, f"{name} (dma_execution_mode={mode!r})",
                                        limit_s)
            races = _compat.interpret_races_found()
        except _kernels.KernelTimeout as err:
            findings.append(f"hang: {err}")
            races = False
        except Exception as err:  # the kernel's own failure is a finding
            findings.append(_exception_finding(err))
            races = False
    found_printed = _printed_findings(printed.getvalue())
    if races and not any("race" in f for f in found_printed):
        found_printed.insert(0, "race(s) reported by interpret mode's detector")
    findings += found_printed
    if out is not None:
        for leaf_out, leaf_want in zip(
                jax.tree_util.tree_leaves(out),
                jax.tree_util.tree_leaves(expected) if expected is not None
                else [None] * len(jax.tree_util.tree_leaves(out)), strict=True):
            for finding in (_nan_finding(leaf_out, leaf_want),
                            None if leaf_want is None
                            else _value_finding(leaf_out, leaf_want, rtol, atol)):
                if finding:
                    findings.append(finding)
    if races or findings:
        _compat.reset_interpret()
    return KernelRun(mode, tuple(findings), time.perf_counter() - start)


def check_kernel(fn: Callable[..., Any], *args: Any, expected: Any = None,
                 rtol: float = 0.0, atol: float = 0.0,
                 modes: Sequence[str] = DMA_MODES, limit_s: float | None = None,
                 name: str | None = None) -> tuple[KernelRun, ...]:
    """Run ``fn(*args)``, which calls Pallas TPU kernels (under
    ``jax.shard_map`` for remote DMAs), in interpret mode once per DMA mode,
    and fail on anything wrong.

    Each run forces interpret mode (``pltpu.force_tpu_interpret_mode``, over
    whatever ``interpret=`` the kernel passes) with race detection on and
    uninitialised memory as NaN, bounded by ``limit_s``. It finds:

    * races between devices (interpret mode's detector);
    * semaphores not back at 0 when the kernel ends;
    * NaN where ``expected`` holds a number (or anywhere, without
      ``expected``, in a float result): memory nothing wrote;
    * values that differ from ``expected`` beyond ``rtol``/``atol``;
    * an exception (e.g. a DMA into a device that has not entered the
      kernel, in eager mode) or a hang (``limit_s``; the kernel is stopped).

    Bugs it cannot see: a kernel whose every schedule interpret mode tries
    gives the right answer with no race (a barrier missing only where one
    device is slow on real hardware, a semaphore shared by two phases that
    never overlap in the simulation). See the docs page "Collectives from
    the inside" for the planted bugs each check catches.

    Args:
      fn: a callable (usually ``jax.jit`` of ``jax.shard_map``) whose kernels
        run in TPU interpret mode; it must take ``args`` as given.
      args: its arguments.
      expected: the result it must return (a pytree like its output), e.g.
        the ``lax`` collective's on the same ``args``, or ``None`` to check
        only races, NaN, exceptions and hangs.
      rtol, atol: the tolerance against ``expected`` (default: bit for bit).
      modes: the DMA modes to run (default both, :data:`DMA_MODES`).
      limit_s: seconds a run may take (default: ``$COLLECTIVES_KERNEL_TIMEOUT``
        or 300).
      name: what the message calls the kernel (default: ``fn``'s name).

    Returns:
      One :class:`KernelRun` per mode, each with no findings.

    Raises:
      KernelBugError: any run found anything; the message lists each finding
        under its DMA mode.
      ValueError: a mode is not one of :data:`DMA_MODES`.
      NotImplementedError: this JAX predates the interpret mode the kernels
        need (0.10.2).
    """
    unknown = [mode for mode in modes if mode not in DMA_MODES]
    if unknown or not modes:
        raise ValueError(
            f"check_kernel(modes={tuple(modes)!r}): each mode must be one of "
            f"{DMA_MODES}. Fix: pass modes={DMA_MODES!r} or one of them.")
    if not _compat.HAS_INTERPRET_KERNELS:
        raise NotImplementedError(
            f"check_kernel needs JAX 0.10.2 or newer (this is {jax.__version__}): "
            "its interpret mode stops every device when one fails. Fix: upgrade JAX.")
    label = name or getattr(fn, "__name__", None) or repr(fn)
    runs = tuple(_one_run(fn, args, mode, expected, rtol, atol, limit_s, label)
                 for mode in modes)
    bad = [run for run in runs if run.findings]
    if bad:
        lines = [f"{label}: check_kernel found {sum(len(r.findings) for r in bad)} "
                 f"problem(s):"]
        for run in bad:
            lines += [f"  [dma_execution_mode={run.mode!r}] {finding}"
                      for finding in run.findings]
        raise KernelBugError("\n".join(lines))
    return runs
