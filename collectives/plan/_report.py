"""A plan's outputs: the table, the crossovers of a sweep, and the plot."""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence

from collectives import _figure
from collectives._args import write_atomic
from collectives._pyplot import pyplot
from collectives.plan._plan import PRECISIONS
from collectives.plan._plan import Plan
from collectives.plan._plan import PlanRow

SHORT = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS",
         "all-to-all": "A2A", "collective-permute": "CP"}
"""How the table abbreviates each collective kind."""


def size(n: float) -> str:
    """Bytes in the largest unit that keeps a number >= 1: ``17.2 GB``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def duration(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def collectives_text(counts: Mapping[str, int]) -> str:
    return " ".join(f"{SHORT[kind]}x{n}" for kind, n in counts.items()) or "none"


def mesh_text(mesh: Mapping[str, int]) -> str:
    return " x ".join(f"{name}={n}" for name, n in mesh.items())


def header(plan: Plan) -> list[str]:
    devices = math.prod(plan.mesh.values())
    lines = [f"# model       : {plan.model.describe()}",
             f"# mesh        : {mesh_text(plan.mesh)} ({devices} devices), "
             f"{plan.form} form, compiled by JAX {plan.jax} ({plan.compiler}) in "
             f"{plan.seconds:.1f} s from abstract inputs (nothing allocated)"]
    seen = {}
    for axis, profile in plan.interconnect.items():
        seen.setdefault(profile.name, (profile, []))[1].append(axis)
    for name, (profile, axes) in seen.items():
        figures = (f"alpha {profile.link.alpha * 1e6:.1f} us, busbw "
                   f"{profile.link.busbw / 1e9:.2f} GB/s")
        if profile.kinds:
            figures = "alpha and busbw per kind"
        lines.append(f"# interconnect: {', '.join(axes)}: {name} ({figures}); "
                     f"{profile.source}")
    lines.append(f"# chip        : {chip_text(plan)}")
    return lines


def chip_text(plan: Plan) -> str:
    """The chip the compute time is for, its peak, and the states' policy."""
    peak = ("no peak FLOP/s for it in the profile: no compute time"
            if plan.peak_flops is None else
            f"{plan.peak_flops / 1e12:g} TFLOP/s peak in {plan.model.dtype}")
    return (f"{plan.chip or 'unnamed'}, {peak}; states {plan.precision}: "
            f"{PRECISIONS[plan.precision]}")


COLUMNS = ("strategy", "over", "collectives/step", "sent/device", "comm",
           "compute", "step", "MFU", "comm-bound below", "memory/device",
           "cost model")
"""The plan table's columns (text and docs)."""


def row_cells(plan: Plan, row: PlanRow) -> tuple[str, ...]:
    """One planned row's cells, as :data:`COLUMNS` names them."""
    def maybe(value, text):
        return "-" if value is None else text(value)

    return (row.label, row.axis, collectives_text(row.collectives), size(row.sent),
            duration(row.comm_s), maybe(row.compute_s, duration),
            duration(row.step_s), maybe(row.mfu, lambda v: f"{v:.0%}"),
            maybe(row.critical_tokens_per_device, lambda v: f"{v:,.0f} tok"),
            size(row.memory_bytes),
            "holds" if row.cost_model is None else
            "DIFFERS" if compiled_here(plan) else "differs")


def compiled_here(plan: Plan) -> bool:
    """Whether XLA:CPU compiled the plan (not a target's own compiler)."""
    return plan.compiler.startswith("XLA:CPU")


