"""Pipeline parallelism (GPipe, SPMD): stages over a mesh axis, microbatches in flight.

The model is ``S`` dense layers ``a -> tanh(a @ w[s] + b[s])`` of width ``d``
and a mean-squared-error loss; layer ``s`` lives on stage ``s`` of the
``stage`` mesh axis (the stage parameters are stacked on a leading axis of
size ``S``, split over that axis). The batch is cut into ``M`` microbatches.

Schedule: ``M + S - 1`` ticks of one ``lax.scan``. At tick ``t`` stage 0
takes microbatch ``t``, every other stage takes what its predecessor sent at
tick ``t - 1``; each stage applies its layer and sends the result to the next
stage with one ``ppermute`` (``s -> s + 1``; stage 0 ignores what the last
stage sends round). ``axis_index``
decides what a stage does: stage 0 reads the input, the last stage records
microbatch ``t - S + 1``'s output. The backward pass is ``jax.grad`` of that
program: the transpose of each ``ppermute`` sends the cotangents back
(``s + 1 -> s``), so the gradient equals running the layers in sequence.

Every stage is busy on ``M`` of the ``M + S - 1`` ticks: the **bubble**, the
fraction of idle stage-ticks, is ``(S - 1) / (M + S - 1)``
(:func:`bubble_fraction`); it shrinks as ``M`` grows. The scan keeps every
tick's activations (GPipe); 1F1B would bound them by ``S`` microbatches (the
plan counts both: ``plan --schedule``).

The per-stage body, the global program and the NumPy oracle are
``recipes/pipeline.py``'s; this module adds the facts the library needs
about them, and the public functions validate, then call the file's.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from collectives._costs import per_device_bytes
from collectives._layout import Axes
from collectives._layout import body_axis_size
from collectives._layout import on_mesh
from collectives._presentation import PlanSpec
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation
from collectives.recipes import pipeline as file

MICROBATCHES = file.MICROBATCHES
"""``M`` of the ``pipeline_mlp`` recipe."""


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The idle fraction of a GPipe schedule, ``(S - 1) / (M + S - 1)``.

    Args:
      stages: ``S``, the pipeline stages.
      microbatches: ``M``, the microbatches per step.

    Returns:
      The fraction of stage-ticks in which a stage has no microbatch.

    Raises:
      ValueError: ``stages`` or ``microbatches`` is not a positive int.

    Examples:
      >>> from collectives import bubble_fraction
      >>> bubble_fraction(4, 4), bubble_fraction(4, 32)
      (0.42857142857142855, 0.08571428571428572)
    """
    for name, value in (("stages", stages), ("microbatches", microbatches)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}.")
    return file.bubble_fraction(stages, microbatches)


def _check_microbatches(a, microbatches: int) -> None:
    if a.shape[0] % microbatches:
        raise ValueError(
            f"pipeline: a batch of {a.shape[0]} rows does not split into "
            f"{microbatches} microbatches. Fix: use a batch that divides by "
            f"{microbatches}.")


def pipeline_value_and_grad(stage_params, x, y, *, stage_axis: str,
                            microbatches: int = MICROBATCHES):
    """Loss and this stage's gradients of the GPipe pipeline; call inside a body.

    The schedule is ``recipes/pipeline.py``'s ``pipeline_value_and_grad``.

    Args:
      stage_params: this stage's block of the stacked parameters,
        ``{"w": [1, d, d], "b": [1, d]}``.
      x: the whole batch ``[batch, d]``.
      y: the targets ``[batch, d]``.
      stage_axis: the mesh axis of the stages.
      microbatches: ``M``.

    Returns:
      ``(loss, grads)``: the full-batch loss ``sum((model(x) - y)**2) /
      batch`` on every stage (one scalar all-reduce), and this stage's
      gradients shaped like ``stage_params``.

    Examples:
      >>> import functools, jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "stage")
      >>> rng = np.random.default_rng(0)
      >>> params = {"w": rng.standard_normal((4, 3, 3)).astype(np.float32) / 2,
      ...           "b": np.zeros((4, 3), np.float32)}
      >>> x = rng.standard_normal((8, 3)).astype(np.float32)
      >>> f = jax.jit(jax.shard_map(
      ...     functools.partial(cx.pipeline_value_and_grad, stage_axis="stage"),
      ...     mesh=mesh, in_specs=(jax.P("stage"), jax.P(), jax.P()),
      ...     out_specs=(jax.P(), jax.P("stage"))))
      >>> loss, grads = f(params, x, 0 * x)
      >>> want = cx.pipeline_reference(params, x, 0 * x)
      >>> bool(np.allclose(loss, want[0], rtol=1e-5))
      True
      >>> bool(np.allclose(grads["w"], want[1]["w"], rtol=1e-4, atol=1e-6))
      True
    """
    body_axis_size(stage_axis, "pipeline_value_and_grad")
    for a in (y, x):
        _check_microbatches(a, microbatches)
    return file.pipeline_value_and_grad(stage_params, x, y, stage_axis, microbatches)


