"""FSDP's gathers and scatters, per layer, read from a real compiled program.

:func:`trace` builds ``recipes/fsdp.py``'s own shard_map form
(``value_and_grad_shard_map``) on 8 devices for an MLP whose four layers have
distinct widths, compiles it, and reads the collectives of the compiled HLO
text in program order (:func:`collectives.hlo.parse_collectives`). Each
collective is attributed to its layer by its operand: an all-gather's operand
is one device's flattened block of the layer (weight and bias, as
``gather_layer`` concatenates them), a reduce-scatter's the layer's whole
gradient buffer, and the widths make every layer's block a different size.
The first gather of a layer is its forward gather, a later one its backward
re-gather. The program as written (XLA's HLO before its passes, from
``lower(...).as_text(dialect="hlo")``) is read too, for the re-gathers the
remat policy asks for: the figure draws every re-gather where the program as
written has it (GPU and TPU compilers keep them) and says in one line which
ones this compiler merged into the forward gathers (JAX 0.10's XLA:CPU does:
its pipeline expands every optimization barrier, the remat's and any
``lax.optimization_barrier`` alike, before a CSE pass that then finds each
recomputed all-gather identical to the forward one).

What one device holds against the gathered layer comes from a second run: the
file's ``gather_layer`` under shard_map on marker blocks (every device's block
of every parameter filled with its index on the data axis), which shows each
device's ``1/n`` and, in the gathered layer, whose block lies where. The
traced program also runs on random inputs; its loss is checked against the
file's NumPy oracle.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from collectives import _figure
from collectives._devices import make_mesh
from collectives._strategy_diagrams import on_its_own_mesh
from collectives.hlo import parse_collectives
from collectives.hlo import shape_bytes
from collectives.recipes import fsdp as fsdp_file

SIZES = (8, 16, 24, 32, 8)
"""Layer widths: every layer's block a different size, so a collective's
operand names its layer."""
ROWS = 2  # batch rows per data-parallel device
DATA, MODEL = "data", "model"

FORWARD, BACKWARD, GRADIENT, OTHER = "forward", "backward", "gradient", "other"
"""Phases: a layer's first all-gather (before its forward use), a later one
(the backward re-gather), the reduce-scatter of its gradient, anything else
(the loss's all-reduce; with a model axis Megatron's sums over it)."""


CAPTION = (
    "FSDP (ZeRO-3) of a four-layer MLP on 8 devices, read from the program "
    f"JAX {jax.__version__} compiles: each device stores 1/8 of every layer, "
    "all-gathers a layer's parameters before its forward pass and again before "
    "its backward pass, and reduce-scatters its gradient. Bytes are what each "
    "device sends.")


@dataclasses.dataclass(frozen=True)
class Step:
    """One collective of the compiled program.

    ``layer``: 1-based, 0 when it is no layer's gather or scatter;
    ``phase``: FORWARD, BACKWARD, GRADIENT or OTHER; ``bytes``: what each
    device sends (the cost model of :mod:`collectives.hlo`); ``operand_bytes``:
    what each device passes in; ``group``: devices in its group.
    """

    kind: str
    layer: int
    phase: str
    bytes: float
    operand_bytes: int
    group: int


@dataclasses.dataclass(frozen=True, eq=False)
class FsdpTrace:
    """What one compiled FSDP step does per layer, and what a device holds.

    ``steps``: the compiled program's collectives in program order.
    ``written_regathers``: the layers the program as written gathers again
    in the backward pass. ``held[k - 1]``: bytes of layer ``k``'s weight and
    bias blocks one device stores; ``gathered[k - 1]``: bytes of the layer
    ``gather_layer`` returns; ``owners[k - 1]``: along the gathered weight's
    split dimension, the data-axis index of the device each slice came from
    (the same on every device). ``loss`` is the run's, ``loss_oracle`` the
    file's NumPy oracle's.
    """

    recipe: str
    jax_version: str
    backend: str
    devices: int  # data-axis size n
    model: int  # model-axis size t (1: plain FSDP)
    sizes: tuple[int, ...]
    steps: tuple[Step, ...]
    written_regathers: tuple[int, ...]
    held: np.ndarray
    gathered: np.ndarray
    owners: tuple[np.ndarray, ...]
    loss: float
    loss_oracle: float

    @property
    def layers(self) -> int:
        return len(self.sizes) - 1

    def of(self, phase: str, kind: str | None = None) -> tuple[Step, ...]:
        """The steps of ``phase`` (and ``kind``), in program order."""
        return tuple(s for s in self.steps if s.phase == phase
                     and (kind is None or s.kind == kind))

    @property
    def merged(self) -> tuple[int, ...]:
        """Layers re-gathered as written but not in the compiled program."""
        kept = {s.layer for s in self.of(BACKWARD)}
        return tuple(k for k in self.written_regathers if k not in kept)


def _block_bytes(arrays) -> int:
    return sum(int(a.addressable_shards[0].data.nbytes) for a in arrays)


def _marker_blocks(mesh, specs, params):
    """Every parameter placed as ``specs`` says, each device's block filled
    with the device's index on the data axis."""
    data = list(mesh.axis_names).index(DATA)
    coords = {d: idx[data] for idx, d in np.ndenumerate(mesh.devices)}
    placed = {}
    for name, value in params.items():
        sharding = NamedSharding(mesh, specs[name])
        blocks = []
        for device, index in sharding.addressable_devices_indices_map(
                value.shape).items():
            shape = value[index].shape
            blocks.append(jax.device_put(
                np.full(shape, coords[device], np.float32), device))
        placed[name] = jax.make_array_from_single_device_arrays(
            value.shape, sharding, blocks)
    return placed


