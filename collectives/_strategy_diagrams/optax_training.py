"""Data-parallel Adam (``dp_adam``), traced from a real run of its recipe file.

:func:`trace` runs ``recipes/optax_training.py``'s shard_map form
(``train_shard_map``: ``train_per_device`` under ``jax.shard_map``, params
and Adam state replicated, the rows of ``x`` and ``y`` split over the
devices) with the file module's ``lax`` swapped for a tap (:mod:`._tap`,
restored afterwards) whose ``pmean`` calls the real one and then reports,
with ``jax.experimental.io_callback``, each device's ``lax.axis_index``, what
went in (the device's loss and gradients on its own rows) and what came out
(the averages). The one ``pmean`` call site sits in the body of a
``lax.scan``; a device's reports come in step order, since the next step
uses the averaged gradients only once the report is in. The same data also
trains on one device (the file's ``train_one_device``: ``train_program``
under ``jax.jit``) and in the file's NumPy oracle ``train_numpy``, for the
loss curves.

The data are ``main()``'s kind: ``x`` drawn from a normal, ``y = x @ w +
0.5``, parameters from zero; each device's rows differ, so do its local
gradients.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import jax
import numpy as np

from collectives import _figure
from collectives._devices import make_mesh
from collectives._strategy_diagrams import on_its_own_mesh
from collectives._strategy_diagrams._tap import tapped

AXIS = "i"
N_STEPS = 20
SHOWN = 4  # gradient elements the picture shows (the record keeps all)

CAPTION = (
    "Data-parallel Adam on 8 devices, recorded from a real run of "
    "recipes/optax_training.py (20 optax.adam steps): at step 1 each device's "
    "loss and gradients on its own 4 rows go into one all-reduce (lax.pmean) "
    "and the same averages come out on every device; below, the loss per step "
    "against one device training on the whole batch.")


def _file():
    """The recipe module (imports optax: loaded on first use)."""
    return importlib.import_module("collectives.recipes.optax_training")


@dataclass(frozen=True, eq=False)
class DpAdamTrace:
    """What went into and came out of each step's ``pmean``, per device, and
    the loss curves."""

    n_devices: int
    rows: int  # rows of the batch per device
    n_steps: int
    lr: float
    vary: bool  # train_per_device's vary (False: the n x gradient trap)
    elements: tuple[str, ...]  # gradient elements, in pytree order: "b[0]", ..
    local_loss: np.ndarray  # [step, device] the loss on the device's rows
    local_grad: np.ndarray  # [step, device, element] entering pmean
    mean_loss: np.ndarray  # [step, device] coming out of pmean
    mean_grad: np.ndarray  # [step, device, element]
    losses: np.ndarray  # [step] the shard_map run's returned losses
    losses_one_device: np.ndarray  # [step] train_one_device on the whole batch
    losses_numpy: np.ndarray  # [step] train_numpy
    param_gap: float  # max |params (shard_map) - params (one device)|
    tolerance: float  # the file's tolerance for these shapes


def data(n_devices: int = 8, rows: int = 4, seed: int = 0):
    """``(params, x, y)``: zero params, ``x [n * rows, 4]``, ``y = x @ w + 0.5``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows * n_devices, 4)).astype(np.float32)
    y = (x @ rng.standard_normal((4, 2)) + 0.5).astype(np.float32)
    params = {"w": np.zeros((4, 2), np.float32), "b": np.zeros(2, np.float32)}
    return params, x, y


def _names(params) -> tuple[str, ...]:
    names = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        key = getattr(path[-1], "key", path[-1])
        names += [f"{key}[{','.join(map(str, i))}]" for i in np.ndindex(np.shape(leaf))]
    return tuple(names)


