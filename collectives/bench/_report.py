"""The benchmark's outputs: the nccl-tests-style table, the overhead and
cost-model tables, CSV, and the plot."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collectives import _figure
from collectives._args import write_atomic
from collectives._pyplot import pyplot
from collectives.bench._memory import MEMORY_FIELDS

# -- the table -----------------------------------------------------------------

_HEAD = ("#      size      count      type       form  iters    time(us)   ±95%     n  "
         "algbw(GB/s)  busbw(GB/s)  busbw/copy    args     out    temp  #wrong")
_UNITS = ("#       (B) (elements)                             (median)                 "
          "    (median)                 per device, bytes")
WIDE = "*"
"""Marks a ``±95%`` wider than the precision target: the row's sampling
stopped on the time budget (or ``--max-samples``) before the target."""


def header_lines() -> list[str]:
    return [_HEAD, _UNITS]


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _half_width(low: float, high: float, median: float) -> float:
    return (high - low) / 2 / median if median > 0 else float("inf")


def format_row(row: Mapping[str, Any], precision: float | None = None) -> str:
    """One table line; ``±95%`` carries :data:`WIDE` where it is wider than
    ``precision`` (a fraction, 0.02 for ±2 %)."""
    low, high = row["time_us_ci"]
    half = _half_width(low, high, row["time_us"])
    wide = WIDE if precision is not None and half > precision else " "
    memory = row["memory"] or {}
    mem = " ".join(f"{_bytes(memory.get(key)):>7}"
                   for key in ("argument_bytes", "output_bytes", "temp_bytes"))
    return (f"{row['size']:>11} {row['count']:>10} {row['type']:>9} "
            f"{row['form']:>10} {row['iters']:>6} {row['time_us']:>11.2f} "
            f"{100 * half:>5.1f}%{wide} {row['samples']:>4} {row['algbw_gbps']:>12.3f} "
            f"{row['busbw_gbps']:>12.3f} {row['copy_fraction']:>11.2f} {mem} "
            f"{row['wrong']:>7}")


def precision_lines(rows: Sequence[Mapping[str, Any]], precision: float,
                    budget: float) -> list[str]:
    """How many rows reached the precision target, and what the others mean."""
    wide = [row for row in rows
            if _half_width(*row["time_us_ci"], row["time_us"]) > precision]
    target = f"±{100 * precision:g} %"
    if not wide:
        return [f"# Precision            : every row within {target} at 95 %"]
    return [f"# Precision            : {len(rows) - len(wide)} of {len(rows)} rows "
            f"within {target} at 95 %; {WIDE} marks the {len(wide)} others,",
            f"#   whose sampling hit the {budget:g} s budget per collective and size "
            "(or --max-samples)",
            "#   first: read their intervals, or narrow them with a longer --budget"]


def averages(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Average busbw per collective and form (copy rows left out)."""
    sums: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        if row["form"] == "copy":
            continue
        sums.setdefault(row["collective"], {}).setdefault(row["form"], []).append(
            row["busbw_gbps"])
    return {name: {form: sum(v) / len(v) for form, v in forms.items()}
            for name, forms in sums.items()}


def _interval(value: float, ci: Sequence[float], digits: int) -> str:
    return f"{value:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def format_overhead(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [f"# {'ratio':<58} {'median':>7} {'95 % interval':>16} {'n':>4} "
             f"{'target':>7}  verdict"]
    for row in rows:
        target = "-" if row["target"] is None else f"<={row['target']:.2f}"
        low, high = row["ratio_ci"]
        lines.append(f"  {row['name']:<58} {row['ratio']:>7.3f} "
                     f"{f'[{low:.3f}, {high:.3f}]':>16} {row['samples']:>4} "
                     f"{target:>7}  {row['verdict'] or '-'}")
    return lines


def format_fits(fits: Sequence[Mapping[str, Any]],
                comparisons: Sequence[Mapping[str, Any]]) -> list[str]:
    """The alpha-beta table, and the ring forms against the native ones."""
    lines = ["#", "# Cost model: time = alpha + beta * S * bus factor, per collective "
             "and form (95 % intervals;", "# error = fitted / measured time - 1)",
             f"# {'collective':<14} {'form':<10} {'alpha (us)':>26} "
             f"{'beta (ns/B)':>26} {'1/beta (GB/s)':>13} {'rms err':>8} "
             f"{'max err':>8}"]
    for fit in fits:
        bw = "-" if fit["busbw_gbps"] is None else f"{fit['busbw_gbps']:.3f}"
        lines.append(
            f"  {fit['collective']:<14} {fit['form']:<10} "
            f"{_interval(fit['alpha_us'], fit['alpha_us_ci'], 1):>26} "
            f"{_interval(fit['beta_ns_per_byte'], fit['beta_ns_per_byte_ci'], 3):>26} "
            f"{bw:>13} {100 * fit['rms_error']:>7.1f}% {100 * fit['max_error']:>7.1f}%")
    for comp in comparisons:
        ratios = [f"{label} x{comp[key]:.2f}" for label, key in
                  (("alpha", "alpha_ratio"), ("beta", "beta_ratio"))
                  if comp[key] is not None]
        lines.append(f"# ring / {comp['native_form']} for {comp['collective']}: "
                     + (", ".join(ratios) or "not comparable"))
    return lines