def notes(plan: Plan) -> list[str]:
    """What the table's columns mean, and what each row adds to them."""
    program = ("the target's program (the recipe's cost model as written)"
               if compiled_here(plan) else
               "the program the target's compiler built, each op counted by what "
               "it moves")
    out = ["per device and training step; " + ", ".join(
        f"{short} {kind}" for kind, short in SHORT.items()) + "; counts and "
        f"bytes are {program}.",
        "comm: the collectives one after another; compute: the FLOPs (the "
        "compiled program's, else the model's) at the chip's peak; step: "
        "compute plus the communication it does not hide; MFU: 6NT FLOPs over "
        "step x peak (an upper bound: compute at peak); comm-bound below: the "
        "tokens per device under which the overlapped collectives outlast the "
        "computation that hides them; "
        "memory: weights, gradients and optimizer states plus the activations "
        "a step keeps for its backward pass."]
    layers = [row.label for row in plan.rows if row.scope == "layer"]
    if layers:
        out.append(f"{', '.join(layers)}: one kind of layer each (its "
                   "collectives for every layer of the model, its forward "
                   "computation); they add to a whole-model strategy above rather "
                   "than replace it.")
    for row in plan.rows:
        if row.skipped:
            continue
        tokens = f"{row.tokens_per_device:,.0f} tokens per device"
        flops = ("" if row.flops is None or not row.model_flops else
                 f"; compiled FLOPs {row.flops / row.model_flops:.3f} x 6NT"
                 if row.flops_source == "compiled" else
                 f"; the compiled program's matmuls {row.flops / row.model_flops:.3f}"
                 " x 6NT (the compiler gives no cost analysis)"
                 if row.flops_source == "matmuls" else
                 "; FLOPs: the model's 6NT (the compiler gives no cost analysis)")
        out.append(f"{row.label}: {row.recipe}, {row.repeats:g} x ({row.unit}); "
                   f"{tokens}{flops}")
        if row.note:
            out.append(f"{row.label}: {row.note}")
        if row.program:
            out.append(f"{row.label}: {row.program}; XLA:CPU's units send "
                       f"{size(row.cpu_sent)} a step")
        if row.added:
            out.append(f"{row.label}: + {row.added}")
        if not compiled_here(plan) and row.unit_arguments is not None:
            out.append(f"{row.label}: one unit in the target's memory analysis: "
                       f"{size(row.unit_arguments)} of arguments, {size(row.temp)} "
                       "of temporaries")
        if row.schedule is not None:
            s = row.schedule
            out.append(
                f"{row.label}: the target's schedule of one unit: {s['async']:g} of "
                f"{s['ops']:g} collectives asynchronous; of their "
                f"{s['comm_s'] * 1e3:.1f} ms a step, the matmuls it runs between "
                f"start and done hide {s['hidden_s'] * 1e3:.1f} ms, "
                f"{s['exposed_s'] * 1e3:.1f} ms wait (within one unit; the step "
                "column overlaps by the strategy's rule, across units)")
        for how, count in row.rewritten.items():
            out.append(f"{row.label}: {count:g} collectives a step are written as "
                       f"{how}")
        if row.cost_model is not None:
            whose = ("the cost model differs" if compiled_here(plan) else
                     "the target compiles other ops than the cost model's")
            out.append(f"{row.label}: {whose}: {row.cost_model}")
    return out


def table_lines(plan: Plan) -> list[str]:
    """The plan as a text table, with its header and notes."""
    rows: list[tuple[str, ...]] = []
    skipped: list[PlanRow] = []
    for row in plan.rows:
        if row.skipped:
            skipped.append(row)
            continue
        rows.append(row_cells(plan, row))
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(COLUMNS)]
    left = {0, 1, 2, 10}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))
                         ).rstrip()

    out = header(plan) + [line(COLUMNS)] + [line(r) for r in rows]
    for row in skipped:
        out.append(f"{row.label}: not planned: {row.skipped}")
    return out + [f"# {note}" for note in notes(plan)]


def fits(row: PlanRow, memory: float | None) -> bool:
    return memory is None or row.memory_bytes <= memory


def crossovers(plans: Sequence[Plan], memory: float | None = None) -> list[str]:
    """Where the sweep's answer changes, in words: for each model, the
    strategy that trains the whole model (scope ``"model"``) in the least
    predicted step time among those whose step fits in ``memory`` bytes per
    device (``None``: any), at each device count, and the device counts
    where it changes; and where each such strategy starts to fit.
    Strategies of one layer (attention, experts) add to these and are not
    ranked with them."""
    lines = []
    models = list(dict.fromkeys(p.model.name for p in plans))
    for name in models:
        mine = sorted((p for p in plans if p.model.name == name),
                      key=lambda p: math.prod(p.mesh.values()))
        best_before = None
        for p in mine:
            devices = math.prod(p.mesh.values())
            ok = [r for r in p.rows
                  if not r.skipped and r.scope == "model" and fits(r, memory)]
            best = min(ok, key=lambda r: r.step_s).label if ok else None
            if best != best_before:
                if best is None:
                    lines.append(f"{name}: at {devices} devices no strategy fits")
                elif best_before is None:
                    lines.append(f"{name}: from {devices} devices the fastest step "
                                 f"that fits: {best}")
                else:
                    lines.append(f"{name}: crossover at {devices} devices: {best} "
                                 f"takes over from {best_before}")
            best_before = best
        if memory is not None:
            labels = list(dict.fromkeys(r.label for p in mine for r in p.rows
                                        if r.scope == "model"))
            for label in labels:
                first = next((math.prod(p.mesh.values()) for p in mine
                              for r in p.rows if r.label == label and not r.skipped
                              and fits(r, memory)), None)
                lines.append(f"{name}: {label} fits in {size(memory)} per device "
                             + (f"from {first} devices" if first else
                                "at none of these counts"))
    return lines