def _holdings(mesh, specs, markers):
    """Run the file's ``gather_layer`` on marker blocks: per layer, bytes
    gathered, and whose block each gathered slice is."""
    every = tuple(mesh.axis_names)
    gathered, owners = [], []
    for k in range(1, len(markers) // 2 + 1):
        w_dim = specs[f"w{k}"].index(DATA)  # the weight's dim split over data

        def gather(w, b, w_dim=w_dim):
            w, b = fsdp_file.gather_layer(w, b, DATA, w_dim)
            return w[None], b[None]  # this device's copy, stacked by device

        run = jax.jit(jax.shard_map(
            gather, mesh=mesh, in_specs=(specs[f"w{k}"], specs[f"b{k}"]),
            out_specs=(P(every), P(every)), check_vma=False))
        w, b = (np.asarray(a) for a in run(markers[f"w{k}"], markers[f"b{k}"]))
        # on every device: slices along the split dim, each one device's block
        along = np.moveaxis(w, 1 + w_dim, 1).reshape(w.shape[0], w.shape[1 + w_dim], -1)
        if not (along == along[:, :, :1]).all() or not (along == along[:1]).all():
            raise RuntimeError(f"layer {k}: the gathered weight differs between "
                               "devices or mixes blocks within a slice")
        gathered.append(w[0].nbytes + b[0].nbytes)
        owners.append(along[0, :, 0].astype(int))
    return np.array(gathered), tuple(owners)


_WRITTEN_GATHER = re.compile(r"=\s*(\w+\[[^\]]*\])\S*\s+all-gather(?:-start)?\(")


def _written_regathers(text: str, gathered_bytes) -> tuple[int, ...]:
    """Layers whose all-gather appears more than once in the HLO text as
    written (found by the gathered buffer's bytes)."""
    count: dict[int, int] = {}
    for shape in _WRITTEN_GATHER.findall(text):
        layer = gathered_bytes.get(shape_bytes(shape), 0)
        count[layer] = count.get(layer, 0) + 1
    return tuple(k for k in sorted(count) if k and count[k] > 1)


def _attribute(ops, held: np.ndarray, n: int) -> tuple[Step, ...]:
    block = {int(b): k for k, b in enumerate(held, 1)}
    steps, seen = [], set()
    for op in ops:
        if op.kind == "all-gather":
            layer = block.get(op.operand_bytes, 0)
        else:  # a reduce-scatter's (or all-reduce's) operand: the whole buffer
            whole, rest = divmod(op.operand_bytes, n)
            layer = 0 if rest else block.get(whole, 0)
        phase = OTHER
        if layer and op.kind == "all-gather":
            phase = BACKWARD if layer in seen else FORWARD
            seen.add(layer)
        elif layer and op.kind == "reduce-scatter":
            phase = GRADIENT
        steps.append(Step(op.kind, layer, phase, float(op.bytes),
                          int(op.operand_bytes), int(op.group_size)))
    return tuple(steps)


@on_its_own_mesh
def trace(devices: int = 8, model: int = 1, sizes=SIZES, seed: int = 0) -> FsdpTrace:
    """Compile and run the file's shard_map FSDP step on ``devices`` devices
    (``model > 1``: FSDP x TP on a ``(devices // model, model)`` mesh) and
    record its collectives per layer (see the module docstring)."""
    n = devices // model
    if model == 1:
        mesh, model_axis = make_mesh((devices,), DATA), None
    else:
        mesh, model_axis = make_mesh((n, model), (DATA, MODEL)), MODEL
    sizes = tuple(sizes)
    params = fsdp_file.init_params(sizes, seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS * n, sizes[0])).astype(np.float32)
    y = rng.standard_normal((ROWS * n, sizes[-1])).astype(np.float32)
    specs = fsdp_file.fsdp_specs(DATA, model_axis)

    markers = _marker_blocks(mesh, specs, params)
    held = np.array([_block_bytes((markers[f"w{k}"], markers[f"b{k}"]))
                     for k in range(1, len(sizes))])
    if len(set(held.tolist())) != len(held):
        raise ValueError(f"sizes {sizes}: layers hold blocks of equal size "
                         f"({held.tolist()} bytes), so a collective's operand "
                         "cannot name its layer; pick distinct widths")
    gathered, owners = _holdings(mesh, specs, markers)

    step = fsdp_file.value_and_grad_shard_map(mesh, model_axis)
    lowered = step.lower(params, x, y)
    compiled = parse_collectives(lowered.compile().as_text())
    written = _written_regathers(lowered.as_text(dialect="hlo"),
                                 {int(g): k for k, g in enumerate(held * n, 1)})
    loss, _ = step(params, x, y)
    loss_oracle, _ = fsdp_file.value_and_grad_numpy(params, x, y)
    for array in (held, gathered, *owners):
        array.flags.writeable = False
    return FsdpTrace(
        recipe="fsdp_mlp" if model == 1 else "fsdp_tp_mlp",
        jax_version=jax.__version__, backend=jax.default_backend(),
        devices=n, model=model, sizes=sizes,
        steps=_attribute(compiled.ops, held, n), written_regathers=written,
        held=held, gathered=gathered, owners=owners,
        loss=float(loss), loss_oracle=float(loss_oracle))


