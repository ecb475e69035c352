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
(:func:`bubble_fraction`); it shrinks as ``M`` grows. Activation memory is
``M`` microbatches per stage (GPipe); 1F1B would bound it by ``S``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from collectives._costs import per_device_bytes
from collectives._facts.permute import body_axis_size
from collectives._layout import Axes
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation

MICROBATCHES = 4
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
    return (stages - 1) / (microbatches + stages - 1)


def stage_layer(params, a):
    """One stage: ``tanh(a @ w + b)``; ``params = {"w": [d, d], "b": [d]}``."""
    return jnp.tanh(a @ params["w"] + params["b"][None])


def _micro(a, microbatches: int):
    if a.shape[0] % microbatches:
        raise ValueError(
            f"pipeline: a batch of {a.shape[0]} rows does not split into "
            f"{microbatches} microbatches. Fix: use a batch that divides by "
            f"{microbatches}.")
    return a.reshape(microbatches, a.shape[0] // microbatches, *a.shape[1:])


def pipeline_forward(params, x, *, stage_axis: str, microbatches: int):
    """The GPipe forward pass on one stage; call inside a body.

    Args:
      params: this stage's layer, ``{"w": [d, d], "b": [d]}``.
      x: the whole batch ``[batch, d]`` (only stage 0 reads it).
      stage_axis: the mesh axis of the stages.
      microbatches: ``M``; ``batch`` must divide by it.

    Returns:
      ``[M, batch / M, d]``: on the last stage the model's output per
      microbatch; on the other stages values to ignore.
    """
    stages = body_axis_size(stage_axis, "pipeline_forward")
    xs = _micro(x, microbatches)  # [M, mb, d]
    stage = lax.axis_index(stage_axis)
    # s -> s + 1; the wrap-around (last -> 0) is ignored by stage 0, which
    # reads x, and makes the shift a full permutation (vmap needs one).
    forward = [(s, (s + 1) % stages) for s in range(stages)]

    def tick(incoming, t):
        # incoming: [mb, d], what the previous stage sent at tick t - 1
        inp = jnp.where(stage == 0, xs[jnp.minimum(t, microbatches - 1)], incoming)
        out = stage_layer(params, inp)
        return lax.ppermute(out, stage_axis, forward), out

    # Tick 0's input: microbatch 0 on stage 0, zeros (ignored) elsewhere; it
    # varies over the stages, as the carry does from then on.
    start = jnp.where(stage == 0, xs[0], jnp.zeros_like(xs[0]))
    ticks = jnp.arange(microbatches + stages - 1)
    _, outs = lax.scan(tick, start, ticks, unroll=True)  # [M + S - 1, mb, d]
    return outs[stages - 1:]  # the last stage's outputs of microbatches 0..M-1


def pipeline_value_and_grad(stage_params, x, y, *, stage_axis: str,
                            microbatches: int = MICROBATCHES):
    """Loss and this stage's gradients of the GPipe pipeline; call inside a body.

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
    stages = body_axis_size(stage_axis, "pipeline_value_and_grad")
    ys = _micro(y, microbatches)
    last = lax.axis_index(stage_axis) == stages - 1

    def local_loss(block):
        params = jax.tree_util.tree_map(lambda a: a[0], block)
        outs = pipeline_forward(params, x, stage_axis=stage_axis,
                                microbatches=microbatches)
        return jnp.where(last, jnp.sum((outs - ys) ** 2), 0.0) / x.shape[0]

    local, grads = jax.value_and_grad(local_loss)(stage_params)
    return lax.psum(local, stage_axis), grads


def pipeline_reference(stage_params, x, y):
    """The NumPy oracle: the layers in sequence, forward and backward by hand,
    in float64. Returns ``(loss, grads)``."""
    w = np.asarray(stage_params["w"], np.float64)
    b = np.asarray(stage_params["b"], np.float64)
    acts = [np.asarray(x, np.float64)]
    for s in range(w.shape[0]):
        acts.append(np.tanh(acts[-1] @ w[s] + b[s]))
    err = acts[-1] - np.asarray(y, np.float64)
    loss = np.sum(err ** 2) / err.shape[0]
    grad_a = 2 * err / err.shape[0]
    dw, db = np.zeros_like(w), np.zeros_like(b)
    for s in reversed(range(w.shape[0])):
        dz = grad_a * (1 - acts[s + 1] ** 2)
        dw[s], db[s] = acts[s].T @ dz, dz.sum(0)
        grad_a = dz @ w[s].T
    return np.asarray(loss), {"w": dw, "b": db}


def pipeline_jit_value_and_grad(stage_params, x, y, mesh, stage_axis: str,
                                microbatches: int = MICROBATCHES):
    """The jit form's global program: the same schedule on a ``[S, mb, d]``
    state sharded over the stages; every tick applies each stage's layer to
    its slot (``vmap``) and shifts the state by one stage (``jnp.roll`` on the
    sharded axis, which the partitioner writes as a collective-permute)."""
    stages = stage_params["w"].shape[0]
    xs, ys = _micro(x, microbatches), _micro(y, microbatches)
    stage = jnp.arange(stages)[:, None, None]

    def constrain(a):
        spec = P(stage_axis, *([None] * (a.ndim - 1)))
        return lax.with_sharding_constraint(a, NamedSharding(mesh, spec))

    def loss(params):
        def tick(carry, t):
            # state: [S, mb, d], stage s's input in row s; sums: [S]
            state, sums = carry
            new = xs[jnp.minimum(t, microbatches - 1)][None]  # [1, mb, d]
            state = jnp.where(stage == 0, new, state)
            out = constrain(jax.vmap(stage_layer)(params, state))
            done = t - (stages - 1)  # the microbatch leaving the last stage
            err = jnp.sum((out - ys[jnp.maximum(done, 0)][None]) ** 2, axis=(1, 2))
            keep = (stage[:, 0, 0] == stages - 1) & (done >= 0)
            sums = constrain(sums + jnp.where(keep, err, 0.0))
            return (constrain(jnp.roll(out, 1, axis=0)), sums), None

        start = (constrain(jnp.zeros((stages, *xs.shape[1:]), x.dtype)),
                 constrain(jnp.zeros((stages,), x.dtype)))
        ticks = jnp.arange(microbatches + stages - 1)
        (_, sums), _ = lax.scan(tick, start, ticks, unroll=True)
        return jnp.sum(sums) / x.shape[0]  # only the last stage's sum is nonzero

    return jax.value_and_grad(loss)(stage_params)


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


def _shapes(axes: Axes, dims):
    width = dims[1] if len(dims) > 1 else 2
    batch = MICROBATCHES * dims[0]
    return ({"w": (axes.size, width, width), "b": (axes.size, width)},
            (batch, width), (batch, width))


def _body(stage_params, x, y, *, axis):
    # stage_params: {"w": [1, d, d], "b": [1, d]} on each stage; x, y: [batch, d]
    return pipeline_value_and_grad(stage_params, x, y, stage_axis=axis)


def _program(stage_params, x, y, *, axes: Axes):
    return pipeline_jit_value_and_grad(stage_params, x, y, axes.mesh, axes.entry)


def _oracle(stage_params, x, y, *, axes: Axes):
    del axes
    loss, grads = pipeline_reference(stage_params, x, y)
    return loss.astype(x.dtype), {k: v.astype(x.dtype) for k, v in grads.items()}


def _validate(axes: Axes, args) -> None:
    stage_params, x, y = args
    if np.shape(x)[0] % MICROBATCHES:
        raise ValueError(
            f"pipeline_mlp: x has {np.shape(x)[0]} rows, which do not split into "
            f"{MICROBATCHES} microbatches. Fix: use a batch that divides by "
            f"{MICROBATCHES}.")
    d = np.shape(x)[1]
    want = {"w": (axes.size, d, d), "b": (axes.size, d)}
    got = {k: tuple(np.shape(v)) for k, v in stage_params.items()}
    if got != want or np.shape(y) != np.shape(x):
        raise ValueError(
            f"pipeline_mlp: shapes stage_params {got}, x {np.shape(x)}, y "
            f"{np.shape(y)} do not fit {axes.size} stages of width {d}; expected "
            f"stage_params {want} and y of x's shape.")


def _terms(axes: Axes) -> int:
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


def _hlo(axes: Axes, args, form: str) -> Expectation:
    """Collective-permutes of one ``[mb, d]`` microbatch each
    (:func:`permute_count`), and one all-reduce: the loss, a scalar, from
    the last stage to every stage."""
    _, x, _ = args
    stages = axes.size
    block = x.nbytes // MICROBATCHES
    count = permute_count(stages, MICROBATCHES, form)
    return Expectation(
        {"collective-permute": count, "all-reduce": 1},
        {"collective-permute": count * per_device_bytes("collective-permute",
                                                        block, stages),
         "all-reduce": per_device_bytes("all-reduce", x.itemsize, stages)})


pipeline_mlp = register(Recipe(
    name="pipeline_mlp",
    summary="GPipe: one layer per stage over the axis, M microbatches passed on "
            "with ppermute in a scan; loss+grads",
    body=_body, program=_program, oracle=_oracle, in_specs=_in_specs,
    out_specs=_out_specs, example_shapes=_shapes,
    arg_names=("stage_params", "x", "y"), count_terms=_terms,
    dtype_kinds=frozenset({"float"}), validate=_validate, unsupported_reason=_one_axis,
    family="strategy", hlo=_hlo, source="pipeline.py",
    exact=False))  # tanh layers round on any input
