"""A plan: each strategy's collectives, bytes, memory and time per step.

:func:`plan` compiles one unit of each strategy recipe for the mesh in a
child process with that many simulated CPU devices (:func:`compile_units`),
then counts what a training step sends (the unit's collectives times the
units per step), what each device stores, and what the collectives cost on
the chosen interconnect, link by link: a collective over a mesh axis costs
what that axis's profile says, one over several axes what the slowest of
theirs says.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from collectives._args import MAX_CPU_DEVICES
from collectives._facts.pipeline import SCHEDULES
from collectives._presentation import UnitBoundary
from collectives._registry import RECIPES
from collectives.hlo import bus_factor
from collectives.hlo import bytes_moved
from collectives.plan._child import run_child
from collectives.plan._compile import planned_recipe
from collectives.plan._model import Model
from collectives.plan._profiles import Profile
from collectives.plan._profiles import profile_from
from collectives.plan._profiles import profile_json
from collectives.plan._profiles import spanned
from collectives.plan._targets import TARGETS
from collectives.plan._targets import target_named
from collectives.plan._targets import target_of_topology

MAX_DEVICES = MAX_CPU_DEVICES
"""The most devices a plan compiles for: XLA's CPU client refuses more."""


def planned_recipes() -> list[str]:
    """The recipes with a plan (:class:`collectives.PlanSpec`), in registry order."""
    return [name for name, recipe in RECIPES.items() if recipe.plan is not None]


