"""The benchmark's statistics on synthetic samples and synthetic clocks: bootstrap
intervals of medians and of paired median ratios, verdicts, adaptive stopping,
the rows that missed the precision target, the alpha-beta fit, CSV flattening
and the progress line's estimate of the time left. Nothing here times anything."""

import io
import itertools
import re

import numpy as np
import pytest

from collectives.bench._fit import fit_line
from collectives.bench._fit import fit_rows
from collectives.bench._fit import ring_vs_native
from collectives.bench._progress import Progress
from collectives.bench._progress import format_seconds
from collectives.bench._report import _flat
from collectives.bench._report import format_row
from collectives.bench._report import precision_lines
from collectives.bench._stats import Estimate
from collectives.bench._stats import Stopping
from collectives.bench._stats import median_interval
from collectives.bench._stats import median_ratio_interval
from collectives.bench._stats import sample_adaptively
from collectives.bench._stats import verdict
from collectives.hlo import bus_factor


def lognormal(seed, n, sigma=0.1):
    return np.random.default_rng(seed).lognormal(0.0, sigma, n)


def test_median_interval_holds_the_median_and_narrows_with_more_samples():
    few = median_interval(100 * lognormal(1, 20))
    many = median_interval(100 * lognormal(1, 2000))
    for est in (few, many):
        assert est.low < est.median < est.high
    assert 95 < many.low < 100 < many.high < 105  # the true median is 100
    assert many.half_width < few.half_width / 4
    assert median_interval([1.0, 5.0, 2.0]).median == 2.0


def test_the_bootstrap_is_seeded_so_the_same_samples_give_the_same_interval():
    data = lognormal(7, 50)
    assert median_interval(data) == median_interval(data)
    assert median_interval(data, seed=1) != median_interval(data, seed=2)


def test_paired_ratios_cancel_load_that_hits_both_programs():
    # Both programs slowed alike by a load that varies 10x from round to round:
    # each series alone is all over the place, the paired ratio is 1.05 +- 1 %.
    load = np.random.default_rng(3).uniform(1.0, 10.0, 60)
    noise = lognormal(4, 60, sigma=0.01)
    base = 100e-6 * load
    recipe = 1.05 * base * noise
    paired = median_ratio_interval(recipe, base)
    assert 1.04 < paired.low <= paired.median <= paired.high < 1.06
    assert paired.samples == 60
    # Pairing matters: the same samples with the pairs broken say far less.
    shuffled = median_ratio_interval(recipe, np.random.default_rng(5).permutation(base))
    assert shuffled.half_width > 10 * paired.half_width