# -- CSV -------------------------------------------------------------------------

def _flat(row: Mapping[str, Any]) -> dict[str, Any]:
    """One CSV record: intervals as ``*_low``/``*_high``, memory as
    ``memory_*``; the raw samples are left to the JSON."""
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if key.endswith("_samples"):
            continue
        if key.endswith("_ci"):
            stem = key[:-3]
            flat[f"{stem}_low"], flat[f"{stem}_high"] = value or (None, None)
        elif key == "memory":
            for field in MEMORY_FIELDS:
                flat[f"memory_{field}"] = None if value is None else value[field]
        else:
            flat[key] = value
    return flat


def write_csv(doc: Mapping[str, Any], path: str) -> None:
    """The table rows (or, for ``--overhead``, the ratios) as CSV, one header
    line then one record per row; empty cells for nulls."""
    rows = doc.get("overhead") or doc["results"]
    records = [_flat(row) for row in rows]
    fields = list(dict.fromkeys(key for record in records for key in record))
    def write(temporary: Path) -> None:
        with open(temporary, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(records)
    write_atomic(path, write)


# -- the plot ------------------------------------------------------------------

def plot(doc: Mapping[str, Any], path: str) -> None:
    """busbw against size, one panel per collective, one line per form with
    its 95 % interval as a band, the same-run copy dashed as the limit:
    drawn for a desktop's content column to ``path`` (two panels a row) and
    for a phone's beside it (``NAME.narrow.EXT``: one panel a row), as
    :mod:`collectives._figure` describes.

    Raises:
      RuntimeError: matplotlib is not installed.
    """
    for width, out in _figure.columns(path):
        _plot(doc, str(out), width)


def _plot(doc: Mapping[str, Any], path: str, width: str) -> None:
    plt = pyplot()
    rows = doc["results"]
    names = list(dict.fromkeys(r["collective"] for r in rows if r["form"] != "copy"))
    forms = list(dict.fromkeys(r["form"] for r in rows if r["form"] != "copy"))
    # one colour per form in every panel; the copy black and dashed
    colours = {form: f"C{i}" for i, form in enumerate(forms)}
    wide = width == "wide"
    cols = min(2 if wide else 1, max(1, len(names)))
    grid = -(-max(1, len(names)) // cols)
    # at the docs' 110 dpi: 6.9 in (759 px) for a desktop's column, 3.1 in
    # (341 px) for a phone's
    panel = (3.5, 2.9) if wide else (3.1, 2.5)
    small = 8 if wide else 7
    fig, axs = plt.subplots(grid, cols, figsize=(6.9 if wide else 3.1,
                                                 panel[1] * grid + 1.3),
                            squeeze=False, sharey=True)
    machine = doc["machine"]
    for index, ax in enumerate(axs.flat):
        if index >= len(names):
            ax.set_visible(False)
            continue
        name = names[index]
        mine = [r for r in rows if r["collective"] == name]
        kind = next(r["kind"] for r in mine if r["form"] != "copy")
        for form in dict.fromkeys(r["form"] for r in mine):
            pts = sorted((r["size"], r["busbw_gbps"], *r["busbw_gbps_ci"])
                         for r in mine if r["form"] == form)
            sizes = [p[0] for p in pts]
            style = (dict(color="black", linestyle="--") if form == "copy"
                     else dict(color=colours[form]))
            label = "copy (limit)" if form == "copy" else form
            ax.plot(sizes, [p[1] for p in pts], marker=".", label=label, **style)
            # the 95 % interval of the median as a band around the line
            ax.fill_between(sizes, [p[2] for p in pts], [p[3] for p in pts],
                            color=style["color"], alpha=0.2, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{name} ({kind})", fontsize=small + 2)
        ax.set_xlabel("size S (bytes)", fontsize=small + 1)
        ax.tick_params(labelsize=small + 1)
        ax.grid(True, alpha=0.3)
    for row_axes in axs:
        row_axes[0].set_ylabel("busbw (GB/s)", fontsize=small + 1)
    # one legend for every panel, under them, where it covers no line
    found = {}
    for ax in axs.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            found.setdefault(label, handle)
    where = (f"{machine['devices']} simulated CPU devices" if machine["simulated"]
             else f"{machine['devices']} x {machine['device_kind']}")
    fig.suptitle(f"collectives bench, {doc['settings']['dtype']}\n{where}, "
                 f"JAX {machine['jax']}", fontsize=small + 1)
    _figure.legend_under(fig, list(found.values()), list(found), 3 if wide else 2,
                         small)
    write_atomic(path, lambda temporary: _figure.save(fig, temporary, dpi=110))
    plt.close(fig)
