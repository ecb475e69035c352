"""Mixture of experts: top-k routing, all_to_all dispatch under a capacity.

What it shows: tokens ``[T, D]`` and the ``E = n * e`` experts (device j
holds experts ``j*e : (j+1)*e``) are sharded over the same axis of n devices.
Each device routes its ``t = T / n`` tokens: ``logits = x @ router_w``, each
token picks its ``top_k`` experts by logit (``lax.top_k``; ties to the lower
expert, -0.0 counted equal to 0.0), gate = the softmax probability of each
pick (not renormalised; top-1 is the Switch transformer's gate). It gives
each assignment a slot of its expert first come, first served in local token
order (token 0's picks, then token 1's, ...), drops assignments past
``capacity`` slots per (source device, expert), and packs a buffer
``[E, C, D]``. ``all_to_all`` (split and concat on dim 0) sends row block j
to device j, which runs its experts' FFN ``relu(x @ w_in) @ w_out``; a second
``all_to_all`` brings the results home, where each token sums its kept
assignments times their gates. A token whose assignments were all dropped
outputs zeros; the dropped assignments are counted with ``psum``. The default
capacity is ``ceil(capacity_factor * t * top_k / E)``; with ``capacity >= t``
nothing drops.

``moe_dropless_body`` sends every assignment with ``lax.ragged_all_to_all``
instead (variable-sized chunks, no capacity). XLA:CPU has no ragged
all-to-all, so it runs on GPU or TPU only.

Which form when: shard_map to control dispatch (capacity, dropping); jit of
the global program with sharding constraints (XLA emits the all-to-alls);
explicit, the same global program on Explicit axes with ``reshard`` where
the buffer changes hands (the layouts in the types); pmap as the legacy form.

The per-device bodies, the global program and the NumPy oracle below are the
ones ``collectives.RECIPES["moe_layer"]`` and ``collectives.moe_layer`` run;
``axis`` may be one mesh axis name or a tuple of them.

Registered as: ``collectives.RECIPES["moe_layer"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.10.2, 0.12.0.
Run: ``python recipes/moe.py``
"""

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8
AXIS = "i"


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Auto,))


def mesh_size(mesh, axis):
    # devices along `axis`, one mesh axis name or a tuple of them
    names = (axis,) if isinstance(axis, str) else axis
    return math.prod(mesh.shape[name] for name in names)


def expert_capacity(tokens_per_device, n_experts, top_k=1, capacity=None,
                    capacity_factor=1.0):
    # slots per (source device, expert)
    if capacity is not None:
        return capacity
    return max(1, math.ceil(capacity_factor * tokens_per_device * top_k / n_experts))


def route(router_w, x, top_k=1):
    # x: [t, D] -> gate, expert: [t, top_k] (each token's picks, best first)
    logits = x @ router_w  # [t, E]
    # lax.top_k orders -0.0 below 0.0 (a zero token times a negative weight
    # is -0.0); they are equal, and ties go to the lower index
    logits = jnp.where(logits == 0, jnp.zeros_like(logits), logits)
    _, expert = lax.top_k(logits, top_k)
    probs = jax.nn.softmax(logits.astype(jnp.promote_types(x.dtype, jnp.float32)))
    gate = jnp.take_along_axis(probs, expert, axis=-1).astype(x.dtype)
    return gate, expert


def assign_slots(expert, n_experts, capacity, dtype):
    # expert: [t, k] -> mask [t*k, E, C] (one 1 per kept assignment), dropped
    assigned = jax.nn.one_hot(expert.reshape(-1), n_experts, dtype=jnp.int32)
    # slot of each assignment: earlier assignments (this device) to its expert
    slot = jnp.sum((jnp.cumsum(assigned, axis=0) - 1) * assigned, axis=-1)
    mask = (assigned[:, :, None]
            * jax.nn.one_hot(slot, capacity, dtype=jnp.int32)[:, None, :])
    return mask.astype(dtype), jnp.sum(slot >= capacity).astype(jnp.int32)


def expert_ffn(x, w_in, w_out):
    # x: [..., e, C, D]; w_in: [e, D, F]; w_out: [e, F, D]
    hidden = jax.nn.relu(jnp.einsum("...ecd,edf->...ecf", x, w_in))
    return jnp.einsum("...ecf,efd->...ecd", hidden, w_out)