# -- the picture and the table ------------------------------------------------

_PHASE_NAME = {FORWARD: "gather, forward", BACKWARD: "re-gather, backward",
               GRADIENT: "reduce-scatter of grad", OTHER: "other"}
_COLOUR = {FORWARD: "#6a9fd8", BACKWARD: "#b8d4f0", GRADIENT: "#f0a04b",
           OTHER: "#c8c8c8"}
_LEGEND = {FORWARD: "all-gather of the layer, forward",
           BACKWARD: "all-gather again, backward",
           GRADIENT: "reduce-scatter of its gradient",
           OTHER: "all-reduce of the loss"}


def _title(record: FsdpTrace) -> str:
    mesh = (f"{record.devices} devices" if record.model == 1 else
            f"{record.devices} x {record.model} devices (data x model)")
    return (f"{record.recipe}, shard_map form on {mesh}, compiled by JAX "
            f"{record.jax_version} (XLA:{record.backend.upper()})")


def _summary(record: FsdpTrace) -> str:
    fwd, bwd = len(record.of(FORWARD)), len(record.of(BACKWARD))
    rs = len(record.of(GRADIENT))
    merged = (f"; {len(record.merged)} merged into the forward gathers"
              if record.merged else "")
    return (f"{fwd} forward all-gathers, {bwd} backward re-gathers kept{merged}, "
            f"{rs} reduce-scatters")