def pipeline_reference(stage_params, x, y):
    """The NumPy oracle: the layers in sequence, forward and backward by hand,
    in float64. Returns ``(loss, grads)``."""
    return file.pipeline_numpy(stage_params, x, y)


# -- the recipe ---------------------------------------------------------------

def _one_axis(axes: Axes) -> str | None:
    if len(axes.names) == 1:
        return None
    return ("needs one stage axis: the stages form a chain along one mesh axis; "
            "e.g. axis='i' on a 4x2 mesh (4 stages, 2 replicas)")


def _in_specs(axes: Axes):
    return ({"w": P(axes.entry), "b": P(axes.entry)}, P(), P())


def _out_specs(axes: Axes):
    return (P(), _in_specs(axes)[0])


def _shapes(axes: Axes, dims, *, microbatches: int = MICROBATCHES):
    width = dims[1] if len(dims) > 1 else 2
    batch = microbatches * dims[0]
    return ({"w": (axes.size, width, width), "b": (axes.size, width)},
            (batch, width), (batch, width))


def _in_dtype_of_x(fn):
    """The file's float64 oracle as the recipe's: results in ``x``'s dtype."""
    @functools.wraps(fn)
    def oracle(stage_params, x, y, *, axes: Axes):
        del axes
        return jax.tree_util.tree_map(lambda v: np.asarray(v).astype(x.dtype),
                                      fn(stage_params, x, y))
    return oracle


def _magnitudes(stage_params, x, y, *, axes: Axes):
    """The recipe's ``magnitudes`` fact: for the loss and each gradient
    element, the root-sum-square of the terms behind it.

    The file's backward pass is a chain of products and sums; run on squared
    values (the weights, the activations and the tanh slopes ``1 - a**2`` of
    the oracle's forward pass, and the squared terms of ``2 (a - y) /
    batch``) it adds up the squared terms of each gradient element. A
    gradient that cancels to near zero keeps the rounding of those terms,
    which add like a random walk: their root-sum-square, not their sum."""
    del axes
    acts, slopes = file.forward_numpy(stage_params, x)
    batch = acts[0].shape[0]
    err_sq = acts[-1] ** 2 + np.asarray(y, np.float64) ** 2  # a - y: two terms
    grads_sq = file.backward_numpy(np.asarray(stage_params["w"], np.float64) ** 2,
                                   [a ** 2 for a in acts], [s ** 2 for s in slopes],
                                   4 * err_sq / batch ** 2)
    loss = np.sqrt(np.sum(err_sq ** 2)) / batch
    return loss, {k: np.sqrt(v) for k, v in grads_sq.items()}


def _validate(axes: Axes, args, *, microbatches: int = MICROBATCHES) -> None:
    stage_params, x, y = args
    if np.shape(x)[0] % microbatches:
        raise ValueError(
            f"pipeline_mlp: x has {np.shape(x)[0]} rows, which do not split into "
            f"{microbatches} microbatches. Fix: use a batch that divides by "
            f"{microbatches}.")
    d = np.shape(x)[1]
    want = {"w": (axes.size, d, d), "b": (axes.size, d)}
    got = {k: tuple(np.shape(v)) for k, v in stage_params.items()}
    if got != want or np.shape(y) != np.shape(x):
        raise ValueError(
            f"pipeline_mlp: shapes stage_params {got}, x {np.shape(x)}, y "
            f"{np.shape(y)} do not fit {axes.size} stages of width {d}; expected "
            f"stage_params {want} and y of x's shape.")


def _n_terms(axes: Axes) -> int:
    # A gradient element: S chained layers back (a width-d sum and a tanh
    # each, d <= 3), then a sum over the batch (<= 12 rows); doubled.
    return 2 * (axes.size * 8 + 16)


def permute_count(stages: int, microbatches: int, form: str = "shard_map") -> int:
    """Collective-permutes in one compiled step (forward and backward).

    With ``T = M + S - 1`` ticks: the shard_map form sends once per tick
    forward except the last tick (its send is unused and removed), and once
    per tick backward (the transpose of that last send, a zero cotangent, is
    kept): ``2T - 1``. The jit form's partitioner writes each forward
    ``jnp.roll`` of the stage axis as two permutes (the shift of ``S - 1``
    blocks and the wrap-around block) and each backward roll as one:
    ``3T - 1``. Measured with XLA:CPU.

    Examples:
      >>> from collectives._facts.pipeline import permute_count
      >>> permute_count(4, 4), permute_count(4, 4, "jit")
      (13, 20)
    """
    ticks = microbatches + stages - 1
    return 2 * ticks - 1 if form == "shard_map" else 3 * ticks - 1


