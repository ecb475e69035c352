"""The ``bench`` command line: its flags, the sweep or the overhead ratios, the
files it writes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any
from typing import TextIO

import jax

from collectives import _args
from collectives._devices import make_mesh
from collectives.bench import _cases
from collectives.bench import _report
from collectives.bench._cases import BENCH_FORMS
from collectives.bench._cases import DEFAULT_COLLECTIVES
from collectives.bench._overhead import OVERHEAD_COLLECTIVES
from collectives.bench._overhead import RATIOS
from collectives.bench._overhead import run_overhead
from collectives.bench._progress import Progress
from collectives.bench._schema import SCHEMA_ID
from collectives.bench._stats import Stopping
from collectives.bench._sweep import dtype_name_of
from collectives.bench._sweep import machine_info
from collectives.bench._sweep import parse_size
from collectives.bench._sweep import run
from collectives.bench._sweep import settings
from collectives.bench._sweep import size_sweep

SWEEP_SAMPLES, SWEEP_BUDGET = 5, 1.0
"""Rounds at least, and timing seconds per collective and size, of the sweep.
The default sweep (5 collectives at 7 sizes, 1K to 4M) times 35 collectives and
sizes: about 70 s on 8 simulated devices on 2 cores, half of it compiling."""
OVERHEAD_SAMPLES, OVERHEAD_BUDGET = 10, 10.0
"""Rounds at least, and timing seconds per collective, of ``--overhead``."""


_POSITIVE = _args.real("a positive number", above=0)
_SECONDS = _args.real("seconds, 0 or more", low=0)



_INT32_MAX = 2**31 - 1
_MANY = 1_000_000
"""More untimed calls or timed rounds than this would run for days."""

def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` flags, named after nccl-tests' where they exist."""
    parser.add_argument(
        "-c", "--collectives", nargs="+", metavar="NAME",
        help=f"collectives to time (default: {' '.join(DEFAULT_COLLECTIVES)}; also "
        "pmean, pmax, pmin, all_gather_stacked; with --overhead: every core "
        "recipe)")
    parser.add_argument(
        "--forms", nargs="+", default=list(BENCH_FORMS), metavar="FORM",
        help=f"forms to time (default: {' '.join(BENCH_FORMS)}; ring = the ring "
        "built from ppermute, where one exists; kernel = the Pallas remote-DMA "
        "kernel, timed on a TPU only)")
    parser.add_argument("-d", "--dtype", default="float32", type=_args.dtype,
                        help="element type (default: %(default)s)")
    parser.add_argument("-b", "--minbytes", type=_size_arg, default=parse_size("1K"),
                        metavar="SIZE", help="smallest size S (default: 1K)")
    parser.add_argument("-e", "--maxbytes", type=_size_arg, default=parse_size("4M"),
                        metavar="SIZE", help="largest size S (default: 4M)")
    parser.add_argument("-f", "--stepfactor", default=4.0, metavar="F",
                        type=_args.real("a factor above 1", above=1, fix="e.g. -f 4"),
                        help="multiply the size by F each step (default: 4)")
    parser.add_argument("-n", "--iters", default=None,
                        type=_args.whole(
                            f"a count from 1 to {_INT32_MAX} (the timed loop counts "
                            "in int32)", low=1, high=_INT32_MAX),
                        metavar="N",
                        help="collectives inside one timed call (default: enough "
                        "for --min-time)")
    parser.add_argument("-w", "--warmup", default=1, metavar="N",
                        type=_args.whole(f"a count from 0 to {_MANY:,}", low=0,
                                         high=_MANY),
                        help="untimed calls before timing (default: 1)")
    parser.add_argument("-r", "--samples", default=None,
                        type=_args.whole(f"a count from 1 to {_MANY:,}", low=1,
                                         high=_MANY),
                        metavar="N",
                        help="timed rounds at least; more are taken until every "
                        "interval meets --precision or --budget runs out "
                        f"(default: {SWEEP_SAMPLES}; with --overhead "
                        f"{OVERHEAD_SAMPLES})")
    parser.add_argument("--precision", type=_POSITIVE, default=0.02, metavar="FRACTION",
                        help="target half-width of each 95%% interval over its "
                        "median (default: 0.02, i.e. ±2%%)")
    parser.add_argument("--budget", type=_SECONDS, default=None, metavar="SECONDS",
                        help="timing seconds per collective and size (with "
                        "--overhead: per collective); the first -r rounds are "
                        f"always taken (default: {SWEEP_BUDGET:g}; with "
                        f"--overhead {OVERHEAD_BUDGET:g})")
    parser.add_argument("--max-samples", type=_args.at_least_one, default=1000,
                        metavar="N",
                        help="timed rounds at most (default: %(default)s)")
    parser.add_argument("--min-time", type=_SECONDS, default=0.01, metavar="SECONDS",
                        help="target duration of one timed call (default: 0.01)")
    parser.add_argument("--json", metavar="FILE", type=_args.output_file,
                        help="write the results as JSON "
                        "(schema: collectives/bench/schema.json; - : standard "
                        "output, the table then on stderr)")
    parser.add_argument("--csv", metavar="FILE", type=_args.output_file,
                        help="write the table rows (with "
                        "--overhead: the ratios) as CSV (- : standard output)")
    parser.add_argument("--plot", metavar="FILE", type=_args.plot_file,
                        help="draw busbw against size with "
                        "the 95%% intervals as bands, to FILE for a desktop's "
                        "column and to NAME.narrow.EXT beside it for a phone's "
                        "(needs the bench extra)")
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="skip the per-device memory of each form (saves one "
                        "compilation per form and size)")
    parser.add_argument("--overhead", action="store_true",
                        help="measure overhead ratios instead of the size sweep")
    parser.add_argument("--overhead-size", type=_size_arg, default=parse_size("64K"),
                        metavar="SIZE", help="buffer per device for --overhead "
                        "(default: 64K)")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--progress", action="store_true",
                       help="show the progress line on stderr even when stderr is "
                       "not a terminal (one line per update, e.g. into a log)")
    shown.add_argument("-q", "--quiet", action="store_true",
                       help="no progress line (default: shown, rewritten in place, "
                       "when stderr is a terminal)")