def _merged_note(record: FsdpTrace) -> str:
    """The one line on the re-gathers this compiler merged ('' for none)."""
    if not record.merged:
        return ""
    k = len(record.merged)
    return (f"XLA:{record.backend.upper()} (JAX {record.jax_version}) merges the "
            f"{k} backward all-gathers into the forward ones; GPU and TPU "
            "compilers keep them, as drawn.")


def _slots(record: FsdpTrace):
    """(program position or None, step): the compiled steps in order, with
    each re-gather the compiler merged (None) where the program as written
    has it, just before its layer's reduce-scatter, sending what the
    layer's forward all-gather sends."""
    merged = set(record.merged)
    forward = {s.layer: s for s in record.of(FORWARD)}
    slots = []
    for position, step in enumerate(record.steps):
        if step.phase == GRADIENT and step.layer in merged:
            slots.append((None, dataclasses.replace(forward[step.layer],
                                                    phase=BACKWARD)))
        slots.append((position, step))
    return slots


def text(record: FsdpTrace) -> str:
    """The compiled collectives per layer, and the holdings, as plain text."""
    lines = [_title(record), _summary(record) + ".",
             "pos | layer | collective     | phase                  | bytes/device"]
    for position, step in _slots(record):
        pos = "-" if position is None else str(position)
        layer = str(step.layer) if step.layer else "-"
        sent = (f"{step.bytes:,.0f}" if position is not None
                else f"{step.bytes:,.0f} (merged into the forward gather)")
        lines.append(f"{pos:>3} | {layer:>5} | {step.kind:<14} | "
                     f"{_PHASE_NAME[step.phase]:<22} | {sent}")
    lines.append("layer | held by one device | gathered layer | gathered blocks "
                 "from devices (in order)")
    for k in range(1, record.layers + 1):
        owners = record.owners[k - 1]
        runs = [int(o) for i, o in enumerate(owners) if i == 0 or owners[i - 1] != o]
        lines.append(f"{k:>5} | {int(record.held[k - 1]):>12,} B | "
                     f"{int(record.gathered[k - 1]):>12,} B | "
                     + " ".join(map(str, runs)))
    return "\n".join(lines)


def figure(record: FsdpTrace, width: str = "wide"):
    """The figure :func:`draw` saves, and its boxed labels: (text, box)
    pairs, each text to lie inside its box."""
    import matplotlib  # optional: the docs extra

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    narrow = width == "narrow"
    small = _figure.font_pt(width, 9)  # _figure checks the width
    big = _figure.font_pt(width, 11)
    slots = _slots(record)
    other = "loss, TP sums" if record.model > 1 else "loss"
    mesh = f"{record.devices} devices" + (
        "" if record.model == 1 else f" x {record.model} (model)")
    title = (f"FSDP (ZeRO-3) on {mesh}: each layer's parameters all-gathered "
             "forward, all-gathered again backward, its gradient reduce-scattered")
    title = textwrap.fill(title, 44 if narrow else 74, break_on_hyphens=False)
    note = textwrap.fill(_merged_note(record), 56 if narrow else 130,
                         break_on_hyphens=False)
    fig_w = 3.7 if narrow else 10.0
    left, right = (0.92, 0.05) if narrow else (0.7, 0.1)
    row = 0.27 if narrow else 0.62  # inches per timeline row (wide: per layer)
    rows = len(slots) if narrow else record.layers + 1
    bars = 0.62 if narrow else 0.42  # inches per layer in the holdings panel
    heights = {"title": 0.16 * (title.count("\n") + 1) + 0.1,
               "ticks": 0.38 if narrow else 0.0, "timeline": rows * row,
               "axis": 0.3 if narrow else 0.4,
               "note": (0.5 if narrow else 0.3) if note else 0.0,
               "legend": 0.72 if narrow else 0.5, "holdings": record.layers * bars,
               "xlabel": 0.55 if narrow else 0.5}
    fig_h = sum(heights.values()) + (0.55 if narrow else 0.45)
    fig = Figure(figsize=(fig_w, fig_h))
    at = fig_h  # inches from the bottom, going down

    def band(name):
        nonlocal at
        at -= heights[name]
        return at / fig_h, heights[name] / fig_h

    def axes(bottom, height, left=left):
        return fig.add_axes((left / fig_w, bottom, 1 - (left + right) / fig_w,
                             height))

    y, h = band("title")
    fig.text(0.5 if not narrow else 0.02, y + h, title, ha="center" if not narrow
             else "left", va="top", fontsize=big)
    band("ticks")
    y, h = band("timeline")
    ax = axes(y, h)
    band("axis")
    boxed = _timeline(ax, record, slots, narrow, small, other)
    if note:
        y, h = band("note")
        fig.text(0.02 if narrow else left / fig_w, y + h, note, va="top",
                 fontsize=small, color="#444444")
    y, h = band("legend")
    _legend(fig, record, (y + h / 2), narrow, small)
    at -= 0.45 if narrow else 0.35  # the holdings panel's title
    y, h = band("holdings")
    bx = axes(y, h, left=0.1 if narrow else left)
    _stored(bx, record, narrow, small)
    return fig, boxed


