"""Data parallelism and DP x Megatron tensor parallelism, read from real
compiled programs of ``recipes/dp_tp_mlp.py``.

:func:`trace` builds the file's own shard_map form
(``value_and_grad_shard_map``) twice on 8 devices, at the sizes of the
file's ``main()``: 8-way data parallel (every parameter whole on every
device) and 4-way data x 2-way model (Megatron on both layer pairs). It
compiles each, reads the collectives of the compiled HLO text in program
order (:func:`collectives.hlo.parse_collectives`), finds the mesh axis each
runs over from its replica groups, and names what each one sums by its
operand: over ``model`` an activation of this device's rows, ``[rows, h2]``
(the first pair's output forward; its transpose backward, the gradient
flowing out of ``W3``) or ``[rows, d_out]`` (the second pair's output);
over ``data`` the loss and every gradient block this device holds, which
XLA combines into one buffer. Both programs also run; their loss and
gradients are checked against the file's NumPy oracle.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from collectives import _figure
from collectives._devices import make_mesh
from collectives._strategy_diagrams import on_its_own_mesh
from collectives.hlo import parse_collectives
from collectives.recipes import dp_tp_mlp as dp_tp_file

DATA, MODEL = dp_tp_file.DATA, dp_tp_file.MODEL

PAIR1_OUT, PAIR2_OUT, INTO_HIDDEN2, GRADIENTS, OTHER = (
    "pair1_out", "pair2_out", "into_hidden2", "gradients", "other")
"""What a collective sums: the first layer pair's output (after ``W2``,
forward), the second's (after ``W4``), the gradient flowing out of ``W3``
into the second hidden layer (backward), the loss with every gradient, or
something else."""

_WHAT = {PAIR1_OUT: "output of layers 1-2", PAIR2_OUT: "output of layers 3-4",
         INTO_HIDDEN2: "gradient into layer 3's input",
         GRADIENTS: "loss and every gradient", OTHER: "other"}

CAPTION = (
    "One training step of recipes/dp_tp_mlp.py on 8 devices, as compiled by "
    f"JAX {jax.__version__}'s XLA: each box is one all-reduce, with the axis "
    "it runs over and the bytes each device adds up. Data parallelism sums "
    "the gradients once, at the end; with Megatron tensor parallelism each "
    "layer pair also sums its output over the 2 model devices.")


@dataclasses.dataclass(frozen=True)
class Step:
    """One collective of a compiled program: ``kind``; ``axis``, the mesh
    axis it runs over (``"data"``, ``"model"``, or the axes joined by
    ``"+"``); ``what`` it sums (``PAIR1_OUT`` ...); ``operand_bytes``, the
    buffer each device adds up; ``bytes``, what each device sends (the cost
    model of :mod:`collectives.hlo`); ``group``, devices in its group."""

    kind: str
    axis: str
    what: str
    operand_bytes: int
    bytes: float
    group: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """One layout's compiled step: ``data`` x ``model`` devices, ``rows`` of
    the batch per device, ``steps`` in program order, and the run's loss
    and largest gradient error against the NumPy oracle."""

    name: str  # the recipe's: "dp_mlp" or "dp_tp_mlp"
    data: int
    model: int
    rows: int
    steps: tuple[Step, ...]
    held_bytes: int  # the parameters one device holds
    loss: float
    loss_oracle: float
    grad_error: float  # max |grad - oracle| / max |oracle|

    def of(self, what: str) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.what == what)


@dataclasses.dataclass(frozen=True)
class DpTpTrace:
    """Both layouts' compiled steps, at ``sizes`` with ``batch`` rows."""

    jax_version: str
    backend: str
    sizes: tuple[int, ...]
    batch: int
    dp: Layout
    tp: Layout


def _held_bytes(params, specs, model: int) -> int:
    return sum(a.nbytes // (1 if specs[k] == jax.P() else model)
               for k, a in params.items())


def _attribute(ops, mesh, rows: int, sizes, held: int, item: int
               ) -> tuple[Step, ...]:
    h2, d_out = sizes[2], sizes[-1]
    steps, seen_h2 = [], False
    for op in ops:
        axis = "+".join(op.mesh_axes(mesh))
        what = OTHER
        if axis == MODEL and op.operand_bytes == rows * h2 * item:
            what = INTO_HIDDEN2 if seen_h2 else PAIR1_OUT
            seen_h2 = True
        elif axis == MODEL and op.operand_bytes == rows * d_out * item:
            what = PAIR2_OUT
        elif axis == DATA and op.operand_bytes == held + item:
            what = GRADIENTS
        steps.append(Step(op.kind, axis, what, int(op.operand_bytes),
                          float(op.bytes), int(op.group_size)))
    return tuple(steps)