def main(args: argparse.Namespace) -> int:
    """Run ``bench`` with parsed arguments; 1 if any result was wrong."""
    try:
        return _main(args)
    except (TypeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def progress_stream(args: argparse.Namespace, stream: TextIO) -> TextIO | None:
    """``stream`` (stderr) if the progress line goes there: it is a terminal or
    ``--progress`` asks for it, and ``-q`` does not silence it."""
    if args.quiet:
        return None
    return stream if args.progress or stream.isatty() else None


def _main(args: argparse.Namespace) -> int:
    progress = progress_stream(args, sys.stderr)
    if args.overhead:
        doc = _overhead_doc(args.collectives or OVERHEAD_COLLECTIVES, args, progress)
    else:
        sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
        doc = run(args.collectives or DEFAULT_COLLECTIVES, args.forms,
                  dtype=args.dtype, sizes=sizes,
                  samples=args.samples or SWEEP_SAMPLES, warmup=args.warmup,
                  iters=args.iters, min_time=args.min_time,
                  precision=args.precision,
                  budget=SWEEP_BUDGET if args.budget is None else args.budget,
                  max_samples=args.max_samples, memory=args.memory,
                  out=sys.stdout, progress=progress)
    if args.json:
        _args.write_text_atomic(args.json, json.dumps(doc, indent=1))
    if args.csv:
        _report.write_csv(doc, args.csv)
    if args.plot and doc["results"]:
        _report.plot(doc, args.plot)
    return 1 if doc["summary"]["wrong"] else 0


def _overhead_doc(names: Sequence[str], args: argparse.Namespace,
                  progress: TextIO | None) -> dict[str, Any]:
    axes = _cases.RECIPES["psum"].axes(make_mesh((jax.device_count(),), "i"))
    samples = args.samples or OVERHEAD_SAMPLES
    stopping = Stopping(
        precision=args.precision,
        budget=OVERHEAD_BUDGET if args.budget is None else args.budget,
        min_samples=samples, max_samples=max(samples, args.max_samples))
    bar = None if progress is None else Progress(
        progress, len(names) * len(RATIOS), expected=stopping.budget * len(names))
    rows = run_overhead(tuple(names), axes, size=args.overhead_size,
                        dtype=dtype_name_of(args.dtype), stopping=stopping,
                        min_time=args.min_time, progress=bar)
    if bar is not None:
        bar.finish()
    machine = machine_info()
    print(f"# collectives bench --overhead: {machine['devices']} "
          f"{machine['backend']} devices, JAX {machine['jax']}, {args.dtype}, "
          f"{args.overhead_size} B per device, per-call times (dispatch "
          "included), calls interleaved; verdict: met if the whole 95 % interval "
          "is at or below the target, not met if above, else inconclusive")
    for line in _report.format_overhead(rows):
        print(line)
    return {
        "schema": SCHEMA_ID, "machine": machine,
        "settings": {**settings(names, ["shard_map", "jit", "pmap"],
                                dtype_name_of(args.dtype), [args.overhead_size],
                                stopping, warmup=1, iters=1, min_time=args.min_time),
                     "overhead_size": args.overhead_size},
        "results": [], "skipped": [], "fit": [], "ring_vs_native": [],
        "summary": {"avg_busbw_gbps": None, "wrong": 0, "by_collective": {}},
        "overhead": rows,
    }
