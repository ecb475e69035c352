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
"""

from __future__ import annotations

import functools
import math

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
        return int(capacity)
    if not capacity_factor > 0:
        raise ValueError(
            f"capacity_factor: expected a positive number, got {capacity_factor!r}. "
            "Fix: pass e.g. 1.0 or 2.0.")
    return max(1, math.ceil(capacity_factor * tokens_per_device * top_k / n_experts))


def _check_top_k(top_k) -> None:
    if top_k not in TOP_K:
        raise ValueError(
            f"top_k: expected one of {TOP_K}, got {top_k!r}. Fix: pass 1 (Switch) "
            "or 2 (top-2 routing).")


def _route(router_w, x, top_k: int):
    """``gate, expert``: ``[t, top_k]`` each, for tokens ``x`` ``[t, D]``."""
    logits = x @ router_w
    # lax.top_k orders -0.0 below 0.0 (a zero token times a negative weight
    # is -0.0); they are equal, and ties go to the lower index
    logits = jnp.where(logits == 0, jnp.zeros_like(logits), logits)
    _, expert = lax.top_k(logits, top_k)  # ties: the lower index
    probs = jax.nn.softmax(logits.astype(jnp.promote_types(x.dtype, jnp.float32)))
    gate = jnp.take_along_axis(probs, expert, axis=-1).astype(x.dtype)
    return gate, expert


def _slots(expert, n_experts: int, capacity: int, dtype):
    """The dispatch mask ``[t*k, E, C]`` (one 1 per kept assignment) and the
    number of dropped assignments, first come first served in token order."""
    assigned = jax.nn.one_hot(expert.reshape(-1), n_experts, dtype=jnp.int32)
    # slot of each assignment: earlier assignments (this device) to its expert
    slot = jnp.sum((jnp.cumsum(assigned, axis=0) - 1) * assigned, axis=-1)
    kept = slot < capacity
    mask = (assigned[:, :, None]
            * jax.nn.one_hot(slot, capacity, dtype=jnp.int32)[:, None, :])
    return mask.astype(dtype), jnp.sum(~kept).astype(jnp.int32)


def _ffn(x, w_in, w_out):
    # x: [..., e, C, D]; w_in: [e, D, F]; w_out: [e, F, D]
    hidden = jax.nn.relu(jnp.einsum("...ecd,edf->...ecf", x, w_in))
    return jnp.einsum("...ecf,efd->...ecd", hidden, w_out)


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
    return _moe_body(router_w, expert_w_in, expert_w_out, tokens, axis, top_k, slots)


def _moe_body(router_w, w_in, w_out, x, axis, top_k: int, capacity: int):
    n_experts = router_w.shape[-1]
    gate, expert = _route(router_w, x, top_k)
    mask, dropped = _slots(expert, n_experts, capacity, x.dtype)  # [t*k, E, C]
    # buffer: [E, C, D]: slot c of expert j holds one assignment's token
    buffer = jnp.einsum("aec,ad->ecd", mask, jnp.repeat(x, top_k, axis=0))

    def exchange(b):
        return lax.all_to_all(b, axis, split_axis=0, concat_axis=0, tiled=True)

    received = exchange(buffer)  # [n*e, C, D]: my experts' slots from every device
    e = w_in.shape[0]
    out = _ffn(received.reshape(-1, e, *received.shape[1:]), w_in, w_out)
    back = exchange(out.reshape(received.shape))  # [E, C, D]: my tokens' results
    combined = jnp.einsum("aec,ecd->ad", mask, back) * gate.reshape(-1, 1)
    return (combined.reshape(x.shape[0], top_k, -1).sum(1),
            lax.psum(dropped, axis))


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
    n_experts = router_w.shape[-1]
    e = n_experts // n
    t = tokens.shape[0]
    gate, expert = _route(router_w, tokens, top_k)
    flat = expert.reshape(-1)  # [t*k]
    order = jnp.argsort(flat, stable=True)  # group the assignments by expert
    sent = jnp.repeat(tokens, top_k, axis=0)[order]  # [t*k, D]
    local_id = (flat[order] % e).astype(jnp.int32)
    send_sizes = jnp.bincount(flat // e, length=n).astype(jnp.int32)  # per device
    input_offsets = jnp.cumsum(send_sizes) - send_sizes
    # what every device sends me, and where my rows land on each receiver
    recv_sizes = lax.all_to_all(send_sizes, axis, 0, 0, tiled=True)
    me = lax.axis_index(axis)
    before_me = lax.all_gather(send_sizes, axis)  # [n src, n dst]
    output_offsets = (jnp.cumsum(before_me, axis=0) - before_me)[me]
    rows = n * t * top_k

    def ragged(x, out, in_off, send, out_off, recv):
        return lax.ragged_all_to_all(x, out, in_off, send, out_off, recv,
                                     axis_name=axis)

    recv_offsets = jnp.cumsum(recv_sizes) - recv_sizes
    received = ragged(sent, jnp.zeros((rows, sent.shape[1]), sent.dtype),
                      input_offsets, send_sizes, output_offsets, recv_sizes)
    ids = ragged(local_id, jnp.zeros((rows,), jnp.int32), input_offsets,
                 send_sizes, output_offsets, recv_sizes)
    hidden = jax.nn.relu(jnp.einsum("rd,rdf->rf", received, expert_w_in[ids]))
    result = jnp.einsum("rf,rfd->rd", hidden, expert_w_out[ids])
    # send the results back: the receivers' offsets are the senders' inputs
    back_offsets = lax.all_to_all(recv_offsets, axis, 0, 0, tiled=True)
    returned = ragged(result, jnp.zeros_like(sent), recv_offsets, recv_sizes,
                      back_offsets, send_sizes)
    unsorted = jnp.zeros_like(returned).at[order].set(returned)
    return (unsorted * gate.reshape(-1, 1)).reshape(t, top_k, -1).sum(1)


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


def moe_program(router_w, w_in, w_out, tokens, *, axes: Axes, top_k: int,
                capacity: int | None, capacity_factor: float):
    """The global program: per-device routing as a leading group dimension,
    and sharding constraints that move the buffer from token-sharded to
    expert-sharded and back (XLA emits the two all-to-alls)."""
    n = axes.size

    def constrain(x, spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(axes.mesh, spec))

    by_group = P(axes.entry)
    groups = constrain(tokens.reshape(n, -1, tokens.shape[-1]), by_group)  # [n,t,D]
    slots = expert_capacity(groups.shape[1], router_w.shape[-1], top_k=top_k,
                            capacity=capacity, capacity_factor=capacity_factor)
    gate, expert = jax.vmap(lambda x: _route(router_w, x, top_k))(groups)
    mask, dropped = jax.vmap(
        lambda ex: _slots(ex, router_w.shape[-1], slots, tokens.dtype))(expert)
    mask, gate = constrain(mask, by_group), constrain(gate, by_group)
    buffer = jnp.einsum("gaec,gad->gecd", mask, jnp.repeat(groups, top_k, axis=1))
    buffer = constrain(buffer, by_group)  # [n, E, C, D]: each group's own buffer

    by_expert = constrain(buffer, P(None, axes.entry))  # [n, E, C, D]: all-to-all
    out = constrain(_ffn(by_expert, w_in, w_out), P(None, axes.entry))
    back = constrain(out, by_group)  # all-to-all back
    combined = jnp.einsum("gaec,gecd->gad", mask, back) * gate.reshape(n, -1, 1)
    combined = constrain(combined, by_group)
    out = combined.reshape(n, groups.shape[1], top_k, -1).sum(2)
    return out.reshape(tokens.shape), dropped.sum()


def moe_oracle(router_w, w_in, w_out, tokens, *, axes: Axes, top_k: int,
               capacity: int | None, capacity_factor: float):
    """NumPy: route each device's tokens in order, drop past capacity, apply
    each kept assignment's expert, sum gate-weighted."""
    n = axes.size
    dtype = np.result_type(tokens)
    router_w, w_in, w_out, tokens = (np.asarray(a, np.float64)
                                     for a in (router_w, w_in, w_out, tokens))
    n_experts = router_w.shape[-1]
    t = tokens.shape[0] // n
    slots = expert_capacity(t, n_experts, top_k=top_k, capacity=capacity,
                            capacity_factor=capacity_factor)
    out = np.zeros_like(tokens)
    dropped = 0
    for device in range(n):
        used = np.zeros(n_experts, int)  # slots taken on this device, per expert
        for row in range(device * t, (device + 1) * t):
            x = tokens[row]
            logits = x @ router_w
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            for j in np.argsort(-logits, kind="stable")[:top_k]:
                if used[j] >= slots:
                    dropped += 1
                    continue
                used[j] += 1
                out[row] += probs[j] * (np.maximum(x @ w_in[j], 0) @ w_out[j])
    return out.astype(dtype), np.asarray(dropped, np.int32)