@on_its_own_mesh
def trace(n_devices: int = 8, rows: int = 4, n_steps: int = N_STEPS,
          vary: bool = True) -> DpAdamTrace:
    """Train ``n_steps`` Adam steps with the file's shard_map form on
    ``n_devices`` devices (``rows`` rows each), tapping its ``pmean``."""
    opt_file = _file()
    params, x, y = data(n_devices, rows)
    mesh = make_mesh((n_devices,), AXIS)
    with tapped(opt_file, "pmean") as tap:
        losses, trained = opt_file.train_shard_map(params, x, y, mesh,
                                                   n_steps=n_steps, vary=vary)
        losses = np.asarray(losses)
        trained = jax.tree_util.tree_map(np.asarray, trained)
    sites = [s for s in range(len(tap.sites)) if tap.by_device(s)]
    if len(sites) != 1:
        raise AssertionError(f"expected one pmean call site that ran, got {sites}")
    runs = tap.by_device(sites[0])
    if sorted(runs) != list(range(n_devices)) or any(
            len(r) != n_steps for r in runs.values()):
        raise AssertionError(f"expected {n_steps} pmean reports per device, got "
                             f"{ {d: len(r) for d, r in runs.items()} }")

    def stack(side):  # [step, device, leaf values...]: loss, then the gradients
        return np.array([[np.concatenate([np.ravel(a) for a in getattr(r, side)])
                          for r in (runs[d][step] for d in range(n_devices))]
                         for step in range(n_steps)])

    ins, outs = stack("inputs"), stack("outputs")
    one_losses, one_params = opt_file.train_one_device(params, x, y, n_steps)
    numpy_losses, _ = opt_file.train_numpy(params, x, y, n_steps)
    gap = max(float(np.max(np.abs(trained[k] - np.asarray(one_params[k]))))
              for k in params)
    arrays = [ins[..., 0], ins[..., 1:], outs[..., 0], outs[..., 1:], losses,
              np.asarray(one_losses), np.asarray(numpy_losses)]
    for array in arrays:
        array.flags.writeable = False
    return DpAdamTrace(
        n_devices=n_devices, rows=rows, n_steps=n_steps, lr=float(opt_file.LR),
        vary=vary, elements=_names(params),
        local_loss=arrays[0], local_grad=arrays[1], mean_loss=arrays[2],
        mean_grad=arrays[3], losses=arrays[4], losses_one_device=arrays[5],
        losses_numpy=arrays[6], param_gap=gap,
        tolerance=float(opt_file.tolerance(*x.shape, n_steps=n_steps)))


def _row(values) -> str:
    return " ".join(f"{v:>7.3f}" for v in values)


def text(record: DpAdamTrace, step: int = 0) -> str:
    """Step ``step``'s pmean (loss and the first gradient elements per
    device, in and out) and the loss curves, as a plain-text table."""
    n, shown = record.n_devices, min(SHOWN, len(record.elements))
    head = " ".join(f"{name:>7}" for name in ("loss", *record.elements[:shown]))
    into_title = "into pmean (this device's rows)"
    lines = [f"Data-parallel Adam, {n} devices x {record.rows} rows: lax.pmean at "
             f"step {step + 1}",
             f"device | {into_title:<{len(head)}} | out of pmean",
             f"       | {head} | {head}"]
    for d in range(n):
        into = _row([record.local_loss[step, d], *record.local_grad[step, d, :shown]])
        out = _row([record.mean_loss[step, d], *record.mean_grad[step, d, :shown]])
        lines.append(f"{d:>6} | {into} | {out}")
    gap = float(np.max(np.abs(record.losses - record.losses_one_device)))
    lines.append(f"loss per step (shard_map, {n} devices): "
                 + " ".join(f"{v:.3f}" for v in record.losses[:5])
                 + (" ..." if record.n_steps > 5 else ""))
    lines.append("loss per step (one device, whole batch): "
                 + " ".join(f"{v:.3f}" for v in record.losses_one_device[:5])
                 + (" ..." if record.n_steps > 5 else ""))
    lines.append(f"{record.n_steps} optax.adam steps (lr {record.lr:g}): losses "
                 f"differ by at most {gap:.1e}, parameters by {record.param_gap:.1e}")
    return "\n".join(lines)


