"""Run a Pallas kernel the ways that find its bugs: :func:`check_kernel`.

A kernel that passes one run can still be wrong: a DMA read before its wait
returns stale data only when the DMA happens late, a missing barrier breaks
only when a peer is slow, and a race changes the answer only sometimes.
Pallas's TPU interpret mode can expose each of these on the CPU: it runs
DMAs eagerly (at ``.start()``) or as late as possible (at the matching
wait), detects races between devices, and fills memory nobody wrote with
NaN. :func:`check_kernel` runs the kernel in both DMA modes with race
detection on and NaN for uninitialised memory, bounded in time, and fails
with one message naming everything it found (the runs themselves are
``collectives._kernel_runs``', which ``check`` uses for the kernel recipes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from collectives import _compat
from collectives import _kernels
from collectives._kernel_runs import DMA_MODES
from collectives._kernel_runs import KernelBugError
from collectives._kernel_runs import KernelRun
from collectives._kernel_runs import bug_error
from collectives._kernel_runs import detected_run
from collectives._kernel_runs import detector_params
from collectives._kernel_runs import nan_finding
from collectives._tolerance import check_tolerances

__all__ = ["DMA_MODES", "KernelBugError", "KernelRun", "check_kernel"]


def _value_finding(out: Any, expected: Any, rtol: float, atol: float) -> str | None:
    got, want = np.asarray(out), np.asarray(expected)
    if got.shape != want.shape:
        return f"wrong values: the shape {got.shape}, expected {want.shape}"
    with np.errstate(invalid="ignore"):
        bad = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    if not bad.any():
        return None
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"wrong values: {int(bad.sum())} of {got.size} elements differ from the "
            f"expected result (rtol={rtol:g}, atol={atol:g}), the first at index "
            f"{first}: {got[first]!r}, expected {want[first]!r}")


def _one_run(fn: Callable[..., Any], args: Sequence[Any], mode: str, expected: Any,
             rtol: float, atol: float, limit_s: float | None, name: str) -> KernelRun:
    from jax.experimental.pallas import tpu as pltpu

    start = time.perf_counter()
    with pltpu.force_tpu_interpret_mode(detector_params(mode)):
        # compiled first, outside the limit, where fn can be: the limit then
        # bounds the run alone
        lower = getattr(fn, "lower", None)
        call = lower(*args).compile() if lower is not None else fn
    out, findings = detected_run(lambda: _kernels.call_bounded(
        lambda: call(*args), f"{name} (dma_execution_mode={mode!r})", limit_s), mode)
    if out is not None:
        for leaf_out, leaf_want in zip(
                jax.tree_util.tree_leaves(out),
                jax.tree_util.tree_leaves(expected) if expected is not None
                else [None] * len(jax.tree_util.tree_leaves(out)), strict=True):
            for finding in (nan_finding(leaf_out, leaf_want),
                            None if leaf_want is None
                            else _value_finding(leaf_out, leaf_want, rtol, atol)):
                if finding:
                    findings.append(finding)
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
      ValueError: a mode is not one of :data:`DMA_MODES`, ``rtol`` or
        ``atol`` is not a finite number >= 0, or ``limit_s`` not one above 0.
      TypeError: ``fn`` is not callable.
      NotImplementedError: this JAX predates the interpret mode the kernels
        need (0.10.2).
    """
    if not callable(fn):
        raise TypeError(
            f"check_kernel(fn={fn!r}): expected the function that runs the kernel "
            "(a callable taking *args). Fix: pass it first, then its arguments.")
    check_tolerances("check_kernel", rtol=rtol, atol=atol)
    if limit_s is not None and (isinstance(limit_s, bool) or not isinstance(
            limit_s, (int, float)) or not 0 < limit_s < float("inf")):
        raise ValueError(
            f"check_kernel(limit_s={limit_s!r}): expected seconds, a finite number "
            "above 0. Fix: pass e.g. limit_s=60, or leave it out for the default.")
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
    if any(run.findings for run in runs):
        raise bug_error(label, runs)
    return runs
