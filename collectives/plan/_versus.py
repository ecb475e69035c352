"""A plan's predicted communication next to ``bench``'s measured time for
the same collectives, on this machine (``plan --versus-bench``).

For each strategy, every collective of its compiled unit (kind and bytes
per device) is timed by the benchmark's own machinery (``bench``'s
``shard_map`` rows at that size, on a 1-D mesh of the same devices); the
step's measured time is the sum over its collectives, with the sum of their
95 % intervals. The prediction is the plan's: the ``measured`` profile's
``alpha + bytes * beta`` per collective. Their ratio says how far the
alpha-beta model, fitted on a size sweep, is off for a strategy's mix of
collectives here.

``python -m collectives.plan._versus REQUEST`` is the timing process
(``JAX_NUM_CPU_DEVICES`` set to the mesh's size).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from collectives.bench._sweep import run
from collectives.hlo import bus_factor
from collectives.plan._child import run_child
from collectives.plan._plan import Plan
from collectives.plan._plan import compile_units
from collectives.plan._profiles import _BENCHED as BENCHED


def bench_size(kind: str, sent: float, n: int) -> int:
    """``bench``'s size ``S`` for a collective that sends ``sent`` bytes per
    device over ``n`` devices (nccl-tests' convention: ``sent = S * factor``)."""
    factor = bus_factor(kind, n)
    return max(1, round(sent / factor)) if factor else max(1, round(sent))


def time_collectives(ops: Sequence[tuple[str, int]], *, budget: float
                     ) -> list[dict[str, Any]]:
    """Time each ``(kind, size S)`` with ``bench`` on a 1-D mesh of every
    device (in this process); one dict per op: ``seconds``, ``low``,
    ``high`` (the 95 % interval of the median) and the size timed."""
    out = []
    for kind, size in ops:
        doc = run([BENCHED[kind]], ["shard_map"], sizes=[size], budget=budget,
                  memory=False)
        (row,) = [r for r in doc["results"] if r["form"] == "shard_map"]
        low, high = row["time_us_ci"]
        out.append({"kind": kind, "size": row["size"],
                    "seconds": row["time_us"] * 1e-6, "low": low * 1e-6,
                    "high": high * 1e-6})
    return out


def versus_bench(plan: Plan, *, budget: float = 0.5, timeout: float = 900
                 ) -> list[dict[str, Any]]:
    """Each planned strategy's predicted communication next to bench's
    measured time for the same collectives.

    Args:
      plan: a plan on a 1-D mesh (bench times over every device), with the
        same profile on its axis.
      budget: bench's timing seconds per collective and size.

    Returns:
      One dict per strategy with a row: ``label``, ``predicted``,
      ``measured``, ``low``, ``high`` (seconds per unit), ``ratio``
      (predicted / measured) and ``ratio_low``, ``ratio_high``.

    Raises:
      ValueError: the plan's mesh has more than one axis.
    """
    if len(plan.mesh) != 1:
        raise ValueError(
            f"--versus-bench: the mesh {dict(plan.mesh)} has {len(plan.mesh)} axes; "
            "bench times collectives over every device of a 1-D mesh. Fix: plan on "
            "one axis, e.g. --mesh data=8.")
    (axis, n), = plan.mesh.items()
    profile = plan.interconnect[axis]
    names = [row.recipe for row in plan.rows if not row.skipped]
    doc = compile_units([axis], [n], recipes=names, forms=(plan.form,),
                        model=plan.model, timeout=timeout)
    units = [u for u in doc["units"] if "skipped" not in u]
    wanted = sorted({(op["kind"], bench_size(op["kind"], op["bytes"], n))
                     for u in units for op in u["ops"]})
    timed = _timed(wanted, n, budget, timeout)
    results = []
    for unit in units:
        predicted = measured = low = high = 0.0
        for op in unit["ops"]:
            t = timed[(op["kind"], bench_size(op["kind"], op["bytes"], n))]
            predicted += profile.seconds(op["kind"], op["bytes"])
            measured, low, high = (measured + t["seconds"], low + t["low"],
                                   high + t["high"])
        label = next(r.label for r in plan.rows if r.recipe == unit["recipe"])
        results.append({
            "label": label, "recipe": unit["recipe"], "ops": len(unit["ops"]),
            "predicted": predicted, "measured": measured, "low": low, "high": high,
            "ratio": predicted / measured if measured else math.nan,
            "ratio_low": predicted / high if high else math.nan,
            "ratio_high": predicted / low if low > 0 else math.inf})
    return results


def _timed(ops: Sequence[tuple[str, int]], n: int, budget: float, timeout: float
           ) -> dict[tuple[str, int], dict[str, Any]]:
    rows = run_child("collectives.plan._versus",
                     {"ops": [list(op) for op in ops], "budget": budget},
                     devices=n, timeout=timeout, what="--versus-bench's timing")
    return {tuple(op): row for op, row in zip(ops, rows, strict=True)}


def table_lines(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The comparison as text: per strategy, seconds per compiled unit."""
    lines = [f"{'strategy':<16}{'ops':>5}{'predicted':>12}{'measured':>12}"
             f"{'95% interval':>22}{'pred/meas':>11}{'95% interval':>18}"]
    for r in results:
        measured = f"[{r['low'] * 1e3:.3f}, {r['high'] * 1e3:.3f}] ms"
        ratio = f"[{r['ratio_low']:.2f}, {r['ratio_high']:.2f}]"
        lines.append(
            f"{r['label']:<16}{r['ops']:>5}{r['predicted'] * 1e3:>10.3f}ms"
            f"{r['measured'] * 1e3:>10.3f}ms{measured:>22}{r['ratio']:>11.2f}"
            f"{ratio:>18}")
    return lines


def main() -> int:
    with open(sys.argv[1]) as f:
        request = json.load(f)
    ops = [tuple(op) for op in request["ops"]]
    json.dump(time_collectives(ops, budget=request["budget"]), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