def draw(record: DpAdamTrace, path, width: str = "wide", step: int = 0) -> None:
    """Write the SVG: step ``step``'s pmean (in, out) above the loss curves;
    in and out side by side (wide) or stacked (narrow)."""
    import matplotlib  # optional: the docs extra

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    narrow = width == "narrow"
    fs = _figure.font_pt(width, 10.5)  # 8.9 pt narrow
    shown = min(SHOWN, len(record.elements))
    into = np.column_stack([record.local_loss[step],
                            record.local_grad[step, :, :shown]])
    out = np.column_stack([record.mean_loss[step], record.mean_grad[step, :, :shown]])
    if narrow:
        fig = Figure(figsize=(3.7, 9.0))
        grid = fig.add_gridspec(3, 1, height_ratios=(1, 1, 1.05), hspace=0.36,
                                left=0.13, right=0.97, top=0.855, bottom=0.05)
        table_cells = (grid[0, 0], grid[1, 0])
    else:
        fig = Figure(figsize=(10, 9))
        grid = fig.add_gridspec(2, 2, height_ratios=(1.1, 1), wspace=0.36,
                                hspace=0.3, left=0.09, right=0.98, top=0.8,
                                bottom=0.07)
        table_cells = (grid[0, 0], grid[0, 1])
    columns = ("loss", *record.elements[:shown])
    tables = []
    for col, values in enumerate((into, out)):
        ax = fig.add_subplot(table_cells[col])
        tables.append(ax)
        _table(ax, values, (into, out), columns, col, narrow, fs)
    _all_reduce_arrow(fig, tables, narrow, fs)
    _loss_curves(fig.add_subplot(grid[2, 0] if narrow else grid[1, :]), record,
                 narrow, fs)
    _headings(fig, record, step, narrow, fs)
    _figure.save(fig, path)


def _table(ax, values, both, columns, col: int, narrow: bool, fs: float) -> None:
    """One side of the pmean (0: into it, 1: out of it): a row per device, a
    column per value, coloured on one scale per column for both sides."""
    import matplotlib
    from matplotlib.colors import TwoSlopeNorm

    cmap = matplotlib.colormaps["RdBu_r"]
    n = values.shape[0]
    for j in range(len(columns)):  # one colour scale per column, in and out
        scale = max(*(float(np.max(np.abs(side[:, j]))) for side in both), 1e-12)
        norm = TwoSlopeNorm(0.0, -scale, scale)
        for d in range(n):
            value = float(values[d, j])
            ax.add_patch(matplotlib.patches.Rectangle(
                (j, d), 1, 1, facecolor=cmap(0.15 + 0.7 * norm(value)),
                edgecolor="white", linewidth=1.5))
            ax.text(j + 0.5, d + 0.5, f"{value:.2f}", ha="center", va="center",
                    fontsize=fs)
    ax.set_xlim(0, len(columns))
    ax.set_ylim(n, 0)
    ax.set_xticks(np.arange(len(columns)) + 0.5, columns, fontsize=fs,
                  family="monospace")
    ax.xaxis.tick_top()
    ax.set_yticks(np.arange(n) + 0.5, [str(d) for d in range(n)], fontsize=fs)
    ax.tick_params(length=0, pad=2)
    for side in ax.spines.values():
        side.set_visible(False)
    if narrow or col == 0:
        ax.set_ylabel("device", fontsize=fs, labelpad=2)
    titles = (("into the all-reduce:", "the device's own rows"),
              ("out of the all-reduce:", "the same average everywhere"))
    short = ("into the all-reduce: own rows", "out: the same average everywhere")
    ax.set_title(short[col] if narrow else "\n".join(titles[col]),
                 fontsize=fs + 0.5 if narrow else 12, pad=18 if narrow else 26,
                 weight="bold" if narrow else "normal")


