"""``bench`` across processes: every rank times, rank 0 reports min/avg/max.

The single-process benchmark (:func:`collectives.bench.run`) runs unchanged in
every rank, on a mesh over every device of every process; each rank times its
own calls and counts wrong elements on its own devices. Two things differ:

* every rank must run the same programs the same number of times, or one
  waits in a collective the others never enter; so the iteration count is
  fixed per size (``-n``, or :func:`iterations_for`), never calibrated per rank;
* pmap's multi-process input is per-process stacks, which the sweep does not
  build, so pmap is left to the single-process benchmark.

Rank 0 then prints one nccl-tests-style table, times as min / avg / max over
ranks, bandwidths from the slowest rank, and ``#wrong`` per rank. Last, a
stress check repeats ``psum_scatter`` with large chunks over gloo and checks
every repetition on every rank: that is where a silent wrong result was
reported (jax-ml/jax#40830).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from collectives import _args
from collectives import bench
from collectives.bench._command import SWEEP_SAMPLES
from collectives.distributed import _ranks
from collectives.hlo import bus_factor

ITER_BYTES = 8 << 20
"""With no ``-n``: ``ITER_BYTES // S`` collectives per timed call (1 to 64)."""
SKIPPED_FORMS = {"pmap": "pmap takes per-process stacks across processes; time it "
                         "with the single-process `bench`"}