def test_ratio_and_interval_input_errors():
    with pytest.raises(ValueError, match="3 numerators but 2 denominators"):
        median_ratio_interval([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="denominator: every sample must be positive"):
        median_ratio_interval([1, 2], [1, 0])
    with pytest.raises(ValueError, match="need at least one sample"):
        median_interval([])


@pytest.mark.parametrize(("low", "high", "target", "expected"), [
    (0.98, 1.02, 1.03, "met"),
    (0.98, 1.03, 1.03, "met"),         # touching the target from below
    (1.031, 1.06, 1.03, "not met"),
    (1.01, 1.05, 1.03, "inconclusive"),  # straddles
    (0.5, 2.0, None, None),            # no target, no verdict
])
def test_verdict(low, high, target, expected):
    est = Estimate(median=(low + high) / 2, low=low, high=high, samples=30)
    assert verdict(est, target) == expected


def test_one_sample_has_no_interval_so_no_verdict_either_way():
    est = median_interval([1.0])
    assert est.low == est.median == est.high == 1.0
    assert est.half_width == float("inf")
    assert verdict(est, 10.0) == "inconclusive"


def test_the_verdicts_on_synthetic_overhead_samples():
    base = 1e-4 * lognormal(10, 200, sigma=0.2)
    jitter = lognormal(11, 200, sigma=0.02)

    def judged(true_ratio, target):
        return verdict(median_ratio_interval(true_ratio * base * jitter, base), target)

    assert judged(1.00, 1.03) == "met"
    assert judged(1.10, 1.03) == "not met"
    assert judged(1.03, 1.03) == "inconclusive"


def synthetic_rounds(sigma, seed=0):
    """round_(): one sample of "a" and of "b" (b = 1.2 a), seeded."""
    rng = np.random.default_rng(seed)

    def round_():
        a = float(rng.lognormal(0, sigma))
        return {"a": a, "b": 1.2 * a * float(rng.lognormal(0, sigma / 10))}

    return round_


def ratio_estimates(got):
    return [median_ratio_interval(got["b"], got["a"])]


def ticking(step):
    """A synthetic clock advancing ``step`` seconds each time it is read."""
    ticks = itertools.count()
    return lambda: step * next(ticks)


def costing(round_, seconds):
    """``round_`` on a synthetic clock where each round takes ``seconds``."""
    now = [0.0]

    def timed_round():
        now[0] += seconds
        return round_()

    return timed_round, lambda: now[0]


def test_adaptive_sampling_stops_once_the_interval_is_narrow():
    stopping = Stopping(precision=0.01, budget=1e9, min_samples=5)
    got, why = sample_adaptively(synthetic_rounds(0.5), ratio_estimates, stopping,
                                 clock=ticking(0.0))
    assert why == "precision"
    n = len(got["a"])
    assert 5 < n < stopping.max_samples and len(got["b"]) == n
    assert ratio_estimates(got)[0].half_width <= 0.01
    # noisier pairs need more rounds for the same precision
    noisier, _ = sample_adaptively(synthetic_rounds(2.0), ratio_estimates, stopping,
                                   clock=ticking(0.0))
    assert len(noisier["a"]) > n


def test_adaptive_sampling_stops_when_the_budget_is_spent():
    # Each round takes 1 s of the synthetic clock; 30 s of budget.
    round_, clock = costing(synthetic_rounds(0.5), 1.0)
    stopping = Stopping(precision=1e-6, budget=30.0, min_samples=10)
    got, why = sample_adaptively(round_, ratio_estimates, stopping, clock=clock)
    assert (why, len(got["a"])) == ("budget", 30)
    got, why = sample_adaptively(synthetic_rounds(0.5), ratio_estimates,
                                 Stopping(precision=1e-6, budget=1e9, min_samples=3,
                                          max_samples=40), clock=ticking(0.0))
    assert (why, len(got["a"])) == ("max_samples", 40)


def test_adaptive_sampling_takes_the_minimum_even_with_no_budget():
    round_, clock = costing(synthetic_rounds(0.5), 1.0)
    got, why = sample_adaptively(round_, ratio_estimates,
                                 Stopping(precision=1e-6, budget=0.0, min_samples=7),
                                 clock=clock)
    assert (why, len(got["a"])) == ("budget", 7)


def test_same_samples_same_stop_same_verdict():
    def run():
        stopping = Stopping(precision=0.02, budget=1e9, min_samples=5)
        got, _ = sample_adaptively(synthetic_rounds(0.3, seed=9), ratio_estimates,
                                   stopping, clock=ticking(0.0))
        return len(got["a"]), verdict(ratio_estimates(got)[0], 1.5)

    assert run() == run() == (run()[0], "met")


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(precision=0.0), "--precision: expected a fraction above 0"),
    (dict(budget=-1.0), "--budget: expected seconds >= 0, got -1.0"),
    (dict(min_samples=5, max_samples=4), "min_samples (5) <= max_samples (4)"),
])
def test_stopping_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Stopping(**kwargs)


SIZES = [1 << k for k in range(10, 24, 2)]


def test_the_fit_recovers_alpha_and_beta_of_an_exact_line():
    fit = fit_line(SIZES, [120e-6 + 0.5e-9 * s for s in SIZES])
    assert fit.alpha == pytest.approx(120e-6) and fit.beta == pytest.approx(0.5e-9)
    assert fit.max_error < 1e-9
    assert fit.alpha_ci[0] <= fit.alpha <= fit.alpha_ci[1]


