"""The size sweep: one row per collective, form and size, the copy as the limit."""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Sequence
from typing import Any
from typing import TextIO

import jax
import numpy as np

from collectives._args import counts
from collectives._args import memory_bytes
from collectives._arrays import narrowed
from collectives._devices import make_mesh
from collectives.bench import _cases
from collectives.bench import _report
from collectives.bench._cases import BENCH_FORMS
from collectives.bench._cases import DEFAULT_COLLECTIVES
from collectives.bench._cases import KNOWN_FORMS
from collectives.bench._fit import fit_rows
from collectives.bench._fit import ring_vs_native
from collectives.bench._progress import Progress
from collectives.bench._schema import SCHEMA_ID
from collectives.bench._stats import CONFIDENCE
from collectives.bench._stats import Stopping
from collectives.bench._stats import median_ratio_interval
from collectives.bench._timing import Timing
from collectives.bench._timing import measure
from collectives.hlo import bus_factor

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from ``8``, ``1K``, ``64M`` or ``1G`` (powers of 1024, as nccl-tests).

    Raises:
      ValueError: the text is not a positive size.
    """
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", str(text), re.IGNORECASE)
    if not match or int(match.group(1)) < 1:
        raise ValueError(
            f"size: expected a positive number of bytes with an optional K, M or G "
            f"suffix (e.g. 8, 1K, 64M), got {text!r}.")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def format_size(size: int) -> str:
    """The shortest text :func:`parse_size` reads back as ``size``: ``64M``,
    ``1K``, ``1536``."""
    for suffix in ("G", "M", "K"):
        if size >= _UNITS[suffix] and size % _UNITS[suffix] == 0:
            return f"{size // _UNITS[suffix]}{suffix}"
    return str(size)


def size_sweep(begin: int, end: int, factor: float) -> list[int]:
    """``begin, begin*factor, ...`` up to ``end`` (nccl-tests' ``-b -e -f``)."""
    if begin > end:
        raise ValueError(f"-b {begin} is larger than -e {end}. Fix: swap them.")
    if factor <= 1 and begin != end:
        raise ValueError(f"-f {factor}: the step factor must be above 1.")
    sizes, size = [], float(begin)
    while size <= end:
        sizes.append(int(size))
        if factor <= 1:
            break
        size *= factor
    return sizes


def link_factor(kind: str, n: int) -> float:
    """nccl-tests' bus factor, except on one device, where nothing crosses a
    link and every factor is 0 (the permute's is 1 for any ``n`` otherwise)."""
    return bus_factor(kind, n) if n > 1 else 0.0


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    devices = jax.devices()
    return {
        "backend": jax.default_backend(), "device_kind": devices[0].device_kind,
        "devices": len(devices), "simulated": jax.default_backend() == "cpu",
        "jax": jax.__version__, "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }


def _row(case: _cases.Case, form: str, timing: Timing, wrong: int,
         copy: Timing | None, memory: dict[str, int] | None) -> dict[str, Any]:
    """One table row; ``copy`` is the same-run copy's timing (None for the copy
    row itself), paired sample by sample with this form's."""
    est = timing.interval
    factor = 1.0 if form == "copy" else link_factor(case.kind, case.axes.size)
    alg = est.scaled(case.size / 1e9)  # GB/s from seconds
    if copy is None:
        fraction, fraction_ci = 1.0, [1.0, 1.0]
    else:  # busbw / copy bw = factor * t_copy / t_form, per round
        ratio = median_ratio_interval(copy.samples, timing.samples)
        fraction = factor * ratio.median
        fraction_ci = [factor * ratio.low, factor * ratio.high]
    return {
        "collective": case.collective,
        "kind": "copy" if form == "copy" else case.kind, "form": form,
        "size": case.size, "count": case.count, "type": case.dtype,
        "devices": case.axes.size, "iters": timing.iters,
        "time_us": est.median * 1e6, "time_us_ci": [est.low * 1e6, est.high * 1e6],
        "time_us_samples": [t * 1e6 for t in timing.samples],
        "samples": len(timing.samples), "stopped": timing.stopped,
        "algbw_gbps": alg.median, "busbw_gbps": alg.median * factor,
        "busbw_gbps_ci": [alg.low * factor, alg.high * factor],
        "copy_fraction": fraction, "copy_fraction_ci": fraction_ci,
        "wrong": wrong, "memory": memory, "model_error": None,
    }


def dtype_name_of(dtype: Any) -> str:
    """The name of the dtype every buffer is made of.

    Raises:
      ValueError: ``dtype`` is no dtype, or a 64-bit one JAX would compute in
        its 32-bit twin (``jax_enable_x64`` off): a row would be labelled
        with a type it never ran.
    """
    try:
        wanted = np.dtype(dtype)
    except TypeError:
        raise ValueError(
            f"--dtype: {dtype!r} is not a dtype; use a NumPy name such as "
            "float32, bfloat16 or int32.") from None
    twin = narrowed(wanted)
    if twin:
        raise ValueError(
            f"--dtype {wanted.name}: computed as {twin} while 64-bit types are "
            "off, and its rows would say otherwise. Fix: --x64 (in Python, "
            "jax.config.update('jax_enable_x64', True) before any JAX "
            f"operation), or {twin}.")
    return wanted.name


def _names(given: str | Sequence[str]) -> list[str]:
    """A name alone or a list of names, as a list (a string is one name)."""
    return [given] if isinstance(given, str) else list(given)


def checked_sizes(sizes: Sequence[int], n_devices: int) -> list[int]:
    """``sizes`` as a list of byte counts a device, checked before any work.

    Raises:
      TypeError: ``sizes`` is not a list of whole numbers.
      ValueError: it is empty, a size is below 1 byte, or the largest size's
        buffers (an input and a result on every device, at least) would not
        fit this machine's memory (``n_devices``: those of this process).
    """
    sizes = counts(sizes, label="sizes", unit="bytes", each="buffer size",
                   fix="Fix: e.g. sizes=[1024, 65536], sizes of 1 byte or more "
                   "(bench.parse_size('64K') reads a size's text).")
    need, have = 2 * max(sizes) * n_devices, memory_bytes()
    if need > have:
        raise ValueError(
            f"sizes: {format_size(max(sizes))} a device over {n_devices} devices "
            f"needs {need / 2**30:,.0f} GiB at least (an input and a result); "
            f"this machine has {have / 2**30:,.0f} GiB. Fix: a smaller size "
            "(-e on the command line).")
    return sizes


def _check_names(collectives: Sequence[str], forms: Sequence[str]) -> None:
    for form in forms:
        if form not in KNOWN_FORMS:
            raise ValueError(f"--forms: unknown form {form!r}; choose from "
                             f"{', '.join(KNOWN_FORMS)}.")
    for name in collectives:
        if name not in _cases.KIND:
            raise ValueError(f"--collectives: unknown collective {name!r}; choose "
                             f"from {', '.join(_cases.KIND)}.")


def run(collectives: Sequence[str] = DEFAULT_COLLECTIVES,
        forms: Sequence[str] = BENCH_FORMS, *, dtype: Any = "float32",
        sizes: Sequence[int] = (1024,), samples: int = 5, warmup: int = 1,
        iters: int | None = None, min_time: float = 0.01,
        precision: float = 0.02, budget: float = 2.0, max_samples: int = 200,
        memory: bool = True, out: TextIO | None = None,
        progress: TextIO | None = None) -> dict[str, Any]:
    """Run the sweep on a 1-D mesh over every device; return the JSON document.

    Args:
      collectives: recipe names (``psum``, ``all_gather``, ...); one name
        alone is one collective.
      forms: among ``pmap``, ``shard_map``, ``jit``, ``ring``.
      dtype: element type of every buffer (a 64-bit type needs
        ``jax_enable_x64``).
      sizes: target sizes ``S`` in bytes a device, whole numbers of 1 or more
        (rounded to whole elements per device).
      samples: timed calls per row at least (the median and its interval
        are over them); more are taken until every row's interval is within
        ``precision`` or ``budget`` runs out.
      warmup: untimed calls per row after calibration.
      iters: collectives per call; ``None`` picks enough for ``min_time``.
      min_time: target seconds per timed call when ``iters`` is ``None``.
      precision: the target half-width of each median's 95 % interval, as a
        fraction of the median (0.02: ±2 %).
      budget: seconds of timing per collective and size; the first
        ``samples`` rounds are taken even past it.
      max_samples: timed calls per row at most.
      memory: add each form's per-device memory (``memory_analysis()``); this
        compiles each form once more per size.
      out: where the table is printed as rows complete (``None``: nowhere).
      progress: where the progress line goes (``None``: nowhere): rows done,
        the rows being measured, elapsed time and an estimate of the time
        left; rewritten in place when the stream is a terminal.

    Returns:
      A dict matching :data:`SCHEMA`, with the alpha-beta fit of every
      collective and form swept over 3 sizes or more.

    Raises:
      ValueError: an unknown collective or form, a dtype JAX would narrow,
        a size below 1 byte or beyond this machine's memory, or bad sampling
        settings.
      TypeError: ``sizes`` is not a list of whole numbers.

    Examples:
      >>> from collectives import bench
      >>> doc = bench.run(["psum"], ["shard_map"], sizes=[64], samples=3,
      ...                 warmup=0, iters=2, budget=0)
      >>> [(r["form"], r["size"], r["count"], r["wrong"]) for r in doc["results"]]
      [('copy', 64, 16, 0), ('shard_map', 64, 16, 0)]
      >>> bench.schema_errors(doc)
      []
    """
    collectives, forms = _names(collectives), _names(forms)
    _check_names(collectives, forms)
    dtype_name = dtype_name_of(dtype)
    sizes = checked_sizes(sizes, jax.local_device_count())  # its buffers
    axes = _cases.RECIPES["psum"].axes(make_mesh((jax.device_count(),), "i"))
    stopping = Stopping(precision=precision, budget=budget, min_samples=samples,
                        max_samples=max(samples, max_samples))
    timing_args = dict(stopping=stopping, warmup=warmup, iters=iters,
                       min_time=min_time)
    machine = machine_info()

    planned = {(name, target): [_cases.plan(name, form, axes, target, dtype_name)
                                for form in forms]
               for name in collectives for target in sizes}
    timed = {key: [case for case in plans if not isinstance(case, str)]
             for key, plans in planned.items()}
    echo = _Echo(out, progress, timed, budget)
    for line in _heading(machine, dtype_name, stopping, warmup=warmup,
                         iters=iters, min_time=min_time, n_devices=axes.size):
        echo.line(line)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for name in collectives:
        skipped += _collective_header(name, forms, planned[name, sizes[0]],
                                      axes.size, echo)
        rows += _collective_rows(name, [timed[name, target] for target in sizes],
                                 timing_args, memory, precision, echo)
        averages = _report.averages([r for r in rows if r["collective"] == name])
        echo.line("# Avg bus bandwidth (GB/s): " + ", ".join(
            f"{form} {bw:.3f}" for form, bw in averages.get(name, {}).items()))
    fits = fit_rows(rows)
    comparisons = ring_vs_native(fits)
    summary = _summary(rows, fits, comparisons, precision, budget, echo)
    echo.finish()
    return {
        "schema": SCHEMA_ID, "machine": machine,
        "settings": settings(collectives, forms, dtype_name, sizes, stopping,
                             warmup=warmup, iters=iters, min_time=min_time),
        "results": rows, "skipped": skipped, "fit": fits,
        "ring_vs_native": comparisons, "summary": summary,
    }


def _heading(machine: dict[str, Any], dtype_name: str, stopping: Stopping, *,
             warmup: int, iters: int | None, min_time: float,
             n_devices: int) -> list[str]:
    """The sweep's opening lines: what runs where, and how it is sampled."""
    lines = [
        f"# collectives bench: {machine['devices']} {machine['backend']} devices"
        f"{' (simulated)' if machine['simulated'] else ''}, JAX {machine['jax']}, "
        f"{dtype_name}, {stopping.min_samples} to {stopping.max_samples} samples "
        f"(until ±{100 * stopping.precision:g} % at 95 % or {stopping.budget:g} s), "
        f"warm-up {warmup}, iters "
        f"{iters or f'auto (>= {1000 * min_time:g} ms per call)'}"]
    if n_devices == 1:
        lines.append(
            "# note: on 1 device every collective is the identity and XLA may "
            "remove it (and the loop\n#   of iters around it): times then measure "
            "dispatch, not a link. Use 2 or more devices.")
    return lines


class _Echo:
    """Where the table goes as rows complete (``out``), and the progress line
    (``progress``) kept out of its way; ``None`` for either: nowhere."""

    def __init__(self, out: TextIO | None, progress: TextIO | None,
                 timed: dict[Any, list[_cases.Case]], budget: float):
        self._out = out
        # the copy's row and one per form, for each collective and size timed
        total = sum(1 + len(cases) for cases in timed.values() if cases)
        self._bar = None if progress is None else Progress(
            progress, total,
            expected=budget * sum(1 for cases in timed.values() if cases))

    def line(self, line: str) -> None:
        if self._out is None:
            return
        if self._bar is None:
            print(line, file=self._out, flush=True)
        else:
            self._bar.echo(line, self._out)

    def begin(self, label: str) -> None:
        if self._bar is not None:
            self._bar.begin(label)

    def advance(self, rows: int) -> None:
        if self._bar is not None:
            self._bar.advance(rows)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.finish()


def _collective_header(name: str, forms: Sequence[str],
                       plans: list[_cases.Case | str], n_devices: int,
                       echo: _Echo) -> list[dict[str, str]]:
    """Print one collective's heading and its skipped forms; return those."""
    kind = _cases.KIND[name]
    echo.line(f"#\n# {name} ({kind}): busbw = algbw * "
              f"{link_factor(kind, n_devices):.4g} on {n_devices} devices")
    for line in _report.header_lines():
        echo.line(line)
    skipped = []
    for form, reason in zip(forms, plans, strict=True):
        if isinstance(reason, str):
            skipped.append({"collective": name, "form": form, "reason": reason})
            echo.line(f"#   {form}: skipped, {reason}")
    return skipped


def _collective_rows(name: str, cases_by_size: list[list[_cases.Case]],
                     timing_args: dict[str, Any], memory: bool, precision: float,
                     echo: _Echo) -> list[dict[str, Any]]:
    """Time one collective at every size, printing each row as it completes."""
    rows: list[dict[str, Any]] = []
    counts: dict[str, tuple[int, int]] = {}
    for cases in cases_by_size:
        if not cases:
            continue
        echo.begin(f"{name} {format_size(cases[0].size)}")
        new_rows, counts = _one_size(cases, timing_args, counts, memory)
        for row in new_rows:
            rows.append(row)
            echo.line(_report.format_row(row, precision))
        echo.advance(len(new_rows))
    return rows


def _summary(rows: list[dict[str, Any]], fits: Any, comparisons: Any,
             precision: float, budget: float, echo: _Echo) -> dict[str, Any]:
    """Print the fits and the closing lines; return the ``summary`` object."""
    if fits:
        for line in _report.format_fits(fits, comparisons):
            echo.line(line)
    measured = [r for r in rows if r["form"] != "copy"]
    wrong = sum(r["wrong"] for r in rows)
    avg = sum(r["busbw_gbps"] for r in measured) / len(measured) if measured else None
    echo.line("#")
    for line in _report.precision_lines(rows, precision, budget):
        echo.line(line)
    echo.line(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    echo.line(f"# Avg bus bandwidth    : {avg or 0:.4f} GB/s (every row but copy)")
    return {"avg_busbw_gbps": avg, "wrong": wrong,
            "by_collective": _report.averages(rows)}


def settings(collectives: Sequence[str], forms: Sequence[str], dtype: str,
             sizes: Sequence[int], stopping: Stopping, *, warmup: int,
             iters: int | None, min_time: float) -> dict[str, Any]:
    """The ``settings`` object of the JSON document."""
    return {"collectives": list(collectives), "forms": list(forms), "dtype": dtype,
            "sizes": [int(s) for s in sizes], "samples": stopping.min_samples,
            "max_samples": stopping.max_samples, "precision": stopping.precision,
            "budget_s": stopping.budget, "confidence": CONFIDENCE,
            "warmup": warmup, "iters": iters, "min_time_s": min_time}


def _one_size(cases: list[_cases.Case], timing_args: dict[str, Any],
              counts: dict[str, tuple[int, int]], memory: bool
              ) -> tuple[list[dict[str, Any]], dict[str, tuple[int, int]]]:
    """The copy row and one row per form for one collective at one size.

    ``counts`` maps each form to the (iters, size) calibrated at the previous
    size; calibration starts from there, scaled to this size.
    """
    first = cases[0]
    copy_call, copy_x, _ = _cases.bind_copy(first.axes, first.size, first.dtype)
    calls = {"copy": copy_call}
    wrong = {"copy": _cases.count_wrong(copy_call(1), copy_x, 0.0, 0.0)}
    inputs: dict[tuple[int, ...], np.ndarray] = {}
    memories: dict[str, dict[str, int] | None] = {}
    for case in cases:
        if case.shape not in inputs:
            inputs[case.shape] = _cases.make_input(case.shape, case.dtype)
        x = inputs[case.shape]
        calls[case.form], expected = _cases.bind(case, x)
        wrong[case.form] = _cases.check(case, calls[case.form], expected, x)
        if memory:
            memories[case.form] = _cases.memory(case, x)
    guess = {form: max(1, round(n * size / first.size))
             for form, (n, size) in counts.items()}
    # The copy and every form are timed turn by turn (see measure).
    timings = measure(calls, **timing_args, guess=guess)
    copy_row = _row(first, "copy", timings["copy"], wrong["copy"], None, None)
    rows = [copy_row] + [
        _row(case, case.form, timings[case.form], wrong[case.form],
             timings["copy"], memories.get(case.form)) for case in cases]
    return rows, {form: (t.iters, first.size) for form, t in timings.items()}