def _moe_fact(axes: Axes, args, form: str, *, top_k: int, capacity: int | None,
              capacity_factor: float) -> Expectation:
    """Two all-to-alls of the ``[E, C, D]`` buffer and one all-reduce of the
    dropped count, in both forms. The jit form has one more op: XLA's
    partitioner all-gathers the ``[t*k, E]`` int32 one-hot whose running sum
    (a cumsum over tokens) numbers the slots."""
    router_w, _, _, tokens = args
    n_experts, d = router_w.shape[-1], tokens.shape[-1]
    t = tokens.shape[0] // axes.size
    slots = expert_capacity(t, n_experts, top_k=top_k,
                            capacity=capacity, capacity_factor=capacity_factor)
    buffer = n_experts * slots * d * np.dtype(tokens.dtype).itemsize
    counts = {"all-to-all": 2, "all-reduce": 1}
    moved = {"all-to-all": 2 * per_device_bytes("all-to-all", buffer, axes.size),
             "all-reduce": per_device_bytes("all-reduce", 4, axes.size)}
    if form == "jit":
        counts["all-gather"] = 1
        moved["all-gather"] = per_device_bytes("all-gather", t * top_k * n_experts * 4,
                                               axes.size)
    return Expectation(counts, moved)


def _validate(top_k: int, capacity: int | None, capacity_factor: float):
    def validate(axes: Axes, args) -> None:
        router_w, w_in, w_out, tokens = (np.empty(np.shape(a), np.int8) for a in args)
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

    def body(router_w, w_in, w_out, tokens, *, axis):
        # tokens: [t, D], experts [e, ...] on each device -> ([t, D], dropped)
        return moe_layer(router_w, w_in, w_out, tokens, axis, **options)

    return Recipe(
        name=name, family="strategy", source="moe.py",
        exact=False,  # the router's softmax: exp rounds on any input
        summary=f"mixture of experts: top-{top_k} router, all_to_all dispatch with "
                "capacity, expert FFN, all_to_all combine; counts dropped tokens",
        body=body, program=functools.partial(moe_program, **options),
        oracle=functools.partial(moe_oracle, **options), in_specs=_specs,
        out_specs=lambda axes: (P(axes.entry), P()), example_shapes=_shapes,
        arg_names=("router_w", "expert_w_in", "expert_w_out", "tokens"),
        count_terms=lambda axes: 64, dtype_kinds=frozenset({"float"}),
        validate=_validate(**options), hlo=functools.partial(_moe_fact, **options))


moe_layer_recipe = register(moe_recipe())
