"""Expert parallelism: a mixture-of-experts layer with all_to_all dispatch.

Tokens ``[T, D]`` are sharded over an axis of ``n`` devices (``t = T / n``
each); the ``E = n * e`` experts are sharded over the same axis (device ``j``
holds experts ``j*e : (j+1)*e``). Each device:

1. **routes**: ``logits = x @ router_w`` (``[t, E]``), ``probs =
   softmax(logits)``; each token picks its ``top_k`` experts by logit (ties
   to the lower index) with gate weights ``probs`` of those experts (not
   renormalised; for ``top_k=1`` this is the Switch transformer's gate);
2. **drops for capacity**, first come, first served: the device's
   assignments are taken in *device-local token order*, token 0's choices
   first (its first choice, then its second), then token 1's, and so on; an
   assignment gets slot ``p`` of its expert if ``p`` earlier assignments *on
   this device* chose the same expert, and is dropped when ``p >=
   capacity``. So ``capacity`` is per (source device, expert) pair;
3. **dispatches**: a buffer ``[E, capacity, D]`` holds each kept assignment
   in its slot; ``all_to_all`` (the exchange form, ``all_to_all_blocks``)
   sends rows ``j*e : (j+1)*e`` to device ``j``;
4. applies its ``e`` experts' FFN, ``relu(x @ w_in) @ w_out``, to the
   ``[n, e, capacity, D]`` tokens it received;
5. **combines**: a second ``all_to_all`` returns the results to the tokens'
   devices, where each token sums its kept assignments times their gates. A
   token whose assignments were all dropped outputs zeros (the residual
   connection around the layer, outside it, carries it on).

``dropped`` is the number of dropped assignments over all devices (one
``psum``). The default capacity is ``ceil(capacity_factor * t * top_k /
E)``. With ``capacity >= t`` nothing can drop and the layer equals dense
per-token routing.

:func:`moe_layer_dropless` is the dropless variant built on
``lax.ragged_all_to_all``: every assignment is sent, in variable-sized
chunks. XLA:CPU has no ragged all-to-all, so it runs on accelerators only.

The per-device bodies, the global program and the NumPy oracle are
``recipes/moe.py``'s; this module adds the facts the library needs about
them, and the public functions validate, then call the file's.
"""

from __future__ import annotations

import functools

import numpy as np
from jax.sharding import PartitionSpec as P

from collectives._costs import per_device_bytes
from collectives._layout import Axes
from collectives._layout import body_axis_size
from collectives._layout import by_axis_size
from collectives._layout import on_mesh
from collectives._presentation import PlanSpec
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation
from collectives.recipes import moe as file

TOP_K = (1, 2)
"""The router choices supported: Switch (1) and GShard-style top-2."""


def expert_capacity(tokens_per_device: int, n_experts: int, *, top_k: int = 1,
                    capacity: int | None = None, capacity_factor: float = 1.0
                    ) -> int:
    """Slots per (source device, expert): ``capacity`` if given, else
    ``ceil(capacity_factor * tokens_per_device * top_k / n_experts)``, at
    least 1."""
    if capacity is not None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
                or capacity < 1:
            raise ValueError(
                f"capacity: expected a positive int (slots per expert per source "
                f"device), got {capacity!r}. Fix: pass e.g. capacity=2, or None to "
                "derive it from capacity_factor.")
    elif not capacity_factor > 0:
        raise ValueError(
            f"capacity_factor: expected a positive number, got {capacity_factor!r}. "
            "Fix: pass e.g. 1.0 or 2.0.")
    return file.expert_capacity(tokens_per_device, n_experts, top_k,
                                None if capacity is None else int(capacity),
                                capacity_factor)


def _check_top_k(top_k) -> None:
    if top_k not in TOP_K:
        raise ValueError(
            f"top_k: expected one of {TOP_K}, got {top_k!r}. Fix: pass 1 (Switch) "
            "or 2 (top-2 routing).")


def _check_weights(router_w, w_in, w_out, x, n: int, what: str) -> None:
    d = x.shape[-1]
    e_total = router_w.shape[-1]
    ok = (router_w.ndim == 2 and router_w.shape[0] == d and w_in.ndim == 3
          and w_out.ndim == 3 and w_in.shape[1] == d and w_out.shape[2] == d
          and w_in.shape[2] == w_out.shape[1] and w_in.shape[0] == w_out.shape[0])
    if not ok:
        raise ValueError(
            f"{what}: expected router_w [D, E], expert_w_in [E, D, F], expert_w_out "
            f"[E, F, D] and tokens [T, D], got router_w {router_w.shape}, "
            f"expert_w_in {w_in.shape}, expert_w_out {w_out.shape}, tokens "
            f"{x.shape}. Fix: make D and F agree.")
    if e_total % n:
        raise ValueError(
            f"{what}: router_w has {e_total} experts, which must split evenly over "
            f"the {n} devices along the axis. Fix: use a multiple of {n} experts.")


