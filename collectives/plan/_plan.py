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
import math
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from collectives._args import MAX_CPU_DEVICES
from collectives._registry import RECIPES
from collectives.hlo import bytes_moved
from collectives.plan._child import run_child
from collectives.plan._model import Model
from collectives.plan._profiles import Profile
from collectives.plan._profiles import profile_from
from collectives.plan._profiles import profile_json

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


def compile_units(names: Sequence[str], shape: Sequence[int], *,
                  recipes: Sequence[str], forms: Sequence[str] = ("shard_map",),
                  model: Model | None = None, dims: Sequence[int] = (2, 3),
                  dtype: str = "float32", topology: str | None = None,
                  timeout: float = 600) -> dict[str, Any]:
    """Compile one unit of each recipe for the mesh, in a child process with
    ``prod(shape)`` simulated CPU devices; the worker's JSON document.

    With ``topology`` (a TPU topology such as ``"v5p:8x16x16"``), the TPU
    compiler compiles for that topology's devices instead (no TPU needed:
    the ``jax[tpu]`` extra's compiler), in ``dtype`` as given.

    Raises:
      RuntimeError: the child failed or ran past ``timeout`` seconds (it is
        killed); the message holds its last output.
    """
    check_mesh(names, shape, limit=None if topology else MAX_DEVICES)
    request = {"mesh_names": list(names), "mesh_shape": list(shape),
               "recipes": list(recipes), "forms": list(forms), "dims": list(dims),
               "dtype": dtype, "topology": topology,
               "model": None if model is None else dataclasses.asdict(model)}
    return run_child("collectives.plan._worker", request,
                     devices=None if topology else math.prod(shape), timeout=timeout,
                     what=f"compiling for {math.prod(shape)} devices")


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One strategy's training step at the plan's scale, per device.

    Attributes:
      label: the strategy, e.g. ``"FSDP"``.
      recipe: the recipe compiled.
      axis: the mesh axes it runs over (``"data,model"``).
      unit: what one compiled program is, and ``repeats`` how many a step runs.
      collectives: ``{kind: count}`` per step.
      sent: bytes one device sends per step; ``sent_by_axes`` split by the
        mesh axes each collective runs over (``"model"``, ``"data,model"``).
      seconds: the predicted time of the step's collectives, run one after
        another (no overlap with compute or with each other).
      params: parameter bytes one device stores (the unit's shards, times
        the units it stores); ``optimizer``: Adam's two moments of them.
      temp: the compiled unit's temporary bytes per device (XLA's memory
        analysis): activations and buffers of one unit, at the model's
        dtype (compiled in float32, scaled by the itemsize).
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
    """

    label: str
    recipe: str
    axis: str = ""
    unit: str = ""
    repeats: float = 0.0
    collectives: Mapping[str, int] = dataclasses.field(default_factory=dict)
    sent: float = 0.0
    sent_by_axes: Mapping[str, float] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    params: float = 0.0
    optimizer: float = 0.0
    temp: float = 0.0
    cost_model: str | None = None
    skipped: str | None = None
    compile_s: float = 0.0
    scope: str = "model"
    added: str | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """What :func:`plan` returns: the rows and what they were computed for."""

    model: Model
    mesh: Mapping[str, int]
    form: str
    interconnect: Mapping[str, Profile]
    rows: tuple[PlanRow, ...]
    jax: str
    seconds: float
    compiler: str = "XLA:CPU, simulated devices"

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
                "compiler": self.compiler,
                "interconnect": {axis: profile_json(p)
                                 for axis, p in self.interconnect.items()},
                "rows": [dataclasses.asdict(row) for row in self.rows]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Plan:
        """The plan :meth:`as_json` wrote (``plan --json`` holds a list)."""
        return cls(model=Model(**doc["model"]), mesh=dict(doc["mesh"]),
                   form=doc["form"], jax=doc["jax"], seconds=doc["seconds"],
                   compiler=doc.get("compiler", "XLA:CPU, simulated devices"),
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


def step_row(unit: Mapping[str, Any], model: Model, mesh: Mapping[str, int],
             interconnect: Mapping[str, Profile]) -> PlanRow:
    """A :class:`PlanRow` from one compiled unit (the worker's dict)."""
    recipe = RECIPES[unit["recipe"]]
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
    counts: dict[str, int] = {}
    by_axes: dict[str, float] = {}
    seconds = 0.0
    for op in unit["ops"]:
        sent = op["bytes"] * (scale if op["dtype"] == "f32" else 1.0)
        counts[op["kind"]] = counts.get(op["kind"], 0) + 1
        key = ",".join(op["axes"])
        by_axes[key] = by_axes.get(key, 0.0) + sent * repeats
        seconds += repeats * link_for(op["axes"], interconnect).seconds(
            op["kind"], sent)
    params = unit["memory"]["params"] * stored * scale
    axis = unit["axis"]
    others = [name for name in mesh if axis is not None and name != axis]
    added = None
    if spec.replicas_sum_gradients and others and axes.others_size > 1:
        # the replicas' gradient sum the recipe leaves out: one all-reduce
        # of the stored parameters' gradients over the other axes, by the
        # cost model
        sent = bytes_moved("all-reduce", params, axes.others_size)
        counts["all-reduce"] = counts.get("all-reduce", 0) + 1 / repeats
        key = ",".join(others)
        by_axes[key] = by_axes.get(key, 0.0) + sent
        seconds += link_for(others, interconnect).seconds("all-reduce", sent)
        added = (f"one all-reduce of its {params / 1e9:.2f} GB of gradients over "
                 f"{key} (its replicas' sum, which the recipe leaves out; by the "
                 "cost model, not compiled)")
    return PlanRow(
        label=spec.label, recipe=recipe.name,
        axis=",".join(mesh) if axis is None else axis, unit=spec.unit,
        repeats=repeats,
        collectives={kind: round(n * repeats) for kind, n in counts.items()},
        sent=sum(by_axes.values()), sent_by_axes=by_axes, seconds=seconds,
        params=params, optimizer=2 * params,
        temp=float(unit["memory"]["temp"] or 0) * scale,
        cost_model=unit["cost_model"], compile_s=unit["compile_s"],
        scope=spec.scope, added=added)


class _Axes:
    """What a PlanSpec's ``repeats``/``stored`` read of the recipe's axes:
    ``size`` (the devices along the axes it runs over) and ``others_size``."""

    def __init__(self, mesh: Mapping[str, int], axis: str | None):
        names = list(mesh) if axis is None else [axis]
        self.size = math.prod(mesh[n] for n in names)
        self.others_size = math.prod(mesh.values()) // self.size


def plan(model: Model, mesh: Mapping[str, int], *,
         interconnect: Profile | Mapping[str, Profile], form: str = "shard_map",
         recipes: Sequence[str] | None = None, topology: str | None = None,
         timeout: float = 600) -> Plan:
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
        simulated CPU devices; needs ``pip install 'jax[tpu]'``, not a TPU.

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
    names, shape = tuple(mesh), tuple(mesh.values())
    check_mesh(names, shape, limit=None if topology else MAX_DEVICES)
    links = (dict.fromkeys(names, interconnect) if isinstance(interconnect, Profile)
             else dict(interconnect))
    if set(links) != set(names):
        raise ValueError(f"interconnect: names axes {sorted(links)}, the mesh has "
                         f"{list(names)}. Fix: give one profile for every mesh axis.")
    if form not in ("shard_map", "jit"):
        raise ValueError(f"form: expected 'shard_map' or 'jit', got {form!r}.")
    doc = compile_units(names, shape, recipes=recipes or planned_recipes(),
                        forms=(form,), model=model, timeout=timeout,
                        topology=topology,
                        # XLA:CPU widens 16-bit float collectives: compile in
                        # float32 there and count them at the model's dtype
                        dtype=model.dtype if topology else "float32")
    rows = tuple(step_row(unit, model, dict(mesh), links) for unit in doc["units"])
    return Plan(model=model, mesh=dict(mesh), form=form, interconnect=links,
                rows=rows, jax=doc["jax"], seconds=doc["seconds"],
                compiler=f"TPU compiler, topology {topology}" if topology
                else "XLA:CPU, simulated devices")