def _all_reduce_arrow(fig, tables, narrow: bool, fs: float) -> None:
    """The pmean, as an arrow from the first table to the second."""
    from matplotlib.patches import FancyArrowPatch

    first, second = (a.get_position() for a in tables)
    if narrow:  # an arrow down from the first table to the second
        x = 0.5 * (first.x0 + first.x1)
        y0, y1 = first.y0 - 0.006, second.y1 + 0.045
        fig.patches.append(FancyArrowPatch(
            (x, y0), (x, y1), transform=fig.transFigure, arrowstyle="-|>",
            mutation_scale=16, linewidth=1.6, color="#444444"))
        fig.text(x + 0.03, 0.5 * (y0 + y1), "all-reduce: lax.pmean\n(loss, gradients)",
                 ha="left", va="center", fontsize=fs)
    else:
        x0, x1 = first.x1, second.x0
        y = 0.5 * (second.y0 + second.y1)
        fig.patches.append(FancyArrowPatch(
            (x0 + 0.01, y), (x1 - 0.035, y), transform=fig.transFigure,
            arrowstyle="-|>", mutation_scale=22, linewidth=2, color="#444444"))
        fig.text(0.5 * (x0 + x1) - 0.012, y + 0.015, "all-reduce:\nlax.pmean\n"
                 "(loss, grads)", ha="center", va="bottom", fontsize=fs)


def _loss_curves(ax, record: DpAdamTrace, narrow: bool, fs: float) -> None:
    """The loss of every step, data parallel over the one-device run."""
    steps = np.arange(1, record.n_steps + 1)
    ax.plot(steps, record.losses_one_device, color="#444444", linewidth=2.5,
            label="one device, whole batch")
    ax.plot(steps, record.losses, "o", color="#d62728",
            markersize=5 if narrow else 7,
            label=f"{record.n_devices} devices, data parallel")
    ax.set_xlabel("step", fontsize=fs if narrow else 11, labelpad=2)
    ax.set_ylabel("loss" if narrow else "loss before the step",
                  fontsize=fs if narrow else 11)
    every = max(1, record.n_steps // (5 if narrow else 10))
    ax.set_xticks(steps[::every])
    ax.tick_params(labelsize=fs)
    ax.grid(alpha=0.3)
    gap = float(np.max(np.abs(record.losses - record.losses_one_device)))
    agree = f"the runs agree to {gap:.0e}"
    if narrow:
        ax.set_title(f"loss per step: {agree}", fontsize=fs + 0.5, weight="bold")
    else:
        ax.set_title(f"loss per step: {agree} (parameters to "
                     f"{record.param_gap:.0e})", fontsize=12)
    ax.legend(fontsize=fs, frameon=False, loc="upper right")


def _headings(fig, record: DpAdamTrace, step: int, narrow: bool, fs: float) -> None:
    """The title (the step shown) and the layout under it."""
    n = record.n_devices
    trap = "" if record.vary else " (vary=False: the n x gradient trap)"
    if narrow:
        fig.text(0.5, 0.992, f"Data-parallel Adam on {n} devices,\nstep {step + 1}: "
                 f"local gradients in,\none average out{trap}", ha="center",
                 va="top", fontsize=fs + 1.5, weight="bold", linespacing=1.2)
        fig.text(0.5, 0.915, f"each device: {record.rows} rows of the batch; "
                 "params and\nAdam state replicated on every device", ha="center",
                 va="center", fontsize=fs, color="#333333", linespacing=1.2)
    else:
        fig.suptitle(f"Data-parallel Adam on {n} devices, step {step + 1}: local "
                     f"gradients in, one average out{trap}", fontsize=14,
                     weight="bold", y=0.985)
        fig.text(0.5, 0.94, f"each device: {record.rows} rows of the batch, its own "
                 "loss and gradients; params and Adam state replicated",
                 ha="center", fontsize=11, color="#333333")