def moe_layer(router_w, expert_w_in, expert_w_out, tokens, axis, *, top_k: int = 1,
              capacity: int | None = None, capacity_factor: float = 1.0):
    """A mixture-of-experts layer with capacity; call inside a body.

    Args:
      router_w: ``[D, E]``, the same on every device.
      expert_w_in: this device's experts, ``[e, D, F]`` (``E = n * e``).
      expert_w_out: ``[e, F, D]``.
      tokens: this device's tokens, ``[t, D]``.
      axis: the mesh axis name (or tuple) tokens and experts are sharded over.
      top_k: experts per token, 1 or 2.
      capacity: slots per expert per source device (default from
        ``capacity_factor``, see :func:`expert_capacity`).
      capacity_factor: used when ``capacity`` is None.

    Returns:
      ``(out, dropped)``: ``[t, D]`` outputs of this device's tokens, and the
      number of assignments dropped on all devices (an int32 scalar, the
      same everywhere).

    Raises:
      ValueError: shapes do not fit, ``E`` does not divide by the axis size,
        ``top_k`` or ``capacity`` is invalid, or ``axis`` is not bound.

    Examples:
      >>> import functools, jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "i")
      >>> rng = np.random.default_rng(0)
      >>> router = rng.normal(size=(3, 4)); x = rng.normal(size=(16, 3))
      >>> w_in = rng.normal(size=(4, 3, 5)); w_out = rng.normal(size=(4, 5, 3))
      >>> body = functools.partial(cx.moe_layer, axis="i", capacity=1)
      >>> f = jax.shard_map(body, mesh=mesh, out_specs=(jax.P("i"), jax.P()),
      ...                   in_specs=(jax.P(), jax.P("i"), jax.P("i"), jax.P("i")))
      >>> out, dropped = jax.jit(f)(router, w_in, w_out, x)
      >>> out.shape, int(dropped) > 0
      ((16, 3), True)
    """
    _check_top_k(top_k)
    n = body_axis_size(axis, "moe_layer")
    _check_weights(router_w, expert_w_in, expert_w_out, tokens, n, "moe_layer")
    slots = expert_capacity(tokens.shape[0], router_w.shape[-1], top_k=top_k,
                            capacity=capacity, capacity_factor=capacity_factor)
    return file.moe_body(router_w, expert_w_in, expert_w_out, tokens, axis,
                         top_k=top_k, capacity=slots)


# -- the dropless variant (accelerators only) ---------------------------------

def moe_layer_dropless(router_w, expert_w_in, expert_w_out, tokens, axis, *,
                       top_k: int = 1):
    """:func:`moe_layer` without a capacity: ``lax.ragged_all_to_all`` sends
    each device exactly the assignments bound for its experts.

    The receive buffer is sized for the worst case (every assignment of every
    device to one device, ``n * t * top_k`` rows). XLA:CPU has no
    ragged-all-to-all ("not supported by XLA:CPU ThunkEmitter"): run it on
    GPU or TPU.

    Returns:
      ``[t, D]``: the outputs of this device's tokens (nothing is dropped).
    """
    _check_top_k(top_k)
    n = body_axis_size(axis, "moe_layer_dropless")
    _check_weights(router_w, expert_w_in, expert_w_out, tokens, n,
                   "moe_layer_dropless")
    return file.moe_dropless_body(router_w, expert_w_in, expert_w_out, tokens, axis,
                                  top_k=top_k)


# -- recipes ---------------------------------------------------------------
# Global view: router_w [D, E] replicated, expert_w_in [E, D, F] and
# expert_w_out [E, F, D] sharded by expert, tokens [T, D] sharded by token;
# out [T, D] sharded by token, dropped a replicated int32 scalar.

def _specs(axes: Axes):
    return (P(), P(axes.entry), P(axes.entry), P(axes.entry))


def _shapes(axes: Axes, dims):
    t, d, f = (tuple(dims) * 3)[:3]
    n = axes.size
    return ((d, n), (n, d, f + 1), (n, f + 1, d), (n * 2 * t, d))


