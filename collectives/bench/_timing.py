"""Timing for the benchmark: repetitions inside one program, rounds of samples.

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
import functools
import itertools
import math
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from collectives.bench._stats import Estimate
from collectives.bench._stats import Stopping
from collectives.bench._stats import median_interval
from collectives.bench._stats import sample_adaptively

MIN_ITERS = 3
"""The fewest collectives in one calibrated call."""


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
      stopped: why sampling stopped (``precision``, ``budget``, ``max_samples``).
    """

    iters: int
    samples: tuple[float, ...]
    stopped: str = "precision"

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @functools.cached_property
    def interval(self) -> Estimate:
        """The median with its 95 % bootstrap interval."""
        return median_interval(self.samples)


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


def _rotating(names: list[str], time_one: Callable[[str], float]
              ) -> Callable[[], dict[str, float]]:
    """One round: one sample of each name, the order rotated from round to round
    so that no program always runs first (or last)."""
    rounds = itertools.count()

    def round_() -> dict[str, float]:
        shift = next(rounds) % len(names)
        return {name: time_one(name) for name in names[shift:] + names[:shift]}

    return round_


def measure(calls: dict[str, Callable[[int], Any]], *, stopping: Stopping,
            warmup: int, iters: int | None, min_time: float,
            guess: dict[str, int] | None = None,
            min_iters: int = MIN_ITERS) -> dict[str, Timing]:
    """Time several programs side by side, one timed call of each in turn.

    Each ``call(iters)`` runs one compiled program with ``iters``
    collectives. The calls are interleaved round by round, so a burst of
    load on the machine lands on all of them rather than on one; rounds are
    taken until every median's interval is within ``stopping.precision`` or
    the time budget is spent.

    Args:
      calls: name -> the program to time.
      stopping: the precision, time budget and bounds on the rounds.
      warmup: untimed calls of each first (after compilation and calibration).
      iters: collectives per call; ``None`` calibrates each program so that
        a call lasts ``min_time`` seconds and dispatch is a small part of it.
      min_time: the target duration of one call when ``iters`` is ``None``.
      guess: name -> where calibration starts (default 1).
      min_iters: the fewest collectives per calibrated call, so that at large
        sizes one sample is still several collectives, not one.

    Returns:
      name -> :class:`Timing`.
    """
    guess = guess or {}
    for call in calls.values():
        block(call(1))  # compiles
    counts = {name: iters or max(min_iters, calibrate(call, min_time,
                                                      guess.get(name, 1)))
              for name, call in calls.items()}
    for _ in range(warmup):
        for name, call in calls.items():
            block(call(counts[name]))
    round_ = _rotating(list(calls), lambda name: _call_time(
        calls[name], counts[name]) / counts[name])
    times, stopped = sample_adaptively(
        round_, lambda got: [median_interval(v) for v in got.values()], stopping)
    return {name: Timing(iters=counts[name], samples=tuple(times[name]),
                         stopped=stopped) for name in calls}


def interleaved(calls: dict[str, Callable[[], Any]], *, stopping: Stopping,
                min_time: float,
                estimates: Callable[[Mapping[str, list[float]]], Sequence[Estimate]]
                ) -> tuple[dict[str, tuple[float, ...]], str]:
    """Per-call times of several callables, measured turn by turn.

    Each round times a batch of calls of every callable in turn (the same
    batch length for all), so slow drift in the machine's load hits every
    callable alike and cancels in their ratios. Rounds are taken until the
    ``estimates`` (e.g. the paired ratios) are within ``stopping.precision``
    or the time budget is spent.

    Args:
      calls: name -> a callable with no arguments (one dispatch each).
      stopping: the precision, time budget and bounds on the rounds.
      min_time: the target duration of one batch of the slowest callable.
      estimates: the intervals that must become narrow, from the samples.

    Returns:
      name -> per-call seconds, one entry per round; why sampling stopped.
    """
    for call in calls.values():
        block(call())  # compile and warm up
    slowest = max(_batch_time(call, 1) for call in calls.values())
    batch = max(1, min(1000, math.ceil(min_time / max(slowest, 1e-9))))
    round_ = _rotating(list(calls), lambda name: _batch_time(
        calls[name], batch) / batch)
    times, stopped = sample_adaptively(round_, estimates, stopping)
    return {name: tuple(values) for name, values in times.items()}, stopped
def _batch_time(call: Callable[[], Any], batch: int) -> float:
    start = time.perf_counter()
    results = [call() for _ in range(batch)]
    block(results)
    return time.perf_counter() - start