def _timeline(ax, record, slots, narrow, font, other):
    """One box per collective in program order: wide, a column per
    collective and a row per layer; narrow, a row per collective (time runs
    down) and a column per layer."""
    from matplotlib.patches import Rectangle

    layers = record.layers
    other_lane = layers + 1
    boxed = []
    for i, (_, step) in enumerate(slots):
        lane = step.layer or other_lane
        sent = f"{step.bytes:,.0f}" + ("" if narrow else " B")
        if narrow:  # the row's label names the collective
            x, y, w, h, label = lane - 0.45, i + 0.08, 0.9, 0.84, sent
        else:
            # (more than 12 columns, as FSDP x TP's: every name on two lines)
            name = step.kind.replace("reduce-" if len(slots) <= 12 else "-",
                                     "reduce-\n" if len(slots) <= 12 else "-\n")
            x, y, w, h, label = i + 0.03, lane - 0.43, 0.94, 0.86, f"{name}\n{sent}"
        box = ax.add_patch(Rectangle((x, y), w, h, facecolor=_COLOUR[step.phase],
                                     edgecolor="#333333", lw=0.8))
        boxed.append((ax.text(x + w / 2, y + h / 2, label, ha="center",
                              va="center", fontsize=font, linespacing=1.15), box))
    lanes = [f"layer {k}" for k in range(1, layers + 1)] + [other]
    split = 1 + max((i for i, (_, s) in enumerate(slots) if s.phase == FORWARD),
                    default=-1)
    if narrow:
        ax.set_xlim(0.5, other_lane + 0.5)
        ax.set_ylim(len(slots), 0)
        ax.xaxis.tick_top()
        ax.set_xticks(range(1, other_lane + 1),
                      [lane.replace("layer ", "layer\n").replace(", ", ",\n")
                       for lane in lanes], fontsize=font)
        ax.set_yticks(np.arange(len(slots)) + 0.5,
                      [s.kind for _, s in slots], fontsize=font)
        ax.axhline(split, color="#555555", lw=1, ls=":")
        # time runs down the page: the forward pass above the line
        ax.text(2.5, split + 0.5, "forward pass above, backward pass below \u2193",
                ha="center", va="center", fontsize=font, style="italic")
        ax.set_xlabel("bytes: what each device sends", fontsize=font)
    else:
        ax.set_xlim(0, len(slots))
        ax.set_ylim(other_lane + 0.5, 0.5)
        ax.set_yticks(range(1, other_lane + 1),
                      [lane.replace(", ", ",\n") for lane in lanes], fontsize=font)
        ax.set_xticks([])
        ax.axvline(split, color="#555555", lw=1, ls=":")
        below = other_lane + 0.75
        # time runs to the right: the forward pass left of the line
        ax.text(split - 0.15, below, "forward pass \u2192", ha="right",
                va="center", fontsize=font, style="italic")
        ax.text(split + 0.15, below, "backward pass \u2192", ha="left",
                va="center", fontsize=font, style="italic")
        ax.text(len(slots), below, "(program order; bytes: what each device "
                "sends)", ha="right", va="center", fontsize=font)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    return boxed


