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
remat policy asks for, so the figure shows the ones the compiler merged away.

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

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from collectives import _figure
from collectives._devices import make_mesh
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
    "FSDP on 8 devices: the collectives of recipes/fsdp.py's shard_map form "
    "(value_and_grad_shard_map, MLP widths 8-16-24-32-8) as they appear in the "
    f"program compiled by JAX {jax.__version__}'s XLA, in program order, each "
    "attributed to its layer by its operand shape, with the bytes each device "
    "sends; below, what one device holds of each layer against the layer "
    "gather_layer assembles, from a run on blocks filled with their device's "
    "index. Dashed boxes are backward re-gathers of the program as written "
    "that the compiler merged into the forward gathers (JAX 0.10's XLA:CPU "
    "does; JAX 0.12's keeps them).")


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

_SHORT = {"all-gather": "AG", "reduce-scatter": "RS", "all-reduce": "AR",
          "all-to-all": "A2A", "collective-permute": "CP"}
_PHASE_NAME = {FORWARD: "gather, forward", BACKWARD: "re-gather, backward",
               GRADIENT: "reduce-scatter of grad", OTHER: "other"}


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


def _slots(record: FsdpTrace):
    """(program position or None, step): the compiled steps in order, with a
    ghost (None) for each merged re-gather just before its layer's scatter."""
    merged = set(record.merged)
    slots = []
    for position, step in enumerate(record.steps):
        if step.phase == GRADIENT and step.layer in merged:
            slots.append((None, Step("all-gather", step.layer, BACKWARD, 0.0, 0,
                                     step.group)))
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
                else "merged (as written only)")
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


def draw(record: FsdpTrace, path, width: str = "wide") -> None:
    """Write the SVG: the collectives per layer in program order (top) and one
    device's blocks against the gathered layers (bottom)."""
    import matplotlib  # optional: the docs extra

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.patches import Rectangle

    colour = {FORWARD: "#6a9fd8", BACKWARD: "#b8d4f0", GRADIENT: "#f0a04b",
              OTHER: "#bbbbbb"}
    layers = record.layers
    slots = _slots(record)
    fig = Figure(figsize=(10, 8.8))
    fig.suptitle(_title(record) + "\n" + _summary(record), fontsize=12, y=0.99)

    # top: one row per layer (and one for the rest), one column per collective
    ax = fig.add_axes((0.1, 0.54, 0.87, 0.34))
    other_row = layers + 1
    for x, (position, step) in enumerate(slots):
        row = step.layer if step.layer else other_row
        ghost = position is None
        ax.add_patch(Rectangle(
            (x + 0.05, row - 0.42), 0.9, 0.84,
            facecolor="white" if ghost else colour[step.phase],
            edgecolor="#4a7ab0" if ghost else "#333333",
            linestyle="--" if ghost else "-", lw=1.4 if ghost else 0.8))
        label = ("re-\ngather\nmerged" if ghost else
                 f"{_SHORT.get(step.kind, step.kind)}\n{step.bytes:,.0f} B")
        ax.text(x + 0.5, row, label, ha="center", va="center",
                fontsize=10.5, color="#2f5f96" if ghost else "black")
    forward_end = max((x for x, (_, s) in enumerate(slots) if s.phase == FORWARD),
                      default=-1)
    ax.axvline(forward_end + 1, color="#555555", lw=1.2, ls=":")
    ax.text(forward_end + 0.95, 0.45, "forward | backward ", ha="center",
            va="bottom", fontsize=10.5)
    ax.set_xlim(0, len(slots))
    ax.set_ylim(other_row + 0.6, 0.4)
    ax.set_yticks(range(1, other_row + 1),
                  [f"layer {k}" for k in range(1, layers + 1)] + ["loss / other"],
                  fontsize=11)
    ax.set_xticks(np.arange(len(slots)) + 0.5,
                  ["-" if p is None else str(p) for p, _ in slots], fontsize=10.5)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_xlabel("position in the compiled program (collectives only; "
                  "'-': only in the program as written)", fontsize=10.5)
    handles = [Patch(facecolor=colour[FORWARD], edgecolor="#333333",
                     label="all-gather (forward)")]
    if record.of(BACKWARD):
        handles.append(Patch(facecolor=colour[BACKWARD], edgecolor="#333333",
                             label="all-gather (backward re-gather)"))
    if record.merged:
        handles.append(Patch(facecolor="white", edgecolor="#4a7ab0", linestyle="--",
                             label="re-gather merged by the compiler"))
    handles += [Patch(facecolor=colour[GRADIENT], edgecolor="#333333",
                      label="reduce-scatter (gradient)"),
                Patch(facecolor=colour[OTHER], edgecolor="#333333",
                      label="all-reduce (loss" + (", TP sums)" if record.model > 1
                                                  else ")"))]
    fig.legend(handles=handles, loc="upper center", ncol=2, fontsize=10.5,
               frameon=False, bbox_to_anchor=(0.53, 0.465))

    # bottom: per layer, the gathered layer in blocks by source device
    bx = fig.add_axes((0.1, 0.065, 0.87, 0.24))
    shades = matplotlib.colormaps["tab10"]
    widest = float(record.gathered.max())
    for k in range(1, layers + 1):
        owners = record.owners[k - 1]
        total = float(record.gathered[k - 1])
        per_slice = total / len(owners)
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
                (start * per_slice, k - 0.35), (end - start) * per_slice, 0.7,
                facecolor=face,
                edgecolor="black" if mine else "white", lw=1.6 if mine else 0.8))
            if (end - start) * per_slice > 0.03 * widest:
                bx.text((start + end) / 2 * per_slice, k, str(who), ha="center",
                        va="center", fontsize=10.5, color="white" if mine else "black")
            start = end
        bx.text(total + 0.01 * widest, k,
                f"device 0 holds {int(record.held[k - 1]):,} B "
                f"(1/{record.devices}); gathered {int(total):,} B",
                va="center", fontsize=10.5)
    bx.set_xlim(0, widest * 1.62)
    bx.set_ylim(layers + 0.6, 0.4)
    bx.set_yticks(range(1, layers + 1), [f"layer {k}" for k in range(1, layers + 1)],
                  fontsize=11)
    bx.tick_params(labelsize=10.5)
    for side in ("top", "right"):
        bx.spines[side].set_visible(False)
    bx.set_xlabel("bytes of the layer's weight + bias on one device "
                  "(blocks numbered by the device they came from)", fontsize=10.5)
    bx.set_title("what device 0 holds (dark block) vs the full layer "
                 "gather_layer assembles", fontsize=11, loc="left")
    _figure.save(fig, path)