# [start:body]
def moe_body(router_w, w_in, w_out, x, axis=AXIS, top_k=1, capacity=None,
             capacity_factor=1.0):
    # router_w: [D, E] everywhere; w_in: [e, D, F], w_out: [e, F, D] (this
    # device's experts); x: [t, D] (this device's tokens)
    n_experts = router_w.shape[-1]
    capacity = expert_capacity(x.shape[0], n_experts, top_k, capacity,
                               capacity_factor)
    gate, expert = route(router_w, x, top_k)  # [t, k] each
    mask, dropped = assign_slots(expert, n_experts, capacity, x.dtype)
    # buffer: [E, C, D]: slot c of expert j holds one assignment's token
    buffer = jnp.einsum("aec,ad->ecd", mask, jnp.repeat(x, top_k, axis=0))

    def exchange(b):
        return lax.all_to_all(b, axis, split_axis=0, concat_axis=0, tiled=True)

    received = exchange(buffer)  # [n*e, C, D]: my experts' slots from every device
    e = w_in.shape[0]
    out = expert_ffn(received.reshape(-1, e, *received.shape[1:]), w_in, w_out)
    back = exchange(out.reshape(received.shape))  # [E, C, D]: my tokens' results
    combined = jnp.einsum("aec,ecd->ad", mask, back) * gate.reshape(-1, 1)
    # -> [t, D], and the assignments dropped on all devices (the same everywhere)
    return combined.reshape(x.shape[0], top_k, -1).sum(1), lax.psum(dropped, axis)