def _layout(params, x, y, devices: int, model: int) -> Layout:
    if model == 1:
        mesh, model_axis, name = make_mesh((devices,), DATA), None, "dp_mlp"
    else:
        mesh = make_mesh((devices // model, model), (DATA, MODEL))
        model_axis, name = MODEL, "dp_tp_mlp"
    data = devices // model
    rows = x.shape[0] // data
    held = _held_bytes(params, dp_tp_file.param_specs(model_axis), model)
    step = jax.jit(dp_tp_file.value_and_grad_shard_map(mesh, model_axis))
    compiled = parse_collectives(step.lower(params, x, y).compile().as_text())
    loss, grads = step(params, x, y)
    loss_oracle, grads_oracle = dp_tp_file.value_and_grad_numpy(params, x, y)
    error = max(float(np.max(np.abs(np.asarray(grads[k]) - grads_oracle[k]))
                      / max(float(np.max(np.abs(grads_oracle[k]))), 1e-30))
                for k in grads_oracle)
    sizes = (*(params[f"w{k}"].shape[0] for k in range(1, 5)),
             params["w4"].shape[1])
    return Layout(name=name, data=data, model=model, rows=rows,
                  steps=_attribute(compiled.ops, mesh, rows, sizes, held,
                                   x.dtype.itemsize),
                  held_bytes=held, loss=float(loss), loss_oracle=float(loss_oracle),
                  grad_error=error)


@on_its_own_mesh
def trace(devices: int = 8, model: int = 2, sizes=dp_tp_file.SIZES,
          batch: int = dp_tp_file.BATCH, seed: int = 0) -> DpTpTrace:
    """Compile and run the file's shard_map step on ``devices`` devices,
    data parallel and ``devices // model`` x ``model`` data x model, and
    record its collectives (see the module docstring)."""
    sizes = tuple(sizes)
    if sizes[2] == sizes[-1]:
        raise ValueError(f"sizes {sizes}: h2 = d_out, so an all-reduce's operand "
                         "cannot name the activation it sums. Fix: pick "
                         "different widths for h2 and d_out.")
    params = dp_tp_file.init_params(sizes, seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.standard_normal((batch, sizes[-1])).astype(np.float32)
    return DpTpTrace(jax_version=jax.__version__, backend=jax.default_backend(),
                     sizes=sizes, batch=batch,
                     dp=_layout(params, x, y, devices, 1),
                     tp=_layout(params, x, y, devices, model))


# -- the picture and the table ------------------------------------------------


def _layout_title(layout: Layout) -> str:
    if layout.model == 1:
        return (f"{layout.data}-way data parallel: every weight whole on each "
                f"device, {layout.rows} rows of the batch each")
    return (f"{layout.data}-way data x {layout.model}-way model (Megatron): "
            f"W1, W3 split by columns, W2, W4 by rows; {layout.rows} rows each")


def text(record: DpTpTrace) -> str:
    """Both layouts' collectives in program order, as plain text."""
    lines = [f"MLP {list(record.sizes)}, batch {record.batch}, recipes/dp_tp_mlp.py's "
             f"shard_map form compiled by JAX {record.jax_version} "
             f"(XLA:{record.backend.upper()})"]
    for layout in (record.dp, record.tp):
        lines += ["", _layout_title(layout) + f" ({layout.held_bytes:,} B of "
                  "parameters per device)",
                  "pos | collective | over          | sums                           "
                  "| bytes summed | bytes sent"]
        for position, step in enumerate(layout.steps):
            lines.append(f"{position:>3} | {step.kind:<10} | "
                         f"{step.axis + f' ({step.group})':<13} | "
                         f"{_WHAT[step.what]:<30} | {step.operand_bytes:>12,} | "
                         f"{step.bytes:>10,.0f}")
        sent = sum(s.bytes for s in layout.steps)
        lines.append(f"{len(layout.steps)} all-reduce(s); each device sends "
                     f"{sent:,.0f} B a step")
    return "\n".join(lines)


# The step as the recipe writes it: the layers' matmuls, forward then
# backward, and after which one each activation's all-reduce comes.
_LAYERS = (("W1", "cols"), ("W2", "rows"), ("W3", "cols"), ("W4", "rows"))
_AFTER = {PAIR1_OUT: ("fwd", "W2"), PAIR2_OUT: ("fwd", "W4"),
          INTO_HIDDEN2: ("bwd", "W3")}
_COLOUR = {MODEL: "#f6b871", DATA: "#9cc2ea"}
_COMPUTE = {"fwd": "#ececec", "bwd": "#d2d2d2"}


def _sequence(layout: Layout) -> list[tuple[str, object, str]]:
    """The step's boxes in order: ``("compute", (weight, split), pass)``
    or ``("collective", step, pass)``."""
    split = layout.model > 1
    placed = {_AFTER[s.what]: s for s in layout.steps if s.what in _AFTER}
    out: list[tuple[str, object, str]] = []
    for weight, how in _LAYERS:
        out.append(("compute", (weight, how if split else ""), "fwd"))
        if ("fwd", weight) in placed:
            out.append(("collective", placed["fwd", weight], "fwd"))
    out.append(("compute", ("loss", ""), "fwd"))
    for weight, how in reversed(_LAYERS):
        out.append(("compute", (weight, how if split else ""), "bwd"))
        if ("bwd", weight) in placed:
            out.append(("collective", placed["bwd", weight], "bwd"))
    out += [("collective", s, "end") for s in layout.steps if s.what not in _AFTER]
    return out


def _collective_lines(step: Step, layout: Layout, narrow: bool) -> list[str]:
    what = {PAIR1_OUT: "layer 2's output", PAIR2_OUT: "layer 4's output",
            INTO_HIDDEN2: "gradient of\nlayer 3's input",
            GRADIENTS: "loss + gradients"}.get(step.what, step.what)
    size = f"{step.operand_bytes:,} B"
    if step.what in _AFTER:  # an activation of this device's rows
        size = f"{layout.rows} rows: {size}"
    if narrow:
        return [f"{step.kind} over {step.axis} ({step.group})",
                what.replace("\n", " "), size]
    return [step.kind, f"over {step.axis} ({step.group})", what, size]


def draw(record: DpTpTrace, path, width: str = "wide") -> None:
    """Write the SVG: each layout's step as boxes in program order, the
    layers' matmuls in grey and the all-reduces between them in colour; a
    row per layout (wide), or a column per layout (narrow)."""
    import matplotlib  # optional: the docs extra

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    frame = _Frame.of(record, width)
    fig = Figure(figsize=(frame.fig_w, frame.fig_h))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, frame.fig_w)
    ax.set_ylim(frame.fig_h, 0)
    ax.set_axis_off()
    for lane, (layout, run) in enumerate(zip((record.dp, record.tp), frame.runs,
                                             strict=True)):
        _lane(ax, frame, lane, layout, run)
        _lane_heading(ax, frame, lane, layout)
    _passes_and_title(ax, frame, record)
    _key(ax, frame)
    _figure.save(fig, path)


@dataclasses.dataclass(frozen=True)
class _Frame:
    """Where everything goes, in inches: each layout's run of boxes along
    the step (``runs``: kind, item, phase, start, length), the lanes, the
    figure's size and the text size."""

    narrow: bool
    fs: float
    fig_w: float
    fig_h: float
    gap: float
    places: dict
    room: dict
    runs: list
    length_of_step: float
    top: float = 0.0  # narrow: where the lanes start (down)
    lane_w: float = 0.0
    lane_x: tuple = ()
    left: float = 0.0  # wide: where the lanes start (across)
    lane_h: float = 0.0
    lane_y: tuple = ()

    @classmethod
    def of(cls, record: DpTpTrace, width: str) -> _Frame:
        narrow = width == "narrow"
        fs = _figure.font_pt(width, 9.5)  # 9.5 pt wide, 8 pt narrow
        sequences = [_sequence(layout) for layout in (record.dp, record.tp)]
        # along the step (inches): the DP x TP sequence sets the places; the
        # data-parallel one keeps each layer's place (its gaps: no collective)
        if narrow:
            fig_w, compute, collective, gap = 3.7, 0.27, 0.56, 0.07
        else:  # 9 matmul boxes and 4 collectives across 9.5 inches
            fig_w, compute, collective, gap = 10.0, 0.4, 1.3, 0.06
        # narrow: room after the loss and the last matmul for the divider's words
        room = {("loss", "fwd"): 0.2, ("W1", "bwd"): 0.2} if narrow else {}
        places, at = {}, 0.0
        for kind, item, phase in sequences[1]:
            length = compute if kind == "compute" else collective
            if kind == "compute":
                places[item[0], phase] = (at, length)
                at += room.get((item[0], phase), 0.0)
            at += length + gap
        runs = []
        for sequence in sequences:
            run, after = [], 0.0
            for kind, item, phase in sequence:
                if kind == "compute":
                    start, length = places[item[0], phase]
                    end = start + length + room.get((item[0], phase), 0.0)
                else:
                    start, length = after + gap, collective
                    end = start + length
                run.append((kind, item, phase, start, length))
                after = end
            runs.append(run)
        length_of_step = max(r[-1][3] + r[-1][4] for r in runs)
        common = dict(narrow=narrow, fs=fs, fig_w=fig_w, gap=gap, places=places,
                      room=room, runs=runs, length_of_step=length_of_step)
        if narrow:
            top = 1.3
            return cls(**common, fig_h=top + length_of_step + 1.95, top=top,
                       lane_w=1.74, lane_x=(0.07, 1.89))
        return cls(**common, fig_h=4.25, left=(fig_w - length_of_step) / 2,
                   lane_h=0.98, lane_y=(1.0, 2.45))

    def rect(self, lane: int, start: float, length: float):
        """(x, y, w, h) in inches of a box ``length`` long at ``start``."""
        if self.narrow:
            return self.lane_x[lane], self.top + start, self.lane_w, length
        return self.left + start, self.lane_y[lane], length, self.lane_h

    def end_of(self, item: str, phase: str) -> float:
        """Along the step: halfway through the gap after ``item``'s box."""
        return (sum(self.places[item, phase])
                + (self.room.get((item, phase), 0) + self.gap) / 2)


def _lane(ax, frame: _Frame, lane: int, layout: Layout, run) -> None:
    """One layout's step: its matmuls in grey, its all-reduces in colour."""
    from matplotlib.patches import FancyBboxPatch

    for kind, item, phase, start, length in run:
        x, y, w, h = frame.rect(lane, start, length)
        if kind == "compute":
            weight, split = item
            label = weight if not split else (
                f"{weight} {split}" if frame.narrow else f"{weight}\n{split}")
            face, edge = _COMPUTE["fwd" if phase == "fwd" else "bwd"], "#888888"
        else:
            label = "\n".join(_collective_lines(item, layout, frame.narrow))
            face, edge = _COLOUR.get(item.axis, "#cccccc"), "#555555"
        ax.add_patch(FancyBboxPatch(
            (x, y), w, h, boxstyle="round,pad=0,rounding_size=0.04",
            facecolor=face, edgecolor=edge, lw=0.9))
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center",
                fontsize=frame.fs, linespacing=1.2)


def _lane_heading(ax, frame: _Frame, lane: int, layout: Layout) -> None:
    """The layout's name and rows above its lane, what it sends at its end."""
    fs, length_of_step = frame.fs, frame.length_of_step
    sent = sum(s.bytes for s in layout.steps)
    count = f"{len(layout.steps)} all-reduce{'s' if len(layout.steps) > 1 else ''}"
    if frame.narrow:
        name = (f"data parallel\n{layout.data} devices" if layout.model == 1 else
                f"Megatron TP\n{layout.data} data x {layout.model} model")
        x = frame.lane_x[lane] + frame.lane_w / 2
        ax.text(x, frame.top - 0.08, f"{name}\n{layout.rows} rows a device",
                ha="center", va="bottom", fontsize=fs, weight="bold", linespacing=1.2)
        ax.text(x, frame.top + length_of_step + 0.08, f"{count}; each device\n"
                f"sends {sent:,.0f} B", ha="center", va="top", fontsize=fs)
    else:
        name = (f"{layout.data}-way data parallel: every weight whole" if
                layout.model == 1 else f"{layout.data}-way data x "
                f"{layout.model}-way model (Megatron tensor parallel)")
        y = frame.lane_y[lane] - 0.08
        ax.text(frame.left, y, f"{name}, {layout.rows} rows a device",
                ha="left", va="bottom", fontsize=fs + 0.5, weight="bold")
        ax.text(frame.left + length_of_step, y, f"{count}; each "
                f"device sends {sent:,.0f} B", ha="right", va="bottom",
                fontsize=fs + 0.5)


def _passes_and_title(ax, frame: _Frame, record: DpTpTrace) -> None:
    """Where the forward pass ends and the backward pass begins (dashed
    lines), and the title."""
    fs, fig_w = frame.fs, frame.fig_w
    loss_end, back_end = frame.end_of("loss", "fwd"), frame.end_of("W1", "bwd")
    if frame.narrow:
        top = frame.top
        for y, words in ((top + loss_end, "backward"),
                         (top + back_end, "gradients summed")):
            ax.plot([0.03, fig_w - 0.03], [y, y], color="#555555", lw=0.8,
                    ls=(0, (3, 2)), zorder=0)
            ax.text(fig_w / 2, y, words, ha="center", va="center", fontsize=fs,
                    style="italic", color="#333333",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
        ax.text(fig_w / 2, 0.1, "One training step on 8 devices:\nthe all-reduces "
                "XLA compiled, in order", ha="center", va="top", fontsize=fs + 1,
                weight="bold", linespacing=1.2)
        return
    left, lane_y, lane_h = frame.left, frame.lane_y, frame.lane_h
    for x in (left + loss_end, left + back_end):
        for y0, y1 in ((lane_y[0] - 0.32, lane_y[0] + lane_h + 0.03),
                       (lane_y[1] - 0.03, lane_y[1] + lane_h + 0.03)):
            ax.plot([x, x], [y0, y1], color="#555555", lw=0.8, ls=(0, (3, 2)))
    for x0, x1, words in ((0, loss_end, "forward"),
                          (loss_end, back_end, "backward"),
                          (back_end, frame.length_of_step, "sum")):
        ax.text(left + (x0 + x1) / 2, lane_y[0] - 0.36, words, ha="center",
                va="bottom", fontsize=fs, style="italic", color="#333333")
    ax.text(fig_w / 2, 0.08, f"One training step of the MLP {list(record.sizes)} "
            "on 8 devices: the all-reduces XLA compiled, in program order",
            ha="center", va="top", fontsize=fs + 1.5, weight="bold")


def _key(ax, frame: _Frame) -> None:
    """What the colours say: the two all-reduces, the grey matmuls, the bytes."""
    from matplotlib.patches import FancyBboxPatch

    fs = frame.fs
    key = [(_COLOUR[MODEL], "all-reduce over model: adds up the 2 halves of a "
                            "layer pair's result"),
           (_COLOUR[DATA], "all-reduce over data: adds up the gradients of the "
                           "batch's parts")]
    if frame.narrow:
        key = [(face, words.replace(": ", ":\n", 1)) for face, words in key]
        key.append((_COMPUTE["fwd"], "grey: a layer's matmuls on one\ndevice; "
                    "cols / rows: the half\nof the weight a device holds"))
        y = frame.top + frame.length_of_step + 0.55
        for face, words in key:
            ax.add_patch(FancyBboxPatch((0.07, y), 0.2, 0.16, boxstyle="round,pad=0",
                                        facecolor=face, edgecolor="#555555", lw=0.8))
            ax.text(0.34, y + 0.08, words, va="center", fontsize=fs, linespacing=1.15)
            y += 0.44
        return
    y = frame.lane_y[1] + frame.lane_h + 0.22
    x = frame.left
    for face, words in key:
        ax.add_patch(FancyBboxPatch((x, y), 0.22, 0.15, boxstyle="round,pad=0",
                                    facecolor=face, edgecolor="#555555", lw=0.8))
        ax.text(x + 0.3, y + 0.075, words, va="center", fontsize=fs)
        x += 4.85
    ax.text(frame.left, y + 0.28, "grey: a layer's matmuls on one device (forward "
            "light, backward dark); cols / rows: the weight's half of the "
            "columns or rows that a device holds.\nBytes: the buffer each "
            "device adds up (each device's rows of the activation, or its "
            "loss and gradients).", va="top", fontsize=fs, color="#333333",
            linespacing=1.3)