def default_mesh(devices: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``(names, shape)`` of the plan's mesh for ``devices``: ``data x model``
    with 8 devices on the inner axis (a node of 8 accelerators) from 16
    devices up, 2 below."""
    inner = 8 if devices >= 16 else 2
    if devices < 2 * inner or devices % inner:
        raise ValueError(f"devices: {devices} does not split into a data x model mesh "
                         f"with {inner} on model. Fix: pick a multiple of {inner} (at "
                         f"least {2 * inner}), or give --mesh.")
    return ("data", "model"), (devices // inner, inner)


def check_mesh(names: Sequence[str], shape: Sequence[int],
               limit: int | None = MAX_DEVICES) -> None:
    """Raise a clear ``ValueError`` for a mesh a plan cannot compile (more
    than ``limit`` simulated devices among them)."""
    if not names or len(names) != len(shape) or len(names) > 2:
        raise ValueError(f"mesh: expected one or two named axes, e.g. data=256,"
                         f"model=8, got {dict(zip(names, shape, strict=False))}.")
    if len(set(names)) != len(names) or any(s < 1 for s in shape):
        raise ValueError(f"mesh: axis names must differ and sizes be positive, got "
                         f"{dict(zip(names, shape, strict=False))}.")
    total = math.prod(shape)
    if limit is not None and total > limit:
        raise ValueError(
            f"mesh: {total} devices; XLA's CPU client compiles for at most "
            f"{MAX_DEVICES} ('Multiprocess computations aren't implemented on the CPU "
            "backend' past that). Fix: plan at 2048 devices or fewer; the bytes per "
            "device of these layouts depend on the axis sizes, which you can "
            "keep.")


def torus_spans(mesh: Mapping[str, int], links: Mapping[str, Profile],
                topology: str | None = None) -> dict[str, int]:
    """How many axes of its torus each mesh axis spans, for the axes on a
    torus link (:attr:`Profile.torus`; 1 for the others): the torus of the
    mesh's chips (``topology``, else the target's for as many chips), its
    axes dealt to the mesh axes innermost first, each mesh axis taking the
    torus axes whose sizes multiply to its size (1 where none do, or where
    the chips make no slice)."""
    spans = dict.fromkeys(mesh, 1)
    topology = topology if topology and ":" in topology else None  # a TPU's
    tori = {p.torus for p in links.values() if p.torus}
    if len(tori) != 1:
        return spans
    try:
        topology = topology or TARGETS[tori.pop()].topology(math.prod(mesh.values()))
    except ValueError:
        return spans
    free = [int(d) for d in topology.partition(":")[2].split("x")]
    for axis in reversed(list(mesh)):
        for k in range(1, len(free) + 1):
            chosen = next((c for c in itertools.combinations(range(len(free)), k)
                           if math.prod(free[i] for i in c) == mesh[axis]), None)
            if chosen is not None:
                free = [d for i, d in enumerate(free) if i not in chosen]
                spans[axis] = k if links[axis].torus else 1
                break
    return spans


def resolve_target(target: str | None, topology: str | None,
                   devices: int) -> tuple[str | None, str | None]:
    """``(target, topology)`` for a plan: a target's topology for this many
    devices (:meth:`Target.topology`), or a TPU topology's target; both
    ``None`` for XLA:CPU's simulated devices.

    Raises:
      ValueError: an unknown target, a topology of another target, or a
        device count the target has no topology of.
    """
    if target is not None:
        chosen = target_named(target)
        if topology is None:
            return target, chosen.topology(devices)
        if chosen.platform == "tpu" and target_of_topology(topology) is not chosen:
            raise ValueError(f"--topology {topology!r} is not a {chosen.chip} "
                             f"topology, and --target {target} asks for one. Fix: "
                             "drop one of them.")
        return target, topology
    if topology is None:
        return None, None
    return target_of_topology(topology).name, topology


def compile_units(names: Sequence[str], shape: Sequence[int], *,
                  recipes: Sequence[str], forms: Sequence[str] = ("shard_map",),
                  model: Model | None = None, dims: Sequence[int] = (2, 3),
                  dtype: str = "float32", topology: str | None = None,
                  target: str | None = None, microbatches: int | None = None,
                  axis: Sequence[str] | None = None,
                  timeout: float = 600) -> dict[str, Any]:
    """Compile one unit of each recipe for the mesh, in a child process with
    ``prod(shape)`` simulated CPU devices; the worker's JSON document.

    With ``target`` (a key of :data:`collectives.plan.TARGETS`: ``"h100"``,
    ``"v5p"``, ...) or ``topology`` (a TPU topology such as
    ``"v5p:8x16x16"``), the target's own compiler compiles for its devices
    instead (no accelerator needed: the ``target`` extra's compilers), in
    ``dtype`` as given; the document's ``compiler`` names it and its version.
    ``axis``: the collective axes (default: each plan's own).

    Raises:
      ValueError: a target or topology that does not fit the mesh.
      RuntimeError: the child failed or ran past ``timeout`` seconds (it is
        killed); the message holds its last output.
    """
    target, topology = resolve_target(target, topology, math.prod(shape))
    check_mesh(names, shape, limit=None if topology else MAX_DEVICES)
    request = {"mesh_names": list(names), "mesh_shape": list(shape),
               "recipes": list(recipes), "forms": list(forms), "dims": list(dims),
               "dtype": dtype, "topology": topology, "target": target,
               "microbatches": microbatches,
               "axis": None if axis is None else list(axis),
               "model": None if model is None else dataclasses.asdict(model)}
    # JAX_PLATFORMS=cpu: the CUDA plugin then skips its check for CUDA
    # libraries a compile-only run does not need
    return run_child("collectives.plan._worker", request,
                     devices=None if topology else math.prod(shape), timeout=timeout,
                     what=f"compiling for {math.prod(shape)} devices",
                     env={"JAX_PLATFORMS": "cpu"} if topology else None)


PRECISIONS = {
    "mixed": "compute in the model's dtype; float32 master weights and Adam "
             "moments (16 bytes a parameter in bfloat16)",
    "pure": "weights, gradients and Adam moments all in the model's dtype",
}
"""The precision policies ``--precision`` takes, and what each keeps."""


def state_bytes_per_parameter(precision: str, itemsize: int) -> float:
    """Bytes a device keeps per parameter it stores: weights and gradients
    in the model's dtype, Adam's two moments (and a float32 master copy of
    16-bit weights) as ``precision`` says."""
    if precision == "mixed":
        return 2 * itemsize + (4 if itemsize < 4 else 0) + 8
    if precision == "pure":
        return 4 * itemsize
    raise ValueError(f"precision: expected one of {', '.join(PRECISIONS)}, got "
                     f"{precision!r}.")


def model_flops_per_device(model: Model, devices: int) -> float:
    """The FLOPs a training step of ``model``'s MLPs needs per device:
    ``6 N T`` (forward 2, backward 4 per parameter and token) over the
    devices, less the first layer's input gradient (``2 D F`` per token),
    which no program computes (no gradient flows into the data)."""
    return ((6 * model.parameters - 2 * model.width * model.ffn) * model.tokens
            / devices)


BACKWARD_SHARE = 2 / 3
"""The backward pass's share of a training step's FLOPs (twice the
forward's), the computation gradient sums overlap."""


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One strategy's training step at the plan's scale, per device.

    Attributes:
      label: the strategy, e.g. ``"FSDP"``.
      recipe: the recipe compiled.
      axis: the mesh axes it runs over (``"data,model"``).
      unit: what one compiled program is, and ``repeats`` how many a step runs.
      collectives: ``{kind: count}`` per step, in the target's program.
      sent: bytes one device sends per step in the target's program (what
        a GPU or TPU compiler keeps: the recipe's cost model as written);
        ``sent_by_axes`` split by the mesh axes each collective runs over.
      cpu_sent: what XLA:CPU's compile of the same units sends; ``program``
        says how the two differ, ``None`` where they do not.
      rewritten: collectives per step the target's program writes otherwise
        than their kind, by how (``Collective.written``: a gather as an
        all-reduce of a zero-padded buffer, counted as the gather; a
        reduce-scatter as an all-reduce then a slice, at an all-reduce's
        bytes).
      comm_s: the predicted time of the step's collectives, one after
        another; ``serial_s`` the part the computation waits for, and
        ``exposed_s`` that with what overlapped but outlasted the
        computation hiding it (see :class:`collectives.PlanSpec`'s ``serial``
        and ``overlap``).
      flops: FLOPs one device computes per step (XLA's cost analysis of the
        units, times the units a step computes); ``model_flops``: the
        model's own, ``6 N T / devices`` for a whole-model strategy (none
        for one kind of layer). ``flops_source``: ``"compiled"`` (the
        compiler's cost analysis), ``"matmuls"`` (the compiled program's
        matmuls, where the compiler gives no analysis: XLA:GPU without a
        GPU), or ``"model"`` (neither: the model's count).
      compute_s: ``flops`` at the chip's peak in the model's dtype (``None``
        where the profile has no peak for it); ``step_s``: computation plus
        the exposed communication; ``mfu``: ``model_flops / (step_s *
        peak)``.
      tokens_per_device: the step's tokens over the devices;
        ``critical_tokens_per_device``: the tokens per device below which
        the collectives that overlap computation take longer than it (the
        step is communication-bound); ``None`` where no collective overlaps.
      params: parameter bytes one device stores (the unit's shards, times
        the units it stores); ``states``: those parameters' weights,
        gradients and optimizer state under the plan's precision policy.
      activations: bytes one device keeps for the backward pass over the
        whole step, as the recipe's program keeps them;
        ``activations_remat`` with each layer rematerialized.
      memory_bytes: the step's memory per device, ``states + activations``
        (for one kind of layer: its states and one unit's temporaries).
      temp: the compiled unit's temporary bytes per device (XLA's memory
        analysis), at the model's dtype; ``unit_arguments`` its arguments'
        bytes (the compiler's figure, ``None`` where it gives none).
      gather_serial_s, gather_hidden_s, gather_sent_by_axes: the step's
        all-gathers' share of ``serial_s``, of the overlapped time and of
        ``sent_by_axes`` (what a step of more microbatches repeats).
      accumulation: the microbatches the step's gradients accumulate over
        (1: the step's batch at once); ``remat``:
        every layer rematerialized (the recipe's own, or chosen).
      cost_model: ``None`` when the recipe's cost model matches the compiled
        program at this scale, else what differs.
      skipped: why the strategy has no row on this mesh and model, or ``None``.
      compile_s: seconds to compile the unit.
      scope: ``"model"`` (trains the whole model) or ``"layer"`` (one kind
        of layer, whose cost adds to a model strategy's), from its
        :class:`collectives.PlanSpec`.
      added: what the plan added to the compiled collectives, or ``None``:
        a pipeline's replicas need their gradients summed over the other
        axes, which the recipe does not run, so the plan adds that
        all-reduce by the cost model (and says so).
      note: what the strategy's facts say of it at this scale (a
        pipeline's schedule and bubble), or ``None``.
      schedule: on a target (``None`` on XLA:CPU, whose collectives are
        synchronous): what the target's schedule of one unit overlaps, a
        step's worth: ``ops`` and ``async`` (how many
        of the unit's collectives are asynchronous), ``comm_s`` (their
        time on the interconnect), ``hidden_s`` (the part the matmuls the
        compiler placed between an op's start and done can hide, at the
        chip's peak) and ``exposed_s`` (the rest).
      phases: ``serial_s`` and the overlapped ``hidden_s`` of each pass of
        the step, ``"forward"`` and ``"backward"``, by the name JAX gives
        each compiled collective (:attr:`collectives.hlo.Collective.phase`;
        what the compiled unit takes as data, its input's gradient, is the
        backward's); ``"unnamed"`` for those the program does not name.
    """

    label: str
    recipe: str
    axis: str = ""
    unit: str = ""
    repeats: float = 0.0
    collectives: Mapping[str, int] = dataclasses.field(default_factory=dict)
    sent: float = 0.0
    sent_by_axes: Mapping[str, float] = dataclasses.field(default_factory=dict)
    cpu_sent: float = 0.0
    program: str | None = None
    comm_s: float = 0.0
    serial_s: float = 0.0
    exposed_s: float = 0.0
    flops: float | None = None
    flops_source: str | None = None
    rewritten: Mapping[str, float] = dataclasses.field(default_factory=dict)
    model_flops: float | None = None
    compute_s: float | None = None
    step_s: float = 0.0
    mfu: float | None = None
    tokens_per_device: float = 0.0
    critical_tokens_per_device: float | None = None
    params: float = 0.0
    states: float = 0.0
    activations: float | None = None
    activations_remat: float | None = None
    memory_bytes: float = 0.0
    temp: float = 0.0
    unit_arguments: float | None = None
    gather_serial_s: float = 0.0
    gather_hidden_s: float = 0.0
    gather_sent_by_axes: Mapping[str, float] = dataclasses.field(
        default_factory=dict)
    schedule: Mapping[str, float] | None = None
    phases: Mapping[str, Mapping[str, float]] = dataclasses.field(
        default_factory=dict)
    accumulation: int = 1
    remat: bool = False
    cost_model: str | None = None
    skipped: str | None = None
    compile_s: float = 0.0
    scope: str = "model"
    added: str | None = None
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """What :func:`plan` returns: the rows and what they were computed for.

    ``chip`` and ``peak_flops`` are the accelerator the compute time is
    for (the last mesh axis's profile: the node's link names its chip), at
    the model's dtype; ``precision`` the policy the states are counted in;
    ``schedule`` and ``microbatches`` a pipeline's (``None``: the recipe's).
    """

    model: Model
    mesh: Mapping[str, int]
    form: str
    interconnect: Mapping[str, Profile]
    rows: tuple[PlanRow, ...]
    jax: str
    seconds: float
    compiler: str = "XLA:CPU, simulated devices"
    precision: str = "mixed"
    chip: str = ""
    peak_flops: float | None = None
    schedule: str = "gpipe"
    microbatches: int | None = None

    def row(self, label: str) -> PlanRow:
        """The row of strategy ``label`` (e.g. ``"FSDP"``); KeyError if none."""
        for row in self.rows:
            if row.label == label:
                return row
        raise KeyError(f"no row {label!r}; rows: {[r.label for r in self.rows]}")

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`Plan.from_json` reads it back."""
        return {"model": dataclasses.asdict(self.model), "mesh": dict(self.mesh),
                "form": self.form, "jax": self.jax, "seconds": self.seconds,
                "compiler": self.compiler, "precision": self.precision,
                "chip": self.chip, "peak_flops": self.peak_flops,
                "schedule": self.schedule, "microbatches": self.microbatches,
                "interconnect": {axis: profile_json(p)
                                 for axis, p in self.interconnect.items()},
                "rows": [dataclasses.asdict(row) for row in self.rows]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Plan:
        """The plan :meth:`as_json` wrote (``plan --json`` holds a list)."""
        return cls(model=Model(**doc["model"]), mesh=dict(doc["mesh"]),
                   form=doc["form"], jax=doc["jax"], seconds=doc["seconds"],
                   compiler=doc["compiler"], precision=doc["precision"],
                   chip=doc["chip"], peak_flops=doc["peak_flops"],
                   schedule=doc["schedule"], microbatches=doc["microbatches"],
                   interconnect={axis: profile_from(p["name"], p, "plan JSON")
                                 for axis, p in doc["interconnect"].items()},
                   rows=tuple(PlanRow(**row) for row in doc["rows"]))


def link_for(axes: Sequence[str], interconnect: Mapping[str, Profile]) -> Profile:
    """The profile a collective over ``axes`` pays: the slowest of theirs."""
    profiles = [interconnect[axis] for axis in axes] or list(interconnect.values())
    found = profiles[0]
    for other in profiles[1:]:
        found = found.slowest(other)
    return found


PHASED = ("all-reduce", "all-gather", "reduce-scatter")
"""The kinds that run over several mesh axes in phases, one per axis."""


def _unbounded(kind: str) -> float:
    """``bus_factor(kind, n)`` as ``n`` grows without bound: a collective's
    bytes with the ring's ``(n - 1)/n`` left out."""
    return 2.0 if kind == "all-reduce" else 1.0


def collective_seconds(kind: str, axes: Sequence[str], sent: float, count: float,
                       mesh: Mapping[str, int],
                       interconnect: Mapping[str, Profile]) -> float:
    """The time of ``count`` collectives of ``kind`` over mesh ``axes``
    that send ``sent`` bytes a device together (``alpha + sent / busbw``).

    Over one axis, or of a kind that does not split into phases (all-to-all,
    permute): on that axis's link (several axes: the slowest's). An
    all-reduce, all-gather or reduce-scatter over several axes runs as
    NCCL's hierarchical algorithms and XLA's decomposed collectives do: one
    phase per axis, the innermost (the mesh's last: a node's NVLink) first,
    each over its own links on what the inner phases leave (an all-reduce
    reduce-scatters inside the node, sums ``1/m`` of the data across the
    nodes, each GPU over its own NIC (a rail), and gathers inside again).
    Phases on links of their own are pipelined, chunk by chunk: the time is
    the slowest phase's, plus every phase's latency. Phases on one network
    (two axes given the same profile, a torus's excepted: each of its axes
    has its own links) take turns on its links: their bandwidth terms add
    up, over one profile to the flat collective's.

    A profile with ``whole_buffers`` charges each collective (each phase)
    its whole buffer, the ring's ``(n - 1)/n`` left out, as the scaling
    book counts.
    """
    n = math.prod(mesh[axis] for axis in (axes or mesh))
    if len(axes) < 2 or kind not in PHASED:
        profile = link_for(axes, interconnect)
        link = profile.for_kind(kind)
        if profile.whole_buffers and bus_factor(kind, n):
            sent *= _unbounded(kind) / bus_factor(kind, n)
        return count * link.alpha + sent / link.busbw
    factor = bus_factor(kind, n)
    if not factor:
        return 0.0
    whole, inner, alphas = sent / factor, 1, 0.0
    on_links: dict[str, float] = {}  # each network's seconds
    for axis in reversed(list(axes)):
        profile = interconnect[axis]
        link = profile.for_kind(kind)
        network = f"{profile.name} ({axis})" if profile.torus else profile.name
        ring = (_unbounded(kind) if profile.whole_buffers
                else bus_factor(kind, mesh[axis]))
        phase = ring * whole / inner
        on_links[network] = on_links.get(network, 0.0) + phase / link.busbw
        alphas += link.alpha
        inner *= mesh[axis]
    return count * alphas + max(on_links.values())


def target_ops(unit: Mapping[str, Any], axes: Sequence[str]) -> list[dict[str, Any]]:
    """The unit's collectives in the target's program: the compiled ones,
    with each kind's count and bytes replaced by the cost model as written
    (``unit["target"]``) where XLA:CPU compiled another. A kind's ops keep
    the mesh axes XLA:CPU ran them over; a kind it did not compile runs
    over the recipe's ``axes``. Each op: ``kind``, ``axes``, ``bytes``,
    ``count``, ``dtype``, and the ``phase`` of a compiled op (none for
    those the target adds: which pass runs them XLA:CPU's program does not
    show)."""
    compiled = [dict(op, count=1) for op in unit["ops"]]
    written = unit.get("target")
    if not written:
        return compiled
    out = []
    for kind in dict.fromkeys([*(op["kind"] for op in compiled),
                               *written["counts"]]):
        mine = [op for op in compiled if op["kind"] == kind]
        count = written["counts"].get(kind, 0)
        have = sum(op["bytes"] for op in mine)
        want = written["bytes"].get(kind, have * count / len(mine) if mine else 0.0)
        if count == 0:
            continue
        if len(mine) == count and math.isclose(have, want, rel_tol=1e-6):
            out += mine
        elif mine and count > len(mine) and want > have:
            # more than XLA:CPU keeps (a re-gather it merges into the
            # gather): its ops as compiled, the rest spread over the axes it
            # ran this kind over, in a pass its program cannot name
            out += mine
            for op in mine:
                share = op["bytes"] / have if have else 1 / len(mine)
                out.append(dict(op, bytes=(want - have) * share, phase="",
                                count=(count - len(mine)) / len(mine)))
        elif mine:  # spread over the axes XLA:CPU ran this kind over
            for op in mine:
                share = op["bytes"] / have if have else 1 / len(mine)
                out.append(dict(op, bytes=want * share, count=count / len(mine)))
        else:
            # (compiled on XLA:CPU, in float32: the cost model's bytes are too)
            out.append({"kind": kind, "axes": list(axes), "bytes": want,
                        "count": count, "dtype": "f32"})
    return out


def _difference(unit: Mapping[str, Any],
                ops: Sequence[Mapping[str, Any]]) -> str | None:
    """How XLA:CPU's compile differs from the target's program, in words."""
    def counts(items):
        found: dict[str, float] = {}
        for op in items:
            found[op["kind"]] = found.get(op["kind"], 0) + op.get("count", 1)
        return {k: round(v) for k, v in found.items()}

    cpu, target = counts(unit["ops"]), counts(ops)
    cpu_bytes = sum(op["bytes"] for op in unit["ops"])
    target_bytes = sum(op["bytes"] for op in ops)
    if cpu == target and math.isclose(cpu_bytes, target_bytes, rel_tol=1e-6):
        return None
    return (f"XLA:CPU compiles {_count_text(cpu)} a unit "
            f"({cpu_bytes / max(target_bytes, 1e-30):.3f} of the bytes) where "
            f"the target keeps {_count_text(target)}")


def _count_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "none"


class _Comm:
    """A step's collectives as they add up: counts per kind, bytes per mesh
    axes, and seconds the computation waits for (``serial``) or may hide
    (``hidden``), by the strategy's :class:`collectives.PlanSpec`."""

    def __init__(self, spec: Any, mesh: Mapping[str, int],
                 interconnect: Mapping[str, Profile]):
        self.spec, self.names, self.interconnect = spec, list(mesh), interconnect
        self.sizes = dict(mesh)
        self.counts: dict[str, float] = {}
        self.by_axes: dict[str, float] = {}
        self.serial = self.hidden = 0.0
        self.gathers = {"serial": 0.0, "hidden": 0.0}
        self.gathered: dict[str, float] = {}
        self.phases: dict[str, dict[str, float]] = {}

    def add(self, kind: str, axes: Sequence[str], sent: float, count: float,
            times: float, phase: str = "") -> None:
        """``times`` ops of ``count`` collectives of ``kind`` over ``axes``,
        sending ``sent`` bytes a device in all ``count`` together, in the
        step's ``phase`` (``"forward"``, ``"backward"``; empty: unnamed)."""
        self.counts[kind] = self.counts.get(kind, 0.0) + count * times
        key = ",".join(axes)
        self.by_axes[key] = self.by_axes.get(key, 0.0) + sent * times
        seconds = times * collective_seconds(kind, axes, sent, count, self.sizes,
                                             self.interconnect)
        waited = self.spec.serial == "all" or (self.spec.serial == "last"
                                               and list(axes) == self.names[-1:])
        if waited:
            self.serial += seconds
        else:
            self.hidden += seconds
        by_phase = self.phases.setdefault(phase or "unnamed",
                                          {"serial_s": 0.0, "hidden_s": 0.0})
        by_phase["serial_s" if waited else "hidden_s"] += seconds
        if kind == "all-gather":  # weights gathered again per microbatch
            self.gathers["serial" if waited else "hidden"] += seconds
            self.gathered[key] = self.gathered.get(key, 0.0) + sent * times


def step_row(unit: Mapping[str, Any], model: Model, mesh: Mapping[str, int],
             interconnect: Mapping[str, Profile], *, precision: str = "mixed",
             peak: float | None = None, schedule: str = "gpipe",
             microbatches: int | None = None) -> PlanRow:
    """A :class:`PlanRow` from one compiled unit (the worker's dict)."""
    recipe = planned_recipe(unit["recipe"], microbatches)
    spec = recipe.plan
    if "skipped" in unit:
        return PlanRow(label=spec.label, recipe=recipe.name, unit=spec.unit,
                       skipped=unit["skipped"], scope=spec.scope)
    axes = _Axes(mesh, unit["axis"])
    repeats = float(spec.repeats(axes, model))
    stored = float((spec.stored or spec.repeats)(axes, model))
    # compiled in float32 (XLA:CPU widens 16-bit float collectives to it):
    # float data counts at the model's dtype
    scale = model.itemsize / 4 if unit["dtype"] == "float32" else 1.0

    def at_model_dtype(op: Mapping[str, Any]) -> float:
        return op["bytes"] * (scale if op["dtype"] == "f32" else 1.0)

    recipe_axes = list(mesh) if unit["axis"] is None else [unit["axis"]]
    comm = _Comm(spec, mesh, interconnect)
    ops = target_ops(unit, recipe_axes)
    for op in ops:
        comm.add(op["kind"], op["axes"], at_model_dtype(op), op["count"], repeats,
                 op.get("phase", ""))
    # each unit after the model's first also runs what its input, an
    # activation there, needs (the compiled unit takes it as data)
    joined = max(0.0, repeats - 1)
    boundary = (spec.boundary(axes, model, unit["form"]) if spec.boundary
                else UnitBoundary())
    for kind, sent, over in boundary.ops if joined else ():  # the input's gradient
        comm.add(kind, recipe_axes if over is None else over, sent, 1, joined,
                 "backward")
    params = unit["memory"]["params"] * stored * scale
    added = _replicas_sum(spec, unit, mesh, axes, params, comm)
    flops = (None if unit.get("flops") is None else
             unit["flops"] * float((spec.work or spec.repeats)(axes, model))
             + boundary.flops * joined)
    flops_source = unit.get("flops_source", "compiled")
    if flops is None and spec.scope == "model":
        # a compiler without a cost analysis (XLA:GPU's): the model's count
        flops = model_flops_per_device(model, math.prod(mesh.values()))
        flops_source = "model"
    time = _step_time(spec, model, mesh, comm, flops, peak)
    states = params / model.itemsize * state_bytes_per_parameter(
        precision, model.itemsize)
    temp = float(unit["memory"]["temp"] or 0) * scale
    kept = kept_remat = None
    if spec.activations is not None:
        kept = spec.activations(axes, model, False, schedule) * model.itemsize
        kept_remat = spec.activations(axes, model, True, schedule) * model.itemsize
    return PlanRow(
        label=spec.label, recipe=recipe.name, axis=",".join(recipe_axes),
        unit=spec.unit, repeats=repeats,
        collectives={kind: round(n) for kind, n in comm.counts.items()},
        sent=sum(comm.by_axes.values()), sent_by_axes=comm.by_axes,
        phases=comm.phases,
        gather_sent_by_axes=comm.gathered, remat=bool(
            kept is not None and kept_remat is not None and kept <= kept_remat),
        cpu_sent=sum(map(at_model_dtype, unit["ops"])) * repeats,
        rewritten=_rewritten(ops, repeats),
        program=_difference(unit, ops), **time, flops=flops,
        flops_source=flops_source if flops is not None else None,
        params=params, states=states, activations=kept, activations_remat=kept_remat,
        memory_bytes=states + (temp if kept is None else kept), temp=temp,
        unit_arguments=(None if unit["memory"].get("arguments") is None
                        else float(unit["memory"]["arguments"]) * scale),
        cost_model=unit["cost_model"], compile_s=unit["compile_s"],
        scope=spec.scope, added=added,
        note=spec.note(axes, model, schedule) if spec.note else None,
        schedule=scheduled(unit, mesh, interconnect, peak, at_model_dtype, repeats))


def scheduled(unit: Mapping[str, Any], mesh: Mapping[str, int],
              interconnect: Mapping[str, Profile], peak: float | None,
              sent: Callable[[Mapping[str, Any]], float],
              repeats: float) -> dict[str, float] | None:
    """What the target's schedule of one unit overlaps, times ``repeats``:
    each compiled collective's time alone on the interconnect, hidden up to
    the matmuls the schedule runs between its start and its done (at
    ``peak``); ``None`` for a unit XLA:CPU compiled (its collectives are
    synchronous, not the target's) or without a peak. One unit's schedule:
    what the compiler overlaps across units, in a whole step, it does not
    show."""
    if unit.get("target") is not None or peak is None or not unit["ops"]:
        return None
    total = hidden = 0.0
    asynchronous = 0
    for op in unit["ops"]:
        if not op["axes"]:
            continue
        seconds = collective_seconds(op["kind"], op["axes"], sent(op), 1, mesh,
                                     interconnect)
        total += seconds
        if op.get("overlap_flops") is not None:
            asynchronous += 1
            hidden += min(seconds, op["overlap_flops"] / peak)
    return {"ops": len(unit["ops"]), "async": asynchronous,
            "comm_s": total * repeats, "hidden_s": hidden * repeats,
            "exposed_s": (total - hidden) * repeats}


def _rewritten(ops: Sequence[Mapping[str, Any]], repeats: float) -> dict[str, float]:
    found: dict[str, float] = {}
    for op in ops:
        if op.get("written"):
            found[op["written"]] = found.get(op["written"], 0.0) + op["count"] * repeats
    return found


def _replicas_sum(spec: Any, unit: Mapping[str, Any], mesh: Mapping[str, int],
                  axes: _Axes, params: float, comm: _Comm) -> str | None:
    """The replicas' gradient sum a recipe leaves out (a pipeline's): one
    all-reduce of the stored parameters' gradients over the other axes, by
    the cost model, added to ``comm``; what was added, in words."""
    others = [name for name in mesh if unit["axis"] is not None
              and name != unit["axis"]]
    if not (spec.replicas_sum_gradients and others and axes.others_size > 1):
        return None
    comm.add("all-reduce", others, bytes_moved("all-reduce", params, axes.others_size),
             1, 1, "backward")
    return (f"one all-reduce of its {params / 1e9:.2f} GB of gradients over "
            f"{','.join(others)} (its replicas' sum, which the recipe leaves out; "
            "by the cost model, not compiled)")


def _step_time(spec: Any, model: Model, mesh: Mapping[str, int], comm: _Comm,
               flops: float | None, peak: float | None) -> dict[str, Any]:
    """The step's times, MFU and critical tokens (:class:`PlanRow`'s fields)."""
    devices = math.prod(mesh.values())
    model_flops = (model_flops_per_device(model, devices) if spec.scope == "model"
                   else None)
    compute = None if flops is None or peak is None else flops / peak
    return _times(spec, model.tokens / devices, comm.serial, comm.hidden, compute,
                  model_flops, peak) | {
        "gather_serial_s": comm.gathers["serial"],
        "gather_hidden_s": comm.gathers["hidden"]}


def _times(spec: Any, tokens: float, serial: float, hidden: float,
           compute: float | None, model_flops: float | None,
           peak: float | None) -> dict[str, Any]:
    exposed, critical = serial + hidden, None
    if compute is not None:
        window = compute * (BACKWARD_SHARE if spec.overlap == "backward" else 1.0)
        exposed = serial + max(0.0, hidden - window)
        # the overlapped collectives (gradients, gathers) do not grow with
        # the tokens, the computation does: equal at this many tokens; one
        # kind of layer's collectives carry its activations and grow too
        if hidden and window and spec.scope == "model":
            critical = tokens * hidden / window
    step = (compute or 0.0) + exposed
    mfu = (model_flops / (step * peak)
           if model_flops and peak and compute is not None and step else None)
    return {"comm_s": serial + hidden, "serial_s": serial,
            "exposed_s": exposed, "model_flops": model_flops, "compute_s": compute,
            "step_s": step, "mfu": mfu, "tokens_per_device": tokens,
            "critical_tokens_per_device": critical}


REMAT_COMPUTE = 4 / 3
"""A step's computation with every layer rematerialized from one kept
tensor, against keeping its activations: one more forward pass (2 of the
6 N T FLOPs a token)."""


def max_accumulation(plan: Plan, row: PlanRow) -> int:
    """The most microbatches ``row``'s step splits into: its sequences per
    batch shard (the batch is split over every device, or over the data
    axis beside a model axis); 1 for a strategy that cannot accumulate (a
    pipeline schedules its own microbatches; one kind of layer)."""
    spec = planned_recipe(row.recipe, plan.microbatches).plan
    if row.skipped or spec.scope != "model" or spec.variant or row.activations is None:
        return 1
    shards = (next(iter(plan.mesh.values())) if spec.mesh_axes == 2
              else math.prod(plan.mesh.values()))
    return max(1, plan.model.batch // shards)


def fitting(plan: Plan, row: PlanRow, memory: float | None) -> PlanRow:
    """The fastest way ``row``'s step fits ``memory`` bytes per device: as
    planned, or rematerialized, or over more microbatches (powers of two up
    to :func:`max_accumulation`), or both (:func:`accumulated`). Where none
    fits, the way that needs the least memory; ``row`` itself where it fits
    as planned or cannot be run otherwise."""
    if memory is None or row.skipped or row.memory_bytes <= memory:
        return row
    most = max_accumulation(plan, row)
    if row.activations is None or row.activations_remat is None:
        return row
    counts = sorted({*(2 ** i for i in range(most.bit_length()) if 2 ** i <= most),
                     most})
    ways = [accumulated(plan, row, m, remat) for m in counts
            for remat in (False, True)]
    fit = [way for way in ways if way.memory_bytes <= memory]
    if fit:
        return min(fit, key=lambda way: way.step_s)
    return min(ways, key=lambda way: (way.memory_bytes, way.step_s))


def accumulated(plan: Plan, row: PlanRow, accumulation: int = 1,
                remat: bool = False) -> PlanRow:
    """``row``'s step run as ``accumulation`` microbatches whose gradients
    are summed once, at the end (the training recipes' deferred sums), and
    with every layer rematerialized where ``remat``.

    What changes: the activations kept are one microbatch's (with ``remat``,
    each layer's one kept tensor: ``activations_remat``); each microbatch
    gathers the weights again (the step's all-gathers, times
    ``accumulation``); the gradients' sums and the computation do not grow
    (the same tokens), except that rematerializing a recipe that keeps its
    activations computes each forward pass again (:data:`REMAT_COMPUTE`).

    Raises:
      ValueError: more microbatches than :func:`max_accumulation` allows.
    """
    most = max_accumulation(plan, row)
    if not 1 <= accumulation <= most:
        raise ValueError(f"accumulation: {accumulation} microbatches for "
                         f"{row.label}; it splits into 1 to {most}.")
    spec = planned_recipe(row.recipe, plan.microbatches).plan
    assert row.activations is not None and row.activations_remat is not None
    again = accumulation - 1
    recomputes = remat and row.activations_remat < row.activations
    compute = (None if row.compute_s is None else
               row.compute_s * (REMAT_COMPUTE if recomputes else 1.0))
    times = _times(spec, row.tokens_per_device,
                   row.serial_s + again * row.gather_serial_s,
                   row.comm_s - row.serial_s + again * row.gather_hidden_s,
                   compute, row.model_flops, plan.peak_flops)
    kept = (row.activations_remat if remat else row.activations) / accumulation
    gathered = again * sum(row.gather_sent_by_axes.values())
    by_axes = {axes: sent + again * row.gather_sent_by_axes.get(axes, 0.0)
               for axes, sent in row.sent_by_axes.items()}
    counts = {kind: n * (accumulation if kind == "all-gather" else 1)
              for kind, n in row.collectives.items()}
    return dataclasses.replace(
        row, **times, accumulation=accumulation, remat=remat or row.remat,
        flops=(None if row.flops is None else
               row.flops * (REMAT_COMPUTE if recomputes else 1.0)),
        memory_bytes=row.states + kept, sent=row.sent + gathered,
        sent_by_axes=by_axes, collectives=counts)


class _Axes:
    """What a PlanSpec's callables read of the recipe's axes: ``size`` (the
    devices along the axes it runs over), ``others_size``, and the mesh's
    ``shape`` (its axes' sizes, in order)."""

    def __init__(self, mesh: Mapping[str, int], axis: str | None):
        names = list(mesh) if axis is None else [axis]
        self.size = math.prod(mesh[n] for n in names)
        self.others_size = math.prod(mesh.values()) // self.size
        self.shape = tuple(mesh.values())
        self.names = tuple(mesh)


def plan(model: Model, mesh: Mapping[str, int], *,
         interconnect: Profile | Mapping[str, Profile], form: str = "shard_map",
         recipes: Sequence[str] | None = None, topology: str | None = None,
         target: str | None = None, precision: str = "mixed",
         schedule: str = "gpipe",
         microbatches: int | None = None, timeout: float = 600) -> Plan:
    """Plan every strategy for ``model`` on ``mesh``, compile only.

    Args:
      model: a :class:`Model` (e.g. ``MODELS["8b"]``).
      mesh: axis name to size, e.g. ``{"data": 256, "model": 8}`` (one or two
        axes, at most 2048 devices).
      interconnect: one :class:`Profile` for every axis, or one per axis.
      form: the form compiled, ``"shard_map"`` or ``"jit"``.
      recipes: the strategy recipes to plan (default: every one with a plan).
      topology: compile with the TPU compiler for this TPU topology (e.g.
        ``"v5p:8x16x16"``, as many devices as the mesh) instead of for
        simulated CPU devices; needs the compiler (the ``target`` extra,
        ``pip install 'jax[tpu,cuda12-local]'``), not a TPU.
      target: compile with this target's own compiler (a key of
        :data:`collectives.plan.TARGETS`: ``"h100"`` with XLA:GPU, ``"v5p"``,
        ``"v5e"``, ``"v6e"`` with the TPU compiler) for its topology of as
        many devices as the mesh; the collectives, bytes and memory are then
        the target's program's, and its FLOPs where its compiler counts
        them (XLA:GPU does not: the model's count, said in ``flops_source``).
      precision: how the states are kept, a key of
        :data:`collectives.plan.PRECISIONS`.
      schedule: a pipeline's, ``"gpipe"`` (the recipe's) or ``"1f1b"``
        (counted by formula: fewer activations kept, the same bubble).
      microbatches: a pipeline's microbatch count (``None``: the recipe's).

    Returns:
      A :class:`Plan`; its rows in registry order.

    Raises:
      ValueError: a mesh the plan cannot compile, or an interconnect that
        does not name every axis.

    Examples:
      >>> from collectives.plan import MODELS, load_profiles, plan
      >>> p = plan(MODELS["laptop"], {"data": 8}, recipes=["fsdp_mlp"],
      ...          interconnect=load_profiles()["ib-ndr"])
      >>> row = p.row("FSDP")  # 4 layers of 256 x 256 float32, split 8 ways
      >>> row.params == 4 * (256 * 256 + 256) * 4 / 8, row.cost_model
      (True, None)
    """
    return plan_each(model, mesh, interconnects=[interconnect], form=form,
                     recipes=recipes, topology=topology, target=target,
                     precision=precision, schedule=schedule,
                     microbatches=microbatches, timeout=timeout)[0]


def plan_each(model: Model, mesh: Mapping[str, int], *,
              interconnects: Sequence[Profile | Mapping[str, Profile]],
              form: str = "shard_map", recipes: Sequence[str] | None = None,
              topology: str | None = None, target: str | None = None,
              precision: str = "mixed", schedule: str = "gpipe",
              microbatches: int | None = None, timeout: float = 600
              ) -> tuple[Plan, ...]:
    """:func:`plan` on each of ``interconnects``, from one compile: the same
    programs on other networks (or other conventions of counting them)."""
    if isinstance(interconnects, (Profile, Mapping)) or not interconnects:
        raise ValueError(f"interconnects: {interconnects!r}; expected a list of "
                         "one or more interconnects (each a Profile, or one per "
                         "mesh axis). Fix: pass [profile], or call plan().")
    names, shape = tuple(mesh), tuple(mesh.values())
    target, topology = resolve_target(target, topology, math.prod(shape))
    check_mesh(names, shape, limit=None if topology else MAX_DEVICES)
    each = []
    for interconnect in interconnects:
        links = (dict.fromkeys(names, interconnect)
                 if isinstance(interconnect, Profile) else dict(interconnect))
        if set(links) != set(names):
            raise ValueError(f"interconnect: names axes {sorted(links)}, the mesh "
                             f"has {list(names)}. Fix: give one profile for every "
                             "mesh axis.")
        spans = torus_spans(mesh, links, topology)
        each.append({axis: spanned(p, spans[axis]) for axis, p in links.items()})
    if form not in ("shard_map", "jit"):
        raise ValueError(f"form: expected 'shard_map' or 'jit', got {form!r}.")
    state_bytes_per_parameter(precision, model.itemsize)  # a bad name raises
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {', '.join(SCHEDULES)}, got "
                         f"{schedule!r}.")
    if microbatches is not None and (not isinstance(microbatches, int)
                                     or microbatches < 1):
        raise ValueError(f"microbatches: {microbatches!r}; expected a whole number "
                         "of 1 or more.")
    doc = compile_units(names, shape, recipes=recipes or planned_recipes(),
                        forms=(form,), model=model, timeout=timeout,
                        topology=topology, target=target,
                        microbatches=microbatches,
                        # XLA:CPU widens 16-bit float collectives: compile in
                        # float32 there and count them at the model's dtype
                        dtype=model.dtype if topology else "float32")
    plans = []
    for links in each:
        chip = links[names[-1]]
        peak = chip.peak(model.dtype)
        rows = tuple(step_row(unit, model, dict(mesh), links, precision=precision,
                              peak=peak, schedule=schedule,
                              microbatches=microbatches)
                     for unit in doc["units"])
        plans.append(Plan(model=model, mesh=dict(mesh), form=form,
                          interconnect=links, rows=rows, jax=doc["jax"],
                          seconds=doc["seconds"], compiler=doc["compiler"],
                          precision=precision, chip=chip.chip, peak_flops=peak,
                          schedule=schedule, microbatches=microbatches))
    return tuple(plans)