def moe_dropless_body(router_w, w_in, w_out, x, axis=AXIS, top_k=1):
    # as moe_body, with no capacity: ragged_all_to_all sends each device
    # exactly the assignments bound for its experts (GPU/TPU only)
    n = lax.axis_size(axis)
    e = router_w.shape[-1] // n
    t = x.shape[0]
    gate, expert = route(router_w, x, top_k)
    flat = expert.reshape(-1)  # [t*k]
    order = jnp.argsort(flat, stable=True)  # group the assignments by expert
    sent = jnp.repeat(x, top_k, axis=0)[order]  # [t*k, D]
    local_id = (flat[order] % e).astype(jnp.int32)
    send_sizes = jnp.bincount(flat // e, length=n).astype(jnp.int32)  # per device
    input_offsets = jnp.cumsum(send_sizes) - send_sizes
    # what every device sends me, and where my rows land on each receiver
    recv_sizes = lax.all_to_all(send_sizes, axis, 0, 0, tiled=True)
    me = lax.axis_index(axis)
    before_me = lax.all_gather(send_sizes, axis)  # [n src, n dst]
    output_offsets = (jnp.cumsum(before_me, axis=0) - before_me)[me]
    rows = n * t * top_k  # the receive buffer: the worst case, all to one device

    def ragged(a, out, in_off, send, out_off, recv):
        return lax.ragged_all_to_all(a, out, in_off, send, out_off, recv,
                                     axis_name=axis)

    recv_offsets = jnp.cumsum(recv_sizes) - recv_sizes
    received = ragged(sent, jnp.zeros((rows, sent.shape[1]), sent.dtype),
                      input_offsets, send_sizes, output_offsets, recv_sizes)
    ids = ragged(local_id, jnp.zeros((rows,), jnp.int32), input_offsets,
                 send_sizes, output_offsets, recv_sizes)
    hidden = jax.nn.relu(jnp.einsum("rd,rdf->rf", received, w_in[ids]))
    result = jnp.einsum("rf,rfd->rd", hidden, w_out[ids])
    # send the results back: the receivers' offsets are the senders' inputs
    back_offsets = lax.all_to_all(recv_offsets, axis, 0, 0, tiled=True)
    returned = ragged(result, jnp.zeros_like(sent), recv_offsets, recv_sizes,
                      back_offsets, send_sizes)
    unsorted = jnp.zeros_like(returned).at[order].set(returned)
    return (unsorted * gate.reshape(-1, 1)).reshape(t, top_k, -1).sum(1)  # [t, D]
# [end:body]


# [start:pmap]
def moe_pmap(router_w, w_in, w_out, x, n, **routing):
    stack = lambda a: a.reshape(n, -1, *a.shape[1:])  # [n, rows / n, ...]
    f = jax.pmap(functools.partial(moe_body, **routing), axis_name=AXIS,
                 in_axes=(None, 0, 0, 0))
    out, dropped = f(router_w, stack(w_in), stack(w_out), stack(x))
    return np.asarray(out).reshape(x.shape), int(dropped[0])
# [end:pmap]


# [start:shard_map]
def moe_shard_map(router_w, w_in, w_out, x, mesh, **routing):
    f = jax.shard_map(functools.partial(moe_body, **routing), mesh=mesh,
                      in_specs=(P(), P(AXIS), P(AXIS), P(AXIS)),
                      out_specs=(P(AXIS), P()))
    out, dropped = jax.jit(f)(router_w, w_in, w_out, x)
    return out, int(dropped)
# [end:shard_map]


# [start:jit]
def moe_program(router_w, w_in, w_out, x, mesh, axis=AXIS, top_k=1, capacity=None,
                capacity_factor=1.0):
    # Each device's routing as a leading group dimension; sharding constraints
    # move the buffer from group-sharded to expert-sharded and back (XLA
    # emits the two all-to-alls).
    n, n_experts = mesh_size(mesh, axis), router_w.shape[-1]

    def constrain(a, spec):
        return lax.with_sharding_constraint(a, NamedSharding(mesh, spec))

    by_group = P(axis)
    groups = constrain(x.reshape(n, -1, x.shape[-1]), by_group)  # [n, t, D]
    capacity = expert_capacity(groups.shape[1], n_experts, top_k, capacity,
                               capacity_factor)
    gate, expert = jax.vmap(lambda g: route(router_w, g, top_k))(groups)
    mask, dropped = jax.vmap(
        lambda ex: assign_slots(ex, n_experts, capacity, x.dtype))(expert)
    mask, gate = constrain(mask, by_group), constrain(gate, by_group)
    buffer = jnp.einsum("gaec,gad->gecd", mask, jnp.repeat(groups, top_k, axis=1))
    buffer = constrain(buffer, by_group)  # [n, E, C, D]: each group's own buffer
    by_expert = constrain(buffer, P(None, axis))  # [n, E, C, D]: all-to-all
    out = constrain(expert_ffn(by_expert, w_in, w_out), P(None, axis))
    back = constrain(out, by_group)  # all-to-all back
    combined = jnp.einsum("gaec,gecd->gad", mask, back) * gate.reshape(n, -1, 1)
    combined = constrain(combined, by_group)
    out = combined.reshape(n, groups.shape[1], top_k, -1).sum(2)
    return out.reshape(x.shape), dropped.sum()


def moe_jit(router_w, w_in, w_out, x, mesh, **routing):
    shard = NamedSharding(mesh, P(AXIS))
    f = jax.jit(functools.partial(moe_program, mesh=mesh, **routing),
                in_shardings=(NamedSharding(mesh, P()), shard, shard, shard))
    out, dropped = f(router_w, w_in, w_out, x)
    return out, int(dropped)
# [end:jit]


# [start:explicit]
def moe_explicit_program(router_w, w_in, w_out, x, mesh, axis=AXIS, top_k=1,
                         capacity=None, capacity_factor=1.0):
    # moe_program on Explicit axes: the types carry the layouts, and the two
    # moves of the buffer are reshards (XLA emits the two all-to-alls).
    # x: f32[T@axis, D]; w_in: f32[E@axis, D, F]; router_w: f32[D, E]
    n, n_experts = mesh_size(mesh, axis), router_w.shape[-1]
    by_group = P(axis)
    # reshape names its output sharding where it splits or merges a dimension
    groups = jnp.reshape(x, (n, -1, x.shape[-1]), out_sharding=by_group)
    capacity = expert_capacity(groups.shape[1], n_experts, top_k, capacity,
                               capacity_factor)
    gate, expert = jax.vmap(lambda g: route(router_w, g, top_k))(groups)
    mask, dropped = jax.vmap(
        lambda ex: assign_slots(ex, n_experts, capacity, x.dtype))(expert)
    # repeat names its output sharding too: on JAX 0.12.1 it drops "axis"
    # from a group dimension of size 1 (a 1-device mesh) otherwise
    picks = jnp.repeat(groups, top_k, axis=1, out_sharding=by_group)
    # buffer: f32[n@axis, E, C, D], each group's own
    buffer = jnp.einsum("gaec,gad->gecd", mask, picks)
    by_expert = jax.sharding.reshard(buffer, P(None, axis))  # f32[n, E@axis, C, D]
    out = expert_ffn(by_expert, w_in, w_out)  # f32[n, E@axis, C, D]
    back = jax.sharding.reshard(out, by_group)  # all-to-all back
    gate = jnp.reshape(gate, (n, -1, 1), out_sharding=by_group)
    combined = jnp.einsum("gaec,gecd->gad", mask, back) * gate
    out = jnp.reshape(combined, (n, groups.shape[1], top_k, -1),
                      out_sharding=by_group).sum(2)
    return jnp.reshape(out, x.shape, out_sharding=by_group), dropped.sum()


def moe_explicit(router_w, w_in, w_out, x, mesh, **routing):
    # mesh: the same devices and names with every axis Explicit
    mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(
        jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))
    with jax.set_mesh(mesh):
        router_w = jax.sharding.reshard(router_w, P())
        w_in, w_out, x = jax.sharding.reshard((w_in, w_out, x), P(AXIS))
        out, dropped = jax.jit(functools.partial(
            moe_explicit_program, mesh=mesh, **routing))(router_w, w_in, w_out, x)
    return out, int(dropped)
