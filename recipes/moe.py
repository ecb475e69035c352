"""Mixture of experts: top-1 routing, all_to_all dispatch under a capacity.

What it shows: tokens ``[T, D]`` and experts (one per device here) are
sharded over the same axis. Each device routes its tokens (``argmax`` of
``x @ router_w``, gate = the softmax probability), gives each token a slot of
its expert first come first served in local token order, drops tokens past
``capacity`` slots, and packs a buffer ``[E, C, D]``. ``all_to_all`` (split
and concat on dim 0) sends row block ``j`` to device ``j``, which runs its
expert's FFN; a second ``all_to_all`` brings the results home, where they are
scaled by the gate. Dropped tokens output zeros; their count is ``psum``-ed.

Which form when: shard_map to control dispatch (capacity, dropping); jit of
the global program with sharding constraints (XLA emits the all-to-alls);
pmap as the legacy form.

Registered as: ``collectives.RECIPES["moe_layer"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.10.2, 0.12.0.
Run: ``python recipes/moe.py``
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), ("i",),
                         axis_types=(jax.sharding.AxisType.Auto,))


def route(router_w, x, capacity):
    # x: [t, D] -> mask [t, E, C] (one 1 per kept token), gate [t], dropped
    logits = x @ router_w
    expert = jnp.argmax(logits, axis=-1)
    gate = jnp.take_along_axis(jax.nn.softmax(logits), expert[:, None], -1)[:, 0]
    onehot = jax.nn.one_hot(expert, router_w.shape[1], dtype=jnp.int32)
    slot = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1)
    mask = onehot[:, :, None] * jax.nn.one_hot(slot, capacity, dtype=jnp.int32)[:, None]
    return mask.astype(x.dtype), gate, jnp.sum(slot >= capacity)


def expert_ffn(x, w_in, w_out):
    # x: [..., e, C, D]; w_in: [e, D, F]; w_out: [e, F, D]
    hidden = jax.nn.relu(jnp.einsum("...ecd,edf->...ecf", x, w_in))
    return jnp.einsum("...ecf,efd->...ecd", hidden, w_out)


def moe_body(router_w, w_in, w_out, x, capacity):
    mask, gate, dropped = route(router_w, x, capacity)
    buffer = jnp.einsum("tec,td->ecd", mask, x)  # [E, C, D]

    def exchange(b):
        return lax.all_to_all(b, "i", split_axis=0, concat_axis=0, tiled=True)

    received = exchange(buffer)  # [n*e, C, D]: my experts' slots from every device
    out = expert_ffn(received.reshape(-1, w_in.shape[0], *received.shape[1:]),
                     w_in, w_out).reshape(received.shape)
    back = exchange(out)  # [E, C, D]: results for my tokens
    return jnp.einsum("tec,ecd->td", mask, back) * gate[:, None], lax.psum(dropped, "i")


# [start:pmap]
def moe_pmap(router_w, w_in, w_out, x, capacity, n):
    stack = lambda a: a.reshape(n, -1, *a.shape[1:])
    f = jax.pmap(functools.partial(moe_body, capacity=capacity), axis_name="i",
                 in_axes=(None, 0, 0, 0))
    out, dropped = f(router_w, stack(w_in), stack(w_out), stack(x))
    return np.asarray(out).reshape(x.shape), int(dropped[0])
# [end:pmap]


# [start:shard_map]
def moe_shard_map(router_w, w_in, w_out, x, capacity, mesh):
    f = jax.shard_map(functools.partial(moe_body, capacity=capacity), mesh=mesh,
                      in_specs=(P(), P("i"), P("i"), P("i")), out_specs=(P("i"), P()))
    out, dropped = jax.jit(f)(router_w, w_in, w_out, x)
    return out, int(dropped)
# [end:shard_map]


# [start:jit]
def moe_jit(router_w, w_in, w_out, x, capacity, mesh):
    n = mesh.shape["i"]

    def constrain(a, spec):
        return lax.with_sharding_constraint(a, NamedSharding(mesh, spec))

    def program(router_w, w_in, w_out, x):
        groups = constrain(x.reshape(n, -1, x.shape[-1]), P("i"))  # [n, t, D]
        mask, gate, dropped = jax.vmap(lambda g: route(router_w, g, capacity))(groups)
        buffer = constrain(jnp.einsum("gtec,gtd->gecd", mask, groups), P("i"))
        out = expert_ffn(constrain(buffer, P(None, "i")), w_in, w_out)  # all-to-all
        back = constrain(constrain(out, P(None, "i")), P("i"))  # all-to-all back
        y = jnp.einsum("gtec,gecd->gtd", mask, back) * gate[..., None]
        return y.reshape(x.shape), dropped.sum()

    shard = NamedSharding(mesh, P("i"))
    out, dropped = jax.jit(program, in_shardings=(
        NamedSharding(mesh, P()), shard, shard, shard))(router_w, w_in, w_out, x)
    return out, int(dropped)
# [end:jit]


# [start:numpy]
def moe_numpy(router_w, w_in, w_out, x, capacity, n):
    out, dropped, t = np.zeros_like(x), 0, x.shape[0] // n
    for device in range(n):
        used = np.zeros(router_w.shape[1], int)
        for row in range(device * t, (device + 1) * t):  # local token order
            logits = x[row] @ router_w
            j = int(np.argmax(logits))
            if used[j] >= capacity:
                dropped += 1
                continue
            used[j] += 1
            probs = np.exp(logits - logits.max())
            gate = probs[j] / probs.sum()
            out[row] = gate * (np.maximum(x[row] @ w_in[j], 0) @ w_out[j])
    return out, dropped
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh, n = make_mesh(N_DEVICES), N_DEVICES
    rng = np.random.default_rng(0)
    d, f, t = 4, 8, 6
    args = (rng.standard_normal((d, n)), rng.standard_normal((n, d, f)),
            rng.standard_normal((n, f, d)), rng.standard_normal((n * t, d)))
    args = tuple(a.astype(np.float32) for a in args)
    for capacity in (1, 2, t):
        want, want_dropped = moe_numpy(*args, capacity, n)
        for form, (out, dropped) in (
                ("pmap", moe_pmap(*args, capacity, n)),
                ("shard_map", moe_shard_map(*args, capacity, mesh)),
                ("jit", moe_jit(*args, capacity, mesh))):
            np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"moe ({form}, {capacity=})")
            assert dropped == want_dropped, (form, capacity, dropped, want_dropped)
        print(f"capacity {capacity}: {want_dropped} of {n * t} tokens dropped")
    print("ok: pmap, shard_map and jit agree with NumPy, dropped counts included")


if __name__ == "__main__":
    main()