def test_the_fit_intervals_hold_the_truth_and_report_the_error():
    noise = lognormal(21, len(SIZES), sigma=0.05)
    times = [(120e-6 + 0.5e-9 * s) * e for s, e in zip(SIZES, noise, strict=True)]
    fit = fit_line(SIZES, times)
    assert fit.alpha_ci[0] < 120e-6 < fit.alpha_ci[1]
    assert fit.beta_ci[0] < 0.5e-9 < fit.beta_ci[1]
    assert 0.01 < fit.rms_error < 0.1
    fitted = [fit.alpha + fit.beta * s for s in SIZES]
    assert fit.errors == pytest.approx(
        [f / t - 1 for f, t in zip(fitted, times, strict=True)])
    # A curve that is not a line: the model's error says so.
    bent = fit_line(SIZES, [1e-4 + 1e-12 * s ** 1.5 for s in SIZES])
    assert bent.max_error > 0.3


def test_the_fit_needs_three_points():
    with pytest.raises(ValueError, match="fit: need at least 3"):
        fit_line([1, 2], [1.0, 2.0])


def synthetic_row(form, size, alpha_us, beta_ns, kind="all-reduce"):
    factor = 1.0 if form == "copy" else bus_factor(kind, 8)
    return {"collective": "psum", "kind": "copy" if form == "copy" else kind,
            "form": form, "size": size, "devices": 8,
            "time_us": alpha_us + beta_ns * 1e-3 * size * factor,
            "model_error": None}


def test_fit_rows_fits_each_form_and_compares_the_ring_with_the_native_form():
    rows = [synthetic_row(form, size, alpha, beta)
            for form, alpha, beta in (("shard_map", 100.0, 0.5), ("ring", 1400.0, 2.0),
                                      ("copy", 1.0, 0.1))
            for size in SIZES]
    rows.append(synthetic_row("jit", 1024, 100.0, 0.5))  # one size: not fitted
    fits = {f["form"]: f for f in fit_rows(rows)}
    assert set(fits) == {"shard_map", "ring", "copy"}
    assert fits["shard_map"]["alpha_us"] == pytest.approx(100.0)
    assert fits["shard_map"]["beta_ns_per_byte"] == pytest.approx(0.5)
    assert fits["shard_map"]["busbw_gbps"] == pytest.approx(2.0)
    assert all(abs(r["model_error"]) < 1e-9 for r in rows if r["form"] != "jit")
    assert rows[-1]["model_error"] is None
    (comparison,) = ring_vs_native(list(fits.values()))
    assert comparison["alpha_ratio"] == pytest.approx(14.0)
    assert comparison["beta_ratio"] == pytest.approx(4.0)


def test_csv_records_flatten_intervals_and_memory():
    row = {"form": "jit", "time_us": 2.0, "time_us_ci": [1.0, 3.0],
           "time_us_samples": [1.0, 2.0, 3.0],
           "memory": {"argument_bytes": 4, "output_bytes": 4, "temp_bytes": 0,
                      "alias_bytes": 0}}
    assert _flat(row) == {
        "form": "jit", "time_us": 2.0, "time_us_low": 1.0, "time_us_high": 3.0,
        "memory_argument_bytes": 4, "memory_output_bytes": 4,
        "memory_temp_bytes": 0, "memory_alias_bytes": 0}
    assert _flat({"memory": None})["memory_temp_bytes"] is None


def test_on_one_device_the_fit_uses_the_buffer_bytes():
    # bus factors are 0 on one device (nothing crosses a link)
    assert bus_factor("all-reduce", 1) == 0
    rows = [dict(synthetic_row("jit", size, 5.0, 0.0), devices=1,
                 time_us=5.0 + 0.25e-3 * size) for size in SIZES]
    (fit,) = fit_rows(rows)
    assert fit["beta_ns_per_byte"] == pytest.approx(0.25)
    assert fit["alpha_us"] == pytest.approx(5.0)


def table_row(time_us, low, high, **extra):
    return {"size": 1024, "count": 256, "type": "float32", "form": "jit",
            "iters": 100, "time_us": time_us, "time_us_ci": [low, high],
            "samples": 12, "algbw_gbps": 1.0, "busbw_gbps": 1.75,
            "copy_fraction": 0.5, "memory": None, "wrong": 0, **extra}