def _legend(fig, record, middle, narrow, font):
    from matplotlib.patches import Patch

    phases = [FORWARD, BACKWARD, GRADIENT, OTHER]
    names = dict(_LEGEND)
    if record.model > 1:
        names[OTHER] = "all-reduce (loss, TP sums)"
    handles = [Patch(facecolor=_COLOUR[p], edgecolor="#333333", label=names[p])
               for p in phases]
    fig.legend(handles=handles, loc="center left" if narrow else "center",
               ncol=1 if narrow else 2, fontsize=font, frameon=False,
               bbox_to_anchor=(0.0, middle) if narrow else (0.5, middle),
               handlelength=1.4, labelspacing=0.3 if narrow else 0.5,
               columnspacing=2.0)


def _stored(bx, record, narrow, font):
    """Per layer, the gathered layer in blocks by the device each came from,
    device 0's own block dark."""
    import matplotlib
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import MaxNLocator

    shades = matplotlib.colormaps["tab10"]
    widest = float(record.gathered.max())
    n = record.devices
    for k in range(1, record.layers + 1):
        owners = record.owners[k - 1]
        total = float(record.gathered[k - 1])
        per_slice = total / len(owners)
        top = k - (0.05 if narrow else 0.35)
        tall = 0.45 if narrow else 0.7
        start = 0
        while start < len(owners):
            end = start
            while end < len(owners) and owners[end] == owners[start]:
                end += 1
            who = int(owners[start])
            mine = who == 0
            r, g, b, _ = shades(who % 10)
            mix = 0.0 if mine else 0.6
            face = tuple(mix + c * (1 - mix) for c in (r, g, b))
            bx.add_patch(Rectangle(
                (start * per_slice, top), (end - start) * per_slice, tall,
                facecolor=face, edgecolor="black" if mine else "white",
                lw=1.6 if mine else 0.8))
            if (end - start) * per_slice > (0.09 if narrow else 0.035) * widest:
                bx.text((start + end) / 2 * per_slice, top + tall / 2, str(who),
                        ha="center", va="center", fontsize=font,
                        color="white" if mine else "black")
            start = end
        held = int(record.held[k - 1])
        if narrow:
            bx.text(0, top - 0.04, f"layer {k}: device 0 stores {held:,} B "
                    f"of {int(total):,} B", va="bottom", fontsize=font)
        else:
            bx.text(total + 0.012 * widest, k, f"device 0 stores {held:,} B "
                    f"(1/{n}); all-gathered: {int(total):,} B", va="center",
                    fontsize=font)
    bx.set_xlim(0, widest * (1.04 if narrow else 1.7))
    bx.set_ylim(record.layers + 0.5, 0.5)
    if narrow:  # (few ticks: the last one's label inside the figure)
        bx.xaxis.set_major_locator(MaxNLocator(4))
        bx.set_yticks([])
        bx.spines["left"].set_visible(False)
    else:
        bx.set_yticks(range(1, record.layers + 1),
                      [f"layer {k}" for k in range(1, record.layers + 1)],
                      fontsize=font)
    bx.tick_params(labelsize=font)
    for side in ("top", "right"):
        bx.spines[side].set_visible(False)
    bx.set_xlabel("bytes of the layer's weights and biases (each\nblock "
                  "numbered by the device it comes from)" if narrow else
                  "bytes of the layer's weights and biases (each block numbered "
                  "by the device it comes from)", fontsize=font)
    bx.set_title("What device 0 stores (dark block) of each layer\nthat the "
                 "all-gather assembles" if narrow else
                 "What device 0 stores (dark block) of each layer that the "
                 "all-gather assembles", fontsize=font, loc="left")


def draw(record: FsdpTrace, path, width: str = "wide") -> None:
    """Write the SVG for ``width``'s column: the collectives per layer in
    program order (top) and one device's blocks against the gathered layers
    (bottom)."""
    fig, _ = figure(record, width)
    _figure.save(fig, path)
