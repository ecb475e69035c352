"""How a recipe is presented: drawn (:class:`DiagramSpec`), timed
(:class:`BenchSpec`) and planned at scale
(:class:`PlanSpec`). Facets of a :class:`collectives.Recipe` beside its
contract; the contract itself does not need them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class DiagramSpec:
    """How :func:`collectives.diagram` draws a recipe.

    Attributes:
      dims: the small ints passed to the recipe's ``example_shapes`` (blocks
        of a few elements keep every label readable).
      relation: how an output element relates to the input: ``"combine"`` (a
        sum or mean of every device's element), ``"local"`` (computed on the
        device from its own element) or ``"copy"`` (a copy of one input
        element, found by its label).
    """

    dims: tuple[int, ...] = (2, 1)
    relation: str = "copy"


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """How ``python -m collectives bench`` times a recipe.

    Attributes:
      bare: ``bare(x, axis, n)``, the bare ``lax`` primitive the recipe's
        shard_map form is compared with (``bench --overhead``).
      kind: the HLO collective kind the recipe runs (``None``: none), which
        fixes the nccl-tests size convention and bus factor of a sweep; only
        recipes with a kind are swept.
      bare_check_vma: ``check_vma`` for the bare program (a plain
        ``all_gather`` result is varying, so its ``out_specs=P()`` needs
        ``False``: the way such code was written before the invariant gather).
      default: whether the sweep times it when ``-c`` is not given.
      jit_target: whether the jit form / shard_map form ratio has a target.
    """

    bare: Callable[..., Any]
    kind: str | None = None
    bare_check_vma: bool = True
    default: bool = False
    jit_target: bool = False


@dataclasses.dataclass(frozen=True)
class UnitBoundary:
    """What a unit inside a model runs beyond the compiled unit, per device
    (see :attr:`PlanSpec.boundary`).

    Attributes:
      flops: FLOPs (e.g. the first layer's input gradient, ``2 t D F``).
      ops: collectives, each ``(kind, bytes one device sends at the model's
        dtype, mesh axis names or None for the recipe's axes)``.
    """

    flops: float = 0.0
    ops: tuple[tuple[str, float, tuple[str, ...] | None], ...] = ()


@dataclasses.dataclass(frozen=True)
class PlanSpec:
    """How ``python -m collectives plan`` sizes a strategy for a model.

    ``model`` below is a :class:`collectives.plan.Model`: ``width``,
    ``layers``, ``seq``, ``batch``, ``heads``, ``ffn`` and ``dtype``.

    Attributes:
      label: the strategy's name in the plan's table, e.g. ``"FSDP"``.
      shapes: ``shapes(axes, model)``: the recipe's argument shapes (a tree
        of tuples, as ``example_shapes`` returns) for one ``unit`` of
        ``model``.
      unit: what one compiled program of the recipe is, in words, e.g.
        ``"4 dense layers, loss and gradients"``.
      repeats: ``repeats(axes, model)``: how many units one training step
        runs (the compiled program's collectives are counted that often).
      stored: ``stored(axes, model)``: how many units' parameters one
        device stores (a pipeline stage holds ``layers / stages`` layers but
        sends the same activations whatever that number).
      params: the indices of the arguments that are parameters.
      axis: ``"all"``: the recipe runs over every mesh axis (its ``axis=None``);
        ``"last"``: over the last mesh axis (stages, the sequence, the
        experts), the other axes split the rest or hold replicas.
      mesh_axes: how many mesh axes the recipe needs (``None``: any).
      replicas_sum_gradients: its replicas on the other mesh axes each train
        on their share of the batch, so their gradients need a sum over
        those axes that the recipe (one pipeline) does not run; the plan
        adds that all-reduce by the cost model and says so.
      scope: ``"model"``: its units train the whole model (parameters,
        gradients, optimizer state), so strategies of this scope compare
        with each other; ``"layer"``: one kind of layer (attention, experts)
        whose cost adds to a model strategy's.
      work: ``work(axes, model)``: how many units' computation one step runs
        (default: ``repeats``; a pipeline stage computes its share of the
        layers but sends one unit's activations whatever that share).
      serial: which of its collectives the computation waits for (the
        critical path): ``"none"``, ``"last"`` (those over the last mesh axis
        alone: tensor parallelism's activation sums, a pipeline's sends) or
        ``"all"`` (an all-to-all between layers).
      overlap: what computation hides the others: ``"backward"`` (gradient
        sums overlap the backward pass, two thirds of a step's FLOPs) or
        ``"compute"`` (FSDP's gathers overlap the layers before them; a
        ring's sends the block it computes).
      boundary: ``boundary(axes, model, form)``: what each unit after the
        model's first runs that the compiled unit does not, because the
        compiled unit takes its input as data and a unit inside the model
        takes it as an activation (its input gradient, and what that
        needs): a :class:`collectives.UnitBoundary`; ``None``: nothing.
      activations: ``activations(axes, model, remat, schedule)``: the
        activation elements one device keeps for the backward pass over a
        whole step, as the recipe's program keeps them (``remat=False``) and
        with each layer rematerialized from its input (``remat=True``), under
        a pipeline ``schedule`` (``"gpipe"`` or ``"1f1b"``; others ignore
        it); ``None``: not modelled (one kind of layer, forward only).
      note: ``note(axes, model, schedule)``: a line the plan prints under
        its table about this strategy at this scale (a pipeline's bubble).
      variant: ``variant(microbatches)``: the recipe with another microbatch
        count (a pipeline; ``plan --microbatches``).
    """

    label: str
    shapes: Callable[..., Any]
    unit: str
    repeats: Callable[..., float]
    stored: Callable[..., float] | None = None
    params: tuple[int, ...] = (0,)
    axis: str = "all"
    mesh_axes: int | None = None
    scope: str = "model"
    replicas_sum_gradients: bool = False
    work: Callable[..., float] | None = None
    serial: str = "none"
    overlap: str = "backward"
    activations: Callable[..., float] | None = None
    boundary: Callable[..., UnitBoundary] | None = None
    note: Callable[..., str] | None = None
    variant: Callable[[int], Any] | None = None

    def __post_init__(self) -> None:
        if self.serial not in ("none", "last", "all"):
            raise ValueError(f"{self.label}: serial={self.serial!r}; expected "
                             "'none', 'last' or 'all'.")
        if self.overlap not in ("backward", "compute"):
            raise ValueError(f"{self.label}: overlap={self.overlap!r}; expected "
                             "'backward' or 'compute'.")
        if self.axis not in ("all", "last"):
            raise ValueError(f"{self.label}: axis={self.axis!r}; expected 'all' or "
                             "'last'.")
        if self.scope not in ("model", "layer"):
            raise ValueError(f"{self.label}: scope={self.scope!r}; expected 'model' "
                             "or 'layer'.")