def test_the_table_marks_each_row_wider_than_the_precision_target():
    narrow, wide = table_row(100.0, 99.0, 101.0), table_row(100.0, 95.0, 106.0)
    assert "1.0%  " in format_row(narrow, 0.02)  # ±1 %: within ±2 %
    assert "5.5%* " in format_row(wide, 0.02)
    assert "5.5%* " not in format_row(wide, 0.06)
    # the mark keeps the columns: the same fields, split on blanks
    assert len(format_row(wide, 0.02).split()) == len(format_row(narrow).split())
    lines = precision_lines([narrow, wide, wide], 0.02, budget=1.0)
    assert "1 of 3 rows within ±2 % at 95 %; * marks the 2 others" in lines[0]
    assert "1 s budget per collective and size" in lines[1]
    assert "--budget" in lines[2]
    assert precision_lines([narrow], 0.02, budget=1.0) == [
        "# Precision            : every row within ±2 % at 95 %"]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_line_counts_rows_and_estimates_the_time_left():
    stream = io.StringIO()  # not a terminal: one line per update
    bar = Progress(stream, total=10, expected=40.0, clock=ticking(10.0))
    bar.begin("psum 1K")           # 10 s elapsed, no row done: from `expected`
    bar.advance(4)
    bar.begin("psum 4K")           # 20 s for 4 rows: 30 s for the 6 left
    bar.advance(6)
    bar.finish()
    assert stream.getvalue().splitlines() == [
        "# 0/10 rows | psum 1K | 0:10 elapsed, about 0:30 left",
        "# 4/10 rows | psum 4K | 0:20 elapsed, about 0:30 left",
        "# 10 rows in 0:30"]
    late = io.StringIO()
    Progress(late, total=3, expected=5.0, clock=ticking(10.0)).begin("x")
    assert late.getvalue().endswith("0:10 elapsed, time left unknown\n")
    assert (format_seconds(0.4), format_seconds(59.6), format_seconds(3600)) == (
        "0:00", "1:00", "1:00:00")


def test_on_a_terminal_the_line_is_rewritten_in_place_and_kept_off_the_table():
    screen = Terminal()  # stdout and stderr on the same terminal
    bar = Progress(screen, total=2, clock=ticking(1.0))
    assert bar.in_place
    bar.begin("a long label for the first row")
    bar.echo("row 1", screen)
    bar.advance(1)
    bar.begin("short")
    bar.advance(1)
    bar.finish()
    text = screen.getvalue()
    assert "\r# 0/2 rows | a long label" in text and "\r# 1/2 rows | short" in text
    # what the terminal shows: \r returns to the line's start, later text
    # overwrites earlier; the table line is whole, the progress line is gone
    shown = []
    for line in text.split("\n"):
        cells: list[str] = []
        for part in line.split("\r"):
            cells[:len(part)] = part
        shown.append("".join(cells).rstrip())
    assert shown == ["row 1", "# 2 rows in 0:04", ""]


def test_a_latency_below_the_noise_is_zero_never_negative():
    # A copy's time is all bandwidth: with noise, a fit of both parameters
    # puts the latency below 0. It is 0, its interval from 0 to where that
    # fit reached, and the time per byte is fitted alone.
    from collectives.bench._fit import fit_line

    sizes = [1e3, 1e4, 1e5, 1e6]
    noise = [0.7, 0.9, 1.1, 1.0]  # (small sizes measured fast: alpha < 0)
    times = [0.3e-9 * s * k for s, k in zip(sizes, noise, strict=True)]
    design = np.stack([1 / np.array(times), np.array(sizes) / np.array(times)], 1)
    unconstrained, *_ = np.linalg.lstsq(design, np.ones(4), rcond=None)
    assert unconstrained[0] < 0 < unconstrained[1]
    fit = fit_line(sizes, times)
    assert fit.alpha == 0 and fit.alpha_ci[0] == 0 < fit.alpha_ci[1]
    assert fit.beta_ci[0] <= fit.beta <= fit.beta_ci[1]
    assert 0.25e-9 < fit.beta < 0.35e-9
    # errors are those of the line through the origin
    fitted = [fit.beta * s for s in sizes]
    assert np.allclose(fit.errors, [f / t - 1 for f, t in zip(fitted, times,
                                                               strict=True)])