# [end:explicit]


# [start:numpy]
def moe_numpy(router_w, w_in, w_out, x, n, top_k=1, capacity=None,
              capacity_factor=1.0):
    # route each device's tokens in order, drop past capacity, apply each
    # kept assignment's expert, sum gate-weighted; in float64
    dtype = np.result_type(x)
    router_w, w_in, w_out, x = (np.asarray(a, np.float64)
                                for a in (router_w, w_in, w_out, x))
    n_experts, t = router_w.shape[-1], x.shape[0] // n
    capacity = expert_capacity(t, n_experts, top_k, capacity, capacity_factor)
    out, dropped = np.zeros_like(x), 0
    for device in range(n):
        used = np.zeros(n_experts, int)  # slots taken on this device, per expert
        for row in range(device * t, (device + 1) * t):  # local token order
            logits = x[row] @ router_w
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            # best first, ties to the lower expert (-0.0 == 0.0 here)
            for j in np.argsort(-logits, kind="stable")[:top_k]:
                if used[j] >= capacity:
                    dropped += 1
                    continue
                used[j] += 1
                out[row] += probs[j] * (np.maximum(x[row] @ w_in[j], 0) @ w_out[j])
    return out.astype(dtype), np.asarray(dropped, np.int32)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh, n = make_mesh(N_DEVICES), N_DEVICES
    rng = np.random.default_rng(0)
    d, f, t = 4, 8, 6  # one expert per device
    args = (rng.standard_normal((d, n)), rng.standard_normal((n, d, f)),
            rng.standard_normal((n, f, d)), rng.standard_normal((n * t, d)))
    args = tuple(a.astype(np.float32) for a in args)
    for top_k, capacity in ((1, 1), (1, 2), (1, t), (2, 1), (2, t)):
        routing = dict(top_k=top_k, capacity=capacity)
        want, want_dropped = moe_numpy(*args, n, **routing)
        for form, (out, dropped) in (
                ("pmap", moe_pmap(*args, n, **routing)),
                ("shard_map", moe_shard_map(*args, mesh, **routing)),
                ("jit", moe_jit(*args, mesh, **routing)),
                ("explicit", moe_explicit(*args, mesh, **routing))):
            np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"moe ({form}, {routing})")
            assert dropped == want_dropped, (form, routing, dropped, want_dropped)
        print(f"top-{top_k}, capacity {capacity}: {int(want_dropped)} of "
              f"{n * t * top_k} assignments dropped")
    picks = np.argmax(args[3][:t] @ args[0], axis=-1)
    counts = np.bincount(picks, minlength=n)
    print(f"device 0's {t} tokens pick experts {picks.tolist()} (top-1): with "
          f"capacity 1 it drops sum(max(count - 1, 0)) = "
          f"{int(np.maximum(counts - 1, 0).sum())} of them")
    if jax.default_backend() != "cpu":  # XLA:CPU has no ragged all-to-all
        f = jax.jit(jax.shard_map(
            functools.partial(moe_dropless_body, top_k=2), mesh=mesh,
            in_specs=(P(), P(AXIS), P(AXIS), P(AXIS)), out_specs=P(AXIS)))
        want, _ = moe_numpy(*args, n, top_k=2, capacity=t)
        np.testing.assert_allclose(f(*args), want, rtol=1e-4, atol=1e-5)
        print("dropless (ragged_all_to_all) top-2 equals capacity t: nothing drops")
    print("ok: pmap, shard_map, jit and explicit agree with NumPy, dropped counts "
          "included")


if __name__ == "__main__":
    main()