def _cost_model(microbatches: int):
    """Collective-permutes of one ``[mb, d]`` microbatch each
    (:func:`permute_count`), and one all-reduce: the loss, a scalar, from
    the last stage to every stage."""
    def fact(axes: Axes, args, form: str) -> Expectation:
        _, x, _ = args
        stages = axes.size
        block = x.nbytes // microbatches
        count = permute_count(stages, microbatches, form)
        return Expectation(
            {"collective-permute": count, "all-reduce": 1},
            {"collective-permute": count * per_device_bytes("collective-permute",
                                                            block, stages),
             "all-reduce": per_device_bytes("all-reduce", x.itemsize, stages)})

    return fact


def _plan_shapes(axes: Axes, model):
    """One pipeline of ``model``: a ``[width, width]`` layer per stage, and
    the tokens of one replica (the other mesh axes hold replicas, each
    with its share of the batch)."""
    w, stages = model.width, axes.size
    rows = model.tokens // axes.others_size
    return ({"w": (stages, w, w), "b": (stages, w)}, (rows, w), (rows, w))


SCHEDULES = {
    "gpipe": "GPipe, the recipe's: every microbatch forward, then every one "
             "backward; the scan keeps every tick's activations",
    "1f1b": "1F1B: a stage starts a microbatch's backward as soon as it can, "
            "keeping at most S microbatches' activations (counted by formula "
            "from the GPipe unit: the same bubble and sends)",
}
"""The pipeline schedules ``plan --schedule`` takes."""


def _plan(microbatches: int) -> PlanSpec:
    return PlanSpec(
        label="PP", shapes=_plan_shapes, axis="last", params=(0,),
        replicas_sum_gradients=True,
        unit=f"one layer per stage, {microbatches} microbatches, loss and gradients",
        repeats=lambda axes, model: 1,
        # a stage holds layers / stages blocks, each an MLP of 2 D F weights:
        # 2 F / D of the compiled [D, D] layers; the activations it passes
        # on do not depend on how many
        stored=_stage_layers, work=_stage_layers,
        # the sends between stages are on the critical path; the replicas'
        # gradient sum overlaps the backward pass
        serial="last", overlap="backward",
        activations=functools.partial(_kept, microbatches=microbatches),
        note=functools.partial(_bubble_note, microbatches=microbatches),
        variant=pipeline_recipe)


def _stage_layers(axes, model) -> float:
    """A stage's share of ``model`` in compiled ``[D, D]`` layers: its
    ``layers / S`` blocks of ``2 D F`` weights each."""
    return model.layers / axes.size * 2 * model.ffn / model.width


def _kept(axes, model, remat: bool, schedule: str = "gpipe", *,
          microbatches: int) -> float:
    """What a stage keeps for the backward pass, per layer: GPipe's scan
    keeps every tick's activations (``M + S - 1`` ticks, the bubble's
    included), 1F1B at most ``min(M, S)`` microbatches'; input and output of
    each (one with ``remat``, plus one layer's working set)."""
    stages = axes.size
    rows = model.tokens / axes.others_size / microbatches
    held = (microbatches + stages - 1 if schedule == "gpipe"
            else min(microbatches, stages))
    per_layer = held * rows * model.width
    layers = _stage_layers(axes, model)
    if remat:
        return layers * per_layer + 2 * rows * model.width
    return 2 * layers * per_layer


def _bubble_note(axes, model, schedule: str, *, microbatches: int) -> str:
    del model
    return (f"the {schedule} schedule, {microbatches} microbatches over {axes.size} "
            f"stages: bubble {bubble_fraction(axes.size, microbatches):.0%} of each "
            "stage's ticks (the scan computes and sends on them too)")


def pipeline_recipe(microbatches: int = MICROBATCHES) -> Recipe:
    """The ``pipeline_mlp`` recipe with ``M`` microbatches (the registered
    one has :data:`MICROBATCHES`; ``plan --microbatches`` compiles others).

    Raises:
      ValueError: ``microbatches`` is not a positive int.
    """
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches={microbatches!r}; expected a positive int.")
    m = microbatches

    def with_m(fn):  # the file's own function where M is its default
        return fn if m == MICROBATCHES else functools.partial(fn, microbatches=m)

    return Recipe(
        name="pipeline_mlp",
        summary="GPipe: one layer per stage over the axis, M microbatches passed "
                "on with ppermute in a scan; loss+grads",
        body=with_m(file.pipeline_value_and_grad),
        program=on_mesh(with_m(file.pipeline_program)),
        explicit_program=on_mesh(with_m(file.pipeline_explicit_program)),
        oracle=_in_dtype_of_x(file.pipeline_numpy), in_specs=_in_specs,
        out_specs=_out_specs, example_shapes=functools.partial(_shapes, microbatches=m),
        arg_names=("stage_params", "x", "y"), n_terms=_n_terms,
        magnitudes=_magnitudes, dtype_kinds=frozenset({"float"}),
        validate=functools.partial(_validate, microbatches=m),
        unsupported_reason=_one_axis, family="strategy", cost_model=_cost_model(m),
        recipe_file="pipeline.py", plan=_plan(m),
        bitwise=False)  # tanh layers round on any input


pipeline_mlp = register(pipeline_recipe())