def _plan_shapes(axes: Axes, model):
    """One mixture-of-experts layer of ``model``: one expert per device along
    the axis (``[width, ffn]`` in, ``[ffn, width]`` out), the tokens of one
    replica (the other mesh axes hold replicas, each with its share)."""
    n, d = axes.size, model.width
    rows = model.tokens // axes.others_size
    return ((d, n), (n, d, model.ffn), (n, model.ffn, d), (rows, d))


_PLAN = PlanSpec(label="EP (MoE)", shapes=_plan_shapes, axis="last", params=(0, 1, 2),
                 scope="layer", serial="all",
                 unit="one MoE layer (route, dispatch, experts, combine), forward",
                 repeats=lambda axes, model: model.layers,
                 stored=lambda axes, model: model.layers)


moe_program = on_mesh(file.moe_program)
"""The global program (``recipes/moe.py``'s ``moe_program``), called as
``moe_program(router_w, w_in, w_out, tokens, axes=..., top_k=...,
capacity=..., capacity_factor=...)``."""

moe_oracle = by_axis_size(file.moe_numpy)
"""The NumPy oracle (``recipes/moe.py``'s ``moe_numpy``), called like
:data:`moe_program`."""


def _moe_fact(axes: Axes, args, form: str, *, top_k: int, capacity: int | None,
              capacity_factor: float) -> Expectation:
    """Two all-to-alls of the ``[E, C, D]`` buffer and one all-reduce of the
    dropped count, in every form. The jit and explicit forms (the same
    global program, resharded where the jit form constrains) have one more
    op: XLA's partitioner all-gathers the ``[t*k, E]`` int32 one-hot whose
    running sum (a cumsum over tokens) numbers the slots."""
    router_w, _, _, tokens = args
    n_experts, d = router_w.shape[-1], tokens.shape[-1]
    t = tokens.shape[0] // axes.size
    slots = expert_capacity(t, n_experts, top_k=top_k,
                            capacity=capacity, capacity_factor=capacity_factor)
    buffer = n_experts * slots * d * np.dtype(tokens.dtype).itemsize
    counts = {"all-to-all": 2, "all-reduce": 1}
    moved = {"all-to-all": 2 * per_device_bytes("all-to-all", buffer, axes.size),
             "all-reduce": per_device_bytes("all-reduce", 4, axes.size)}
    if form in ("jit", "explicit"):
        counts["all-gather"] = 1
        moved["all-gather"] = per_device_bytes("all-gather", t * top_k * n_experts * 4,
                                               axes.size)
    return Expectation(counts, moved)


def _validate(top_k: int, capacity: int | None, capacity_factor: float):
    def validate(axes: Axes, args) -> None:
        # shape-only stand-ins (broadcast: no memory, whatever the sizes)
        router_w, w_in, w_out, tokens = (np.broadcast_to(np.int8(0), np.shape(a))
                                         for a in args)
        _check_weights(router_w, w_in, w_out, tokens, axes.size, "moe_layer")
        if tokens.ndim != 2:
            raise ValueError(
                f"moe_layer: tokens must be [T, D], got shape {tokens.shape}. Fix: "
                "flatten the batch and sequence dimensions first.")
        expert_capacity(1, 1, capacity=capacity, capacity_factor=capacity_factor)
    _check_top_k(top_k)
    return validate


def moe_recipe(*, top_k: int = 1, capacity: int | None = None,
               capacity_factor: float = 1.0, name: str = "moe_layer") -> Recipe:
    """The ``moe_layer`` recipe for one routing setting (not registered).

    Tests draw capacities with it; ``RECIPES["moe_layer"]`` is
    ``moe_recipe()``: top-1, capacity factor 1.
    """
    options = dict(top_k=top_k, capacity=capacity, capacity_factor=capacity_factor)
    return Recipe(
        name=name, family="strategy", recipe_file="moe.py",
        bitwise=False,  # the router's softmax: exp rounds on any input
        summary=f"mixture of experts: top-{top_k} router, all_to_all dispatch with "
                "capacity, expert FFN, all_to_all combine; counts dropped tokens",
        body=functools.partial(file.moe_body, **options),
        program=functools.partial(moe_program, **options),
        explicit_program=functools.partial(on_mesh(file.moe_explicit_program),
                                           **options),
        oracle=functools.partial(moe_oracle, **options), in_specs=_specs,
        out_specs=lambda axes: (P(axes.entry), P()), example_shapes=_shapes,
        arg_names=("router_w", "expert_w_in", "expert_w_out", "tokens"),
        n_terms=lambda axes: 64, dtype_kinds=frozenset({"float"}),
        validate=_validate(**options),
        cost_model=functools.partial(_moe_fact, **options), plan=_PLAN)


moe_layer_recipe = register(moe_recipe())