def iterations_for(size: int) -> int:
    """Collectives per timed call at size ``S``, the same on every rank."""
    return max(1, min(64, ITER_BYTES // max(1, size)))


def sampling(args: argparse.Namespace, size: int) -> dict[str, Any]:
    """How many calls each rank times at size ``S``: the same on every rank.

    Every timed call runs collectives that all ranks must enter together, so
    nothing may depend on a rank's own clock: exactly ``-r`` rounds (no
    adaptive stopping on precision or budget) of a fixed number of
    iterations. Ranks that stopped on their own intervals ran different
    numbers of collectives and deadlocked or crossed (gloo: "Received data
    size doesn't match expected size")."""
    rounds = args.samples or SWEEP_SAMPLES
    return dict(samples=rounds, max_samples=rounds, budget=0.0,
                warmup=args.warmup, iters=args.iters or iterations_for(size),
                min_time=args.min_time)


def bench_parser() -> argparse.ArgumentParser:
    """The arguments of the ``bench`` target (after ``launch ... --``)."""
    p = _args.Parser(
        prog="launch ... -- bench",
        description="the nccl-tests-style sweep on a mesh over every process; "
                    "times as min/avg/max over ranks, #wrong per rank")
    bench.add_arguments(p)
    p.add_argument("--scatter-chunk", type=bench.parse_size,
                   default=bench.parse_size("4M"), metavar="SIZE",
                   help="psum_scatter stress check: bytes per device's chunk "
                        "(default: 4M, where jax#40830 was seen)")
    p.add_argument("--scatter-iters", type=int, default=20, metavar="N",
                   help="psum_scatter stress check: repetitions, each checked on "
                        "every rank; 0 skips it (default: %(default)s)")
    return p


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Parse and validate the ``bench`` target's arguments.

    Raises:
      SystemExit: argparse's own errors.
      ValueError: an option that does not work across processes.
    """
    args = bench_parser().parse_args(list(argv))
    for flag, value in (("--overhead", args.overhead), ("--plot", args.plot)):
        if value:
            raise ValueError(f"bench {flag}: not available across processes. Fix: "
                             "run it in one process (`python -m collectives bench "
                             f"{flag} ...`).")
    if args.scatter_iters < 0:
        raise ValueError(f"--scatter-iters: expected 0 or more, got "
                         f"{args.scatter_iters}.")
    return args


def cmd_bench(argv: Sequence[str]) -> tuple[int, str]:
    """Run the ``bench`` target in this rank; (exit code, one-line summary)."""
    args = parse(argv)
    rank, n_ranks = jax.process_index(), jax.process_count()
    forms = [f for f in args.forms if f not in SKIPPED_FORMS]
    collectives = args.collectives or list(bench.DEFAULT_COLLECTIVES)
    rows: list[dict[str, Any]] = []
    for size in bench.size_sweep(args.minbytes, args.maxbytes, args.stepfactor):
        doc = bench.run(collectives, forms, dtype=args.dtype, sizes=[size],
                        **sampling(args, size))
        rows += [_compact(row) for row in doc["results"]]
        if rank == 0 and not args.quiet:
            print(f"# {size} B done", flush=True)
    stress = (scatter_stress(args.scatter_chunk, args.scatter_iters)
              if args.scatter_iters else None)
    _ranks.publish("bench", rank, {"rows": rows, "stress": stress})
    everyone = _ranks.collect("bench", n_ranks, timeout=600.0)
    if any(part is None for part in everyone):
        missing = [r for r, part in enumerate(everyone) if part is None]
        return 1, f"bench: no results from rank(s) {missing}"
    if rank == 0:
        skipped = [f for f in args.forms if f in SKIPPED_FORMS]
        print("\n".join(report(everyone, skipped)), flush=True)
    wrong = sum(r["wrong"] for part in everyone for r in part["rows"])
    wrong += sum((part["stress"] or {}).get("wrong", 0) for part in everyone)
    return (0 if wrong == 0 else 1), f"bench: {len(rows)} rows, {wrong} wrong"


def _compact(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("collective", "kind", "form", "size", "count", "type", "devices",
            "iters", "time_us", "wrong")
    return {key: row[key] for key in keep}


def report(everyone: list[dict[str, Any]], skipped: Sequence[str] = ()) -> list[str]:
    """The combined table: one line per (collective, form, size) over ranks."""
    n_ranks = len(everyone)
    first = everyone[0]["rows"]
    out = [f"# collectives bench across {n_ranks} processes, "
           f"{first[0]['devices'] if first else 0} devices; time over ranks "
           "(min/avg/max), bandwidth from the slowest rank (max)"]
    out += [f"#   {form}: skipped, {SKIPPED_FORMS[form]}" for form in skipped]
    out.append(f"#{'collective':>13} {'form':>9} {'size':>10} {'count':>9} "
               f"{'type':>8} {'iters':>5} {'min(us)':>9} {'avg(us)':>9} "
               f"{'max(us)':>9} {'algbw':>7} {'busbw':>7}  #wrong")
    for index, row in enumerate(first):
        times = [part["rows"][index]["time_us"] for part in everyone]
        wrong = [part["rows"][index]["wrong"] for part in everyone]
        slowest = max(times)
        algbw = row["size"] / (slowest * 1e-6) / 1e9 if slowest > 0 else 0.0
        factor = 1.0 if row["form"] == "copy" else bus_factor(row["kind"],
                                                              row["devices"])
        out.append(f" {row['collective']:>13} {row['form']:>9} {row['size']:>10} "
                   f"{row['count']:>9} {row['type']:>8} {row['iters']:>5} "
                   f"{min(times):>9.1f} {sum(times) / n_ranks:>9.1f} "
                   f"{slowest:>9.1f} {algbw:>7.3f} {algbw * factor:>7.3f}  "
                   f"{'/'.join(map(str, wrong))}")
    stresses = [part["stress"] for part in everyone]
    if stresses[0] is not None:
        s = stresses[0]
        out.append(f"# psum_scatter stress (jax#40830): {s['chunk']} B per chunk, "
                   f"{s['iterations']} checked repetitions on {s['devices']} "
                   "devices; #wrong per rank: "
                   + "/".join(str(part["wrong"]) for part in stresses))
    total = sum(r["wrong"] for part in everyone for r in part["rows"])
    total += sum(s["wrong"] for s in stresses if s is not None)
    out.append(f"# Out of bounds values : {total} {'OK' if total == 0 else 'FAILED'}")
    return out


# -- psum_scatter with large chunks, repeated and checked ---------------------

def _values(start: int, stop: int) -> np.ndarray:
    """Element ``p`` of the global input: small integers, exact in float32 sums."""
    p = np.arange(start, stop, dtype=np.int64)
    return ((p * 7) % 17 - 8).astype(np.float32)


@functools.cache
def _scatter_program(mesh: jax.sharding.Mesh) -> Any:
    def body(block):
        # block: f32[n*k] on each device -> f32[k], the sum of chunk d over devices
        return lax.psum_scatter(block, "i", scatter_dimension=0, tiled=True)

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"),
                                 out_specs=P("i")))


def scatter_stress(chunk_bytes: int, iterations: int) -> dict[str, int]:
    """Run a tiled ``psum_scatter`` ``iterations`` times; count wrong elements.

    Every device holds ``n`` chunks of ``chunk_bytes`` (float32, integer
    values, so the sums are exact); each repetition's output is compared with
    NumPy on this rank's devices.

    Returns:
      ``{"chunk", "iterations", "devices", "wrong"}`` for this rank.
    """
    devices = jax.devices()
    n = len(devices)
    k = max(1, chunk_bytes // 4)
    mesh = jax.sharding.Mesh(np.array(devices), ("i",))
    sharding = NamedSharding(mesh, P("i"))
    x = jax.make_array_from_callback(
        (n * n * k,), sharding,
        lambda index: _values(index[0].start or 0, index[0].stop or n * n * k))
    fn = _scatter_program(mesh)
    expected: dict[int, np.ndarray] = {}
    wrong = 0
    for _ in range(iterations):
        out = fn(x)
        for shard in out.addressable_shards:
            start = shard.index[0].start or 0
            d = start // k
            if d not in expected:
                expected[d] = sum(_values(j * n * k + d * k, j * n * k + (d + 1) * k)
                                  .astype(np.float64) for j in range(n))
            wrong += int(np.count_nonzero(np.asarray(shard.data) != expected[d]))
    return {"chunk": k * 4, "iterations": iterations, "devices": n, "wrong": wrong}
