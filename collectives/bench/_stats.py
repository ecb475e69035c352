"""Statistics behind the benchmark's verdicts: bootstrap intervals of medians and
of median ratios, the verdict against a target, and adaptive sampling.

Timings on a shared machine are skewed and heavy-tailed, so every figure is a
median with a 95 % percentile-bootstrap interval. Ratios come from *paired*
samples (the two programs timed turn by turn in the same round), so a burst of
load that slows both cancels in the pair's ratio. The bootstrap is seeded:
the same samples always give the same interval, hence the same verdict.

Examples:
  >>> from collectives.bench._stats import median_ratio_interval, verdict
  >>> est = median_ratio_interval([1.0, 1.1, 0.9, 1.0, 1.05], [1.0] * 5)
  >>> round(est.median, 3), est.low <= est.median <= est.high
  (1.0, True)
  >>> verdict(est, target=2.0), verdict(est, target=0.5), verdict(est, target=1.0)
  ('met', 'not met', 'inconclusive')
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0

MET, NOT_MET, INCONCLUSIVE = "met", "not met", "inconclusive"
VERDICTS = (MET, NOT_MET, INCONCLUSIVE)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A median and its confidence interval.

    Attributes:
      median: the sample median (of the values, or of the paired ratios).
      low, high: the bounds of the interval (equal to the median for one sample).
      samples: how many values (or pairs) it rests on.
    """

    median: float
    low: float
    high: float
    samples: int

    @property
    def half_width(self) -> float:
        """Half the interval's width over the median (0.02 = ±2 %); inf for one
        sample (no interval) or a median of 0."""
        if self.samples < 2 or self.median <= 0:
            return float("inf")
        return (self.high - self.low) / 2 / self.median

    def scaled(self, factor: float) -> Estimate:
        """The estimate of ``factor / value`` (e.g. a bandwidth from a time)."""
        return Estimate(factor / self.median, factor / self.high,
                        factor / self.low, self.samples)


def median_interval(values: Sequence[float], *, confidence: float = CONFIDENCE,
                    resamples: int = RESAMPLES, seed: int = SEED) -> Estimate:
    """The median of ``values`` with a percentile-bootstrap interval.

    Raises:
      ValueError: ``values`` is empty.
    """
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("values: need at least one sample, got none.")
    median = float(np.median(data))
    if data.size == 1:
        return Estimate(median, median, median, 1)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, data.size, size=(resamples, data.size))
    medians = np.median(data[picks], axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(medians, [tail, 100 - tail])
    return Estimate(median, float(min(low, median)), float(max(high, median)),
                    int(data.size))


def median_ratio_interval(numerator: Sequence[float], denominator: Sequence[float],
                          **kwargs: Any) -> Estimate:
    """The median of the paired ratios ``numerator[i] / denominator[i]``, with a
    bootstrap interval that resamples the pairs (see :func:`median_interval`).

    Raises:
      ValueError: the sequences differ in length, are empty, or a denominator
        is not positive.
    """
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)
    if num.shape != den.shape:
        raise ValueError(f"paired samples: {num.size} numerators but {den.size} "
                         "denominators; time both in the same rounds.")
    if np.any(den <= 0):
        raise ValueError("denominator: every sample must be positive.")
    return median_interval(num / den, **kwargs)


def verdict(estimate: Estimate, target: float | None) -> str | None:
    """``met`` if the whole interval is at or below ``target``, ``not met`` if it
    is above, ``inconclusive`` if it straddles the target; None without one."""
    if target is None:
        return None
    if estimate.samples < 2:
        return INCONCLUSIVE
    if estimate.high <= target:
        return MET
    if estimate.low > target:
        return NOT_MET
    return INCONCLUSIVE


@dataclasses.dataclass(frozen=True)
class Stopping:
    """When adaptive sampling stops.

    Attributes:
      precision: stop once every interval's half-width is at most this
        fraction of its median (0.02 = ±2 %).
      budget: or once this many seconds have passed (the first
        ``min_samples`` rounds are always taken).
      min_samples: rounds taken before the intervals are looked at.
      max_samples: rounds never exceeded.
    """

    precision: float = 0.02
    budget: float = 5.0
    min_samples: int = 10
    max_samples: int = 1000

    def __post_init__(self):
        if not self.precision > 0:
            raise ValueError(f"--precision: expected a fraction above 0 (e.g. 0.02 "
                             f"for ±2 %), got {self.precision}.")
        if self.budget < 0:
            raise ValueError(f"--budget: expected seconds >= 0, got {self.budget}.")
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError(
                f"samples: expected 1 <= min_samples ({self.min_samples}) <= "
                f"max_samples ({self.max_samples}).")


def sample_adaptively(round_: Callable[[], Mapping[str, float]],
                      estimates: Callable[[Mapping[str, list[float]]],
                                          Sequence[Estimate]],
                      stopping: Stopping, *,
                      clock: Callable[[], float] = time.perf_counter
                      ) -> tuple[dict[str, list[float]], str]:
    """Take rounds of samples until the intervals are narrow or time runs out.

    Args:
      round_: takes one round: one sample of each program, timed turn by turn;
        returns name -> sample.
      estimates: the intervals that must become narrow, from the samples so far.
      stopping: the precision, time budget and sample bounds.
      clock: seconds, for the budget (tests pass a synthetic clock).

    Returns:
      name -> samples, and why sampling stopped: ``precision``, ``budget`` or
      ``max_samples``.
    """
    start = clock()
    samples: dict[str, list[float]] = {}
    check_at = stopping.min_samples
    for taken in range(1, stopping.max_samples + 1):
        for name, value in round_().items():
            samples.setdefault(name, []).append(value)
        if taken < stopping.min_samples:
            continue
        if taken >= check_at:  # bootstraps cost time: look every ~12 % more rounds
            if all(e.half_width <= stopping.precision for e in estimates(samples)):
                return samples, "precision"
            check_at = taken + max(1, taken // 8)
        if clock() - start >= stopping.budget:
            return samples, "budget"
    return samples, "max_samples"