def plot(plans: Sequence[Plan], path: str, memory: float | None = None) -> None:
    """Predicted step time and memory per device against the device count, a
    line per strategy: drawn for a desktop's content column to ``path`` (a
    row of two panels per model) and for a phone's beside it
    (``NAME.narrow.EXT``: the panels stacked), as :mod:`collectives._figure`
    describes.

    Raises:
      RuntimeError: matplotlib is not installed.
    """
    for width, out in _figure.columns(path):
        _plot(plans, str(out), memory, width)


def _plot(plans: Sequence[Plan], path: str, memory: float | None,
          width: str) -> None:
    plt = pyplot()
    models = list(dict.fromkeys(p.model.name for p in plans))
    wide = width == "wide"
    # at the docs' 110 dpi: the width of their content column (6.9 in, 759 px;
    # a phone's 3.1 in, 341 px), each panel 3.4 in (wide) or 2.5 in tall
    fig, axs = plt.subplots(len(models) * (1 if wide else 2), 2 if wide else 1,
                            figsize=(6.9, 3.4 * len(models)) if wide
                            else (3.1, 2.5 * 2 * len(models)), squeeze=False)
    pairs = (axs if wide else axs.reshape(len(models), 2))
    small = 8 if wide else 7
    for (ax_time, ax_mem), name in zip(pairs, models, strict=True):
        mine = sorted((p for p in plans if p.model.name == name),
                      key=lambda p: math.prod(p.mesh.values()))
        labels = list(dict.fromkeys(r.label for p in mine for r in p.rows))
        counts = [math.prod(p.mesh.values()) for p in mine]
        for label in labels:
            pts = [(math.prod(p.mesh.values()), r) for p in mine for r in p.rows
                   if r.label == label and not r.skipped]
            if not pts:
                continue
            xs = [n for n, _ in pts]
            # one layer's strategies (attention, experts) dashed: they add
            # to a whole-model strategy rather than compete with it
            style = "--" if pts[0][1].scope == "layer" else "-"
            (line,) = ax_time.plot(xs, [r.step_s for _, r in pts], marker="o",
                                   linestyle=style, label=label)
            ax_mem.plot(xs, [r.memory_bytes for _, r in pts],
                        marker="o", linestyle=style, color=line.get_color(),
                        label=label)
        for ax, what in ((ax_time, "step time (s)"),
                         (ax_mem, "memory per device (bytes)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(counts, [str(n) for n in counts])
            ax.set_xlabel("devices", fontsize=small + 1)
            ax.set_ylabel(what, fontsize=small + 1)
            ax.tick_params(labelsize=small + 1)
            ax.grid(True, which="both", alpha=0.3)
        model = mine[0].model
        title = f"{name}: {model.parameters / 1e9:.2f}B parameters"
        ax_time.set_title(title, fontsize=small + 2)
        if not wide:
            ax_mem.set_title(title, fontsize=small + 2)
        if memory is not None:
            limit = ax_mem.axhline(memory, color="black", linestyle=":",
                                   linewidth=1.2,
                                   label=f"memory: {size(memory)} per device")
    # one legend for every panel, under them, where it covers no line
    handles, labels = pairs[0][0].get_legend_handles_labels()
    if memory is not None:
        handles, labels = [*handles, limit], [*labels, limit.get_label()]
    links = "; ".join(dict.fromkeys(
        f"{axis}: {profile.name}" for axis, profile in plans[0].interconnect.items()))
    fig.suptitle(f"Predicted per device and step\n({links})", fontsize=small + 2)
    _figure.legend_under(fig, handles, labels, 3 if wide else 2, small)
    write_atomic(path, lambda temporary: _figure.save(fig, temporary, dpi=110))
    plt.close(fig)
