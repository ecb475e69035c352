"""The alpha-beta cost model fitted to a sweep: ``t = alpha + beta * bytes``.

``bytes`` is a row's size ``S`` times nccl-tests' bus factor (the bytes a ring
would move per device: ``2(n-1)/n * S`` for an all-reduce...), so ``1 / beta``
is the asymptotic bus bandwidth and ``alpha`` the latency of one collective
(on one device, where every factor is 0, ``bytes`` is ``S`` itself).
The fit is least squares on *relative* error (weights ``1 / t**2``), since the
times of a sweep span orders of magnitude and each row matters alike; the
intervals are the usual 95 % Student-t intervals from the residuals, so a
model that does not fit gets wide intervals, and the model's error per row is
``fitted / measured - 1``. A latency and a time per byte are never
negative: where the fit of both gives one below 0 (a latency smaller than
the timing's noise), it is 0 and the other is fitted alone, and no interval
reaches below 0.

Examples:
  >>> from collectives.bench._fit import fit_line
  >>> sizes = [1e3, 1e4, 1e5, 1e6]
  >>> fit = fit_line(sizes, [110e-6 + 0.9e-9 * s for s in sizes])
  >>> round(fit.alpha * 1e6, 3), round(fit.beta * 1e9, 3)  # us, ns per byte
  (110.0, 0.9)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from collectives.hlo import bus_factor


@dataclasses.dataclass(frozen=True)
class Fit:
    """``t = alpha + beta * x`` with 95 % intervals.

    Attributes:
      alpha, alpha_ci: seconds, and its interval (low, high).
      beta, beta_ci: seconds per byte, and its interval.
      errors: ``fitted / measured - 1`` per point, in the order given.
    """

    alpha: float
    alpha_ci: tuple[float, float]
    beta: float
    beta_ci: tuple[float, float]
    errors: tuple[float, ...]

    @property
    def rms_error(self) -> float:
        return float(np.sqrt(np.mean(np.square(self.errors))))

    @property
    def max_error(self) -> float:
        return float(np.max(np.abs(self.errors)))


def _t_quantile(dof: int) -> float:
    """The two-sided 95 % Student-t quantile."""
    # start-up time: scipy.stats takes seconds to import (scipy comes with jax)
    from scipy import stats

    return float(stats.t.ppf(0.975, dof))


def fit_line(x: Sequence[float], t: Sequence[float]) -> Fit:
    """Least squares on relative error of ``t = alpha + beta * x``.

    Raises:
      ValueError: fewer than 3 points (no interval), or a time that is not
        positive.
    """
    x_arr = np.asarray(x, dtype=np.float64)
    t_arr = np.asarray(t, dtype=np.float64)
    if x_arr.size < 3 or x_arr.shape != t_arr.shape:
        raise ValueError(f"fit: need at least 3 (size, time) points of equal count, "
                         f"got {x_arr.size} sizes and {t_arr.size} times. Fix: sweep "
                         "3 sizes or more (e.g. -b 1K -e 1M -f 4).")
    if np.any(t_arr <= 0):
        raise ValueError("fit: every time must be positive.")
    design = np.stack([1 / t_arr, x_arr / t_arr], axis=1)  # rows / t: relative error
    coef, half, residuals = _least_squares(design)
    low, high = np.maximum(coef - half, 0), np.maximum(coef + half, 0)
    value = coef.copy()
    if np.any(coef < 0):
        # The parameter below 0 is 0 (its interval from 0 to where the fit of
        # both reached); the other is fitted alone.
        free = int(np.argmax(coef))
        value = np.zeros(2)
        one, one_half, residuals = _least_squares(design[:, [free]])
        value[free] = max(float(one[0]), 0.0)
        low[free] = max(float(one[0] - one_half[0]), 0.0)
        high[free] = max(float(one[0] + one_half[0]), 0.0)
    return Fit(alpha=float(value[0]), alpha_ci=(float(low[0]), float(high[0])),
               beta=float(value[1]), beta_ci=(float(low[1]), float(high[1])),
               errors=tuple(float(e) for e in residuals))


def _least_squares(design: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``design @ coef ~ 1``: the coefficients, their 95 % half-widths and the
    residuals."""
    ones = np.ones(design.shape[0])
    coef, *_ = np.linalg.lstsq(design, ones, rcond=None)
    residuals = design @ coef - ones
    dof = design.shape[0] - design.shape[1]
    scale = float(residuals @ residuals) / dof
    cov = scale * np.linalg.pinv(design.T @ design)
    half = _t_quantile(dof) * np.sqrt(np.maximum(np.diag(cov), 0))
    return coef, half, residuals


def fit_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One fit per collective and form of a sweep's rows (3 sizes or more).

    Each row fitted gets ``model_error`` (``fitted / measured - 1``); rows of a
    collective and form with fewer than 3 sizes keep ``None``.
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["collective"], row["form"]), []).append(row)
    fits = []
    for (name, form), mine in groups.items():
        if len({row["size"] for row in mine}) < 3:
            continue
        # On one device the bus factors are 0 (nothing crosses a link): fit
        # against the buffer's bytes instead.
        factors = [1.0 if form == "copy" else
                   bus_factor(row["kind"], row["devices"]) or 1.0 for row in mine]
        x = [row["size"] * f for row, f in zip(mine, factors, strict=True)]
        fit = fit_line(x, [row["time_us"] * 1e-6 for row in mine])
        for row, error in zip(mine, fit.errors, strict=True):
            row["model_error"] = error
        fits.append({
            "collective": name, "form": form, "kind": mine[0]["kind"],
            "points": len(mine),
            "alpha_us": fit.alpha * 1e6,
            "alpha_us_ci": [v * 1e6 for v in fit.alpha_ci],
            "beta_ns_per_byte": fit.beta * 1e9,
            "beta_ns_per_byte_ci": [v * 1e9 for v in fit.beta_ci],
            "busbw_gbps": 1 / (fit.beta * 1e9) if fit.beta > 0 else None,
            "rms_error": fit.rms_error, "max_error": fit.max_error,
        })
    return fits


def ring_vs_native(fits: Sequence[Mapping[str, Any]], native: str = "shard_map"
                   ) -> list[dict[str, Any]]:
    """For each collective with a ring form: the ring's alpha and beta over the
    native collective's (its ``native`` form), from the fits."""
    by = {(f["collective"], f["form"]): f for f in fits}
    out = []
    for (name, form), ring in by.items():
        base = by.get((name, native))
        if form != "ring" or base is None:
            continue
        out.append({
            "collective": name, "native_form": native,
            "alpha_ratio": _ratio(ring["alpha_us"], base["alpha_us"]),
            "beta_ratio": _ratio(ring["beta_ns_per_byte"], base["beta_ns_per_byte"]),
        })
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 and a > 0 else None
