"""Timing for the benchmark: repetitions inside one program, medians, spreads.

A small collective takes about as long as dispatching a program (on simulated
CPU devices, a hundred microseconds or so). So the benchmark compiles it inside a
``fori_loop`` whose trip count is a runtime argument: one call runs it
``iters`` times, and the call's wall time divided by ``iters`` is the time of
one collective with dispatch amortised away. ``optimization_barrier`` on the
loop carry stops XLA from hoisting the loop-invariant collective out of the
loop or merging the repetitions.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax


def looped(op: Callable[[Any], Any], pin: Callable[[Any], Any] | None = None
           ) -> Callable[[Any, Any], Any]:
    """``run(x, iters)``: ``op(x)`` repeated ``iters`` times, the last result.

    With ``iters == 1`` the result is exactly ``op(x)``; that call is what the
    correctness check reads. ``pin`` (e.g. a sharding constraint) is applied
    to the input each time round, so the loop carries it in its own layout.
    """
    pin = pin or (lambda v: v)

    def run(x, iters):
        x = pin(x)

        def step(_, carry):
            # The barrier hides that x comes back unchanged every time round,
            # so XLA can neither hoist the collective nor merge repetitions.
            x_in, _ = lax.optimization_barrier(carry)
            x_in = pin(x_in)
            return x_in, op(x_in)

        return lax.fori_loop(1, iters, step, (x, op(x)))[1]

    return run


def block(tree: Any) -> None:
    """Wait until every array in ``tree`` is computed."""
    jax.tree_util.tree_map(lambda a: a.block_until_ready(), tree)


@dataclasses.dataclass(frozen=True)
class Timing:
    """Per-collective times of one measurement, in seconds.

    Attributes:
      iters: collectives per timed call.
      samples: one time per timed call (call time / iters).
    """

    iters: int
    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0.05 = 5 %)."""
        return relative_iqr(self.samples)


def relative_iqr(values: Sequence[float]) -> float:
    """``(p75 - p25) / median`` of ``values``; 0 for a single value."""
    if len(values) < 2:
        return 0.0
    q25, q50, q75 = np.percentile(values, [25, 50, 75])
    return float((q75 - q25) / q50) if q50 > 0 else 0.0


def _call_time(call: Callable[[int], Any], iters: int) -> float:
    start = time.perf_counter()
    block(call(iters))
    return time.perf_counter() - start


def calibrate(call: Callable[[int], Any], min_time: float, start: int = 1,
              max_iters: int = 1 << 14) -> int:
    """Collectives per call so that one call lasts about ``min_time`` seconds.

    The count grows from ``start`` (a guess, e.g. from the previous size);
    each step takes the faster of two calls, so one call slowed by other load
    on the machine does not stop the growth early.
    """
    iters = max(1, min(start, max_iters))
    for _ in range(8):
        took = min(_call_time(call, iters) for _ in range(2))
        if took > 4 * min_time and iters > 1:  # the guess overshot
            iters = max(1, int(iters * min_time / took))
            continue
        if took >= 0.8 * min_time or iters >= max_iters:
            break
        grow = min(64.0, min_time / max(took, 1e-9))
        iters = min(max_iters, max(iters + 1, math.ceil(iters * grow)))
    return iters


def measure(calls: dict[str, Callable[[int], Any]], *, samples: int, warmup: int,
            iters: int | None, min_time: float,
            guess: dict[str, int] | None = None) -> dict[str, Timing]:
    """Time several programs side by side, one timed call of each in turn.

    Each ``call(iters)`` runs one compiled program with ``iters``
    collectives. The calls are interleaved sample by sample, so a burst of
    load on the machine lands on all of them rather than on one.

    Args:
      calls: name -> the program to time.
      samples: timed calls of each; the median and spread are over them.
      warmup: untimed calls of each first (after compilation and calibration).
      iters: collectives per call; ``None`` calibrates each program so that
        a call lasts ``min_time`` seconds and dispatch is a small part of it.
      min_time: the target duration of one call when ``iters`` is ``None``.
      guess: name -> where calibration starts (default 1).

    Returns:
      name -> :class:`Timing`.
    """
    guess = guess or {}
    for call in calls.values():
        block(call(1))  # compiles
    counts = {name: iters or calibrate(call, min_time, guess.get(name, 1))
              for name, call in calls.items()}
    for _ in range(warmup):
        for name, call in calls.items():
            block(call(counts[name]))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(max(1, samples)):
        for name, call in calls.items():
            times[name].append(_call_time(call, counts[name]) / counts[name])
    return {name: Timing(iters=counts[name], samples=tuple(times[name]))
            for name in calls}


def interleaved(calls: dict[str, Callable[[], Any]], *, samples: int,
                min_time: float) -> dict[str, tuple[float, ...]]:
    """Per-call times of several callables, measured turn by turn.

    Each sample times a batch of calls of every callable in turn (the same
    batch length for all), so slow drift in the machine's load hits every
    callable alike and cancels in their ratios.

    Args:
      calls: name -> a callable with no arguments (one dispatch each).
      samples: batches per callable.
      min_time: the target duration of one batch of the slowest callable.

    Returns:
      name -> per-call seconds, one entry per sample.
    """
    for call in calls.values():
        block(call())  # compile and warm up
    slowest = max(_batch_time(call, 1) for call in calls.values())
    batch = max(1, min(1000, math.ceil(min_time / max(slowest, 1e-9))))
    out: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for sample in range(max(1, samples)):
        # rotate the order, so no callable always runs first (or last)
        shift = sample % len(names)
        for name in names[shift:] + names[:shift]:
            out[name].append(_batch_time(calls[name], batch) / batch)
    return {name: tuple(times) for name, times in out.items()}


def _batch_time(call: Callable[[], Any], batch: int) -> float:
    start = time.perf_counter()
    results = [call() for _ in range(batch)]
    block(results)
    return time.perf_counter() - start
