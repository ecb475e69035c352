"""Gradient averaging (data parallel): the ``dp_grads`` recipe and :func:`tree_pmean`.

The batch ``(x, y)`` is sharded over the mesh axis, the parameters
``{"w": w, "b": b}`` of a linear model ``y ~ x @ w + b`` are replicated, and
every form returns the gradient of the full-batch mean squared error: the
mean over devices of the per-device gradients (every device holds the same
number of rows).

The sharp edge: the pmap idiom "``jax.grad`` inside the body, then ``pmean``"
ported as is to shard_map with ``check_vma=True`` and replicated (``P()``)
parameters returns gradients ``n`` times too large. Inside shard_map the
parameters are *invariant*; using them with per-device data inserts an
implicit cast to *varying*, whose transpose under ``jax.grad`` is a ``psum``,
so ``jax.grad`` already returns the sum over devices, which ``pmean`` leaves
as it is. The shard_map body below marks the parameters varying first
(``pvary``), so ``jax.grad`` is local and ``pmean`` averages; the other fix
differentiates the whole program, ``jax.grad(shard_map(pmean(loss)))``.

Exactness: on integer-valued inputs whose batch size times output width is a
power of two (with power-of-two device counts), every scaling is a power of
two and every sum an integer below 2**24, so every form is exact in float32
and bit-for-bit independent of how the batch is split over devices or
processes.

The bodies, global program and NumPy oracle are ``recipes/dp_grads.py``'s;
this module adds the facts the library needs about them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from collectives import _compat
from collectives._costs import unreduced_sum
from collectives._layout import Axes
from collectives._layout import make_spec
from collectives._layout import on_axes
from collectives._recipe import WIDE_FLOATS
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation
from collectives.recipes import dp_grads as file

mse = file.mse
"""Mean squared error of the linear model: ``mean((x @ w + b - y) ** 2)``
(``params``: ``{"w": [d, o], "b": [o]}``, ``x``: ``[b, d]``, ``y``: ``[b, o]``)."""


def tree_pmean(tree, axis):
    """Average every leaf of a pytree over ``axis``; call inside a body.

    The data-parallel step: each device computes gradients (or metrics) on
    its shard of the batch, and ``tree_pmean`` leaves the mean over devices
    on every device. Under shard_map with ``check_vma=True`` the leaves must
    vary over ``axis`` (per-device values): a leaf that is already invariant
    (for instance gradients that ``jax.grad`` has already summed over
    devices, see ``dp_grads``) comes back unchanged.

    Args:
      tree: a pytree of arrays (e.g. ``{"w": dw, "b": db}``).
      axis: the mesh axis name, or a tuple of them.

    Returns:
      The pytree of means, the same structure and dtypes (integer leaves
      become floats, as with ``lax.pmean``).

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "i")
      >>> f = jax.shard_map(lambda t: cx.tree_pmean(t, "i"), mesh=mesh,
      ...                   in_specs=jax.P("i"), out_specs=jax.P())
      >>> out = f({"w": np.arange(4.0), "b": np.ones(4)})
      >>> {k: np.asarray(v).tolist() for k, v in sorted(out.items())}
      {'b': [1.0], 'w': [1.5]}
    """
    return file.tree_pmean(tree, axis)


# -- the deferred gradient sum of the training recipes' explicit forms --------

DEFERRED_MICROBATCHES = 2
"""How many microbatches the explicit forms of ``dp_adam``, ``dp_tp_mlp``,
``fsdp_mlp`` and ``fsdp_tp_mlp`` split the batch into (each device's rows
halved), their gradient shares summed over the data axis once."""


def microbatch_count(rows_per_device: int) -> int:
    """:data:`DEFERRED_MICROBATCHES` where it divides ``rows_per_device``,
    else 1 (one batch: the sum is still left to one ``reshard``)."""
    if rows_per_device % DEFERRED_MICROBATCHES == 0:
        return DEFERRED_MICROBATCHES
    return 1


def deferred_sum_reason(axes: Axes) -> str | None:
    """``explicit_reason`` of the recipes whose explicit form defers the
    gradient sum over the data axis (parameters resharded to ``reduced``,
    their ``unreduced`` gradients summed by one ``reshard``): ``None`` where
    this JAX gets it right (:data:`collectives._compat.UNREDUCED_GRADIENTS_CHECKED`)."""
    del axes
    if _compat.UNREDUCED_GRADIENTS_CHECKED:
        return None
    since = ".".join(map(str, _compat.UNREDUCED_GRADIENTS_CHECKED_SINCE))
    return (f"the deferred gradient sum (parameters typed reduced over the data "
            f"axis, unreduced gradients) needs JAX >= {since}; JAX "
            f"{jax.__version__} refuses a reduce_sum of an unreduced value")


# -- dp_grads -------------------------------------------------------------------

def grads_shapes(axes: Axes, dims):
    # Power-of-two rows per device and outputs keep every scaling exact.
    rows = axes.size * 2 ** (dims[0] - 1)
    features = dims[1] if len(dims) > 1 else 2
    outputs = 2 ** (dims[2] - 1) if len(dims) > 2 else 1
    return ({"w": (features, outputs), "b": (outputs,)},
            (rows, features), (rows, outputs))


def _n_terms(axes: Axes) -> int:
    # Per gradient element: the residual (d + 2 roundings, d <= 3 in the
    # example shapes), a sum over n*k rows (k <= 4) and the scaling; each
    # term is a product of an input and a residual, up to d + 2 times larger
    # than the inputs the policy's atol scales with, hence the factor 4.
    return 4 * (4 * axes.size + 8)


def check_grads_args(axes: Axes, args) -> None:
    params, x, y = args
    if not isinstance(params, dict) or set(params) != {"w", "b"}:
        keys = sorted(params) if isinstance(params, dict) else ""
        raise TypeError(
            f"dp_grads: argument params must be a dict with keys 'w' and 'b', got "
            f"{type(params).__name__} {keys}. Fix: pass {{'w': w, 'b': b}}.")
    w_shape, b_shape = jnp.shape(params["w"]), jnp.shape(params["b"])
    x_shape, y_shape = jnp.shape(x), jnp.shape(y)
    expected = "w: [d, o], b: [o], x: [batch, d], y: [batch, o]"
    if (len(w_shape), len(b_shape), len(x_shape), len(y_shape)) != (2, 1, 2, 2):
        raise ValueError(
            f"dp_grads: shapes w {w_shape}, b {b_shape}, x {x_shape}, y {y_shape} "
            f"do not fit the linear model; expected {expected}.")
    d, o = w_shape
    if b_shape != (o,) or x_shape[1] != d or y_shape != (x_shape[0], o):
        raise ValueError(
            f"dp_grads: shapes w {w_shape}, b {b_shape}, x {x_shape}, y {y_shape} "
            f"disagree; expected {expected} with one d, o and batch. Fix: e.g. "
            f"b of shape ({o},), x of shape ({x_shape[0]}, {d}), y of shape "
            f"({x_shape[0]}, {o}).")


def mesh_sizes(axes: Axes) -> list[int]:
    """The sizes of the collective axes, in their order."""
    return [axes.mesh.shape[name] for name in axes.names]


def _grads_cost_model(axes: Axes, args, form: str) -> Expectation:
    """One all-reduce of the gradients (XLA combines dw and db). The explicit
    form's deferred sum: one per data axis from JAX 0.12.1
    (:func:`collectives._costs.unreduced_sum`)."""
    del args
    if form == "explicit" and _compat.UNREDUCED_GRADIENTS_CHECKED:
        count, _ = unreduced_sum(0, mesh_sizes(axes))
        return Expectation({"all-reduce": count})
    return Expectation({"all-reduce": 1})


dp_grads = register(Recipe(
    name="dp_grads", recipe_file="dp_grads.py", cost_model=_grads_cost_model,
    summary="data-parallel gradient of a linear model's MSE: grads averaged by pmean",
    body=file.dp_grads_body, program=on_axes(file.dp_grads_program),
    # the deferred sum where JAX sums unreduced gradients, else jax.grad's own
    explicit_program=on_axes(file.dp_grads_explicit_program,
                             lambda axes: axes.entry,
                             deferred=_compat.UNREDUCED_GRADIENTS_CHECKED),
    oracle=on_axes(file.dp_grads_numpy),
    in_specs=lambda axes: (make_spec(), make_spec(axes.entry), make_spec(axes.entry)),
    out_specs=lambda axes: make_spec(),
    example_shapes=grads_shapes, arg_names=("params", "x", "y"), n_terms=_n_terms,
    dtype_kinds=frozenset({"float"}), validate=check_grads_args,
    # x^T r sums products past bfloat16's and float16's exact integers
    exact_dtypes=WIDE_FLOATS,
    pmap_body=file.dp_grads_pmap_body))
