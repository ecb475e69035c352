"""All-to-all attention: reshard sequence -> heads, attend locally, reshard back.

What it shows: ``q``, ``k``, ``v`` (``[seq, heads, head_dim]``) arrive
sharded along the sequence. One ``all_to_all`` each (``split_axis=1`` heads,
``concat_axis=0`` sequence) turns every device's sequence block into whole
sequences for ``heads / n`` heads; attention needs nothing from other devices
then; one more ``all_to_all`` (the axes swapped) brings the output back to
sequence sharding. Four all-to-alls, each moving ``(n-1)/n`` of a block: far
fewer bytes than passing K/V round a ring, but the heads must divide by the
number of devices, and each device holds the full score matrix of its heads.

Which form when: shard_map when heads >= devices (DeepSpeed-Ulysses style);
ring attention when they are not or sequences are too long for
``[heads/n, seq, seq]`` scores; jit of dense attention all-gathers K/V
instead; pmap as the legacy form.

Registered as: ``collectives.RECIPES["all_to_all_attention"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.10.2, 0.12.0.
Run: ``python recipes/all_to_all_attention.py``
"""

import math
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


def dense_attention(q, k, v):
    scores = jnp.einsum("shd,thd->hst", q, k) / math.sqrt(q.shape[-1])
    return jnp.einsum("hst,thd->shd", jax.nn.softmax(scores, axis=-1), v)


def all_to_all_attention(q, k, v):
    # q, k, v: [s, H, d] sequence blocks -> [n*s, H/n, d]: whole sequence, H/n heads
    def to_heads(x):
        return lax.all_to_all(x, "i", split_axis=1, concat_axis=0, tiled=True)

    out = dense_attention(to_heads(q), to_heads(k), to_heads(v))
    # [n*s, H/n, d] -> [s, H, d]: this device's sequence block, every head
    return lax.all_to_all(out, "i", split_axis=0, concat_axis=1, tiled=True)


# [start:pmap]
def all_to_all_attention_pmap(q, k, v, n_devices):
    stack = lambda x: x.reshape(n_devices, -1, *x.shape[1:])  # [n, s, H, d]
    out = jax.pmap(all_to_all_attention, axis_name="i")(stack(q), stack(k), stack(v))
    return np.asarray(out).reshape(q.shape)
# [end:pmap]


# [start:shard_map]
def all_to_all_attention_shard_map(q, k, v, mesh):
    heads, n = q.shape[1], mesh.shape["i"]
    if heads % n:
        raise ValueError(
            f"q, k, v have {heads} heads, which must split evenly over the {n} "
            f"devices along 'i'. Fix: use a multiple of {n} heads, or ring "
            "attention.")
    f = jax.shard_map(all_to_all_attention, mesh=mesh, in_specs=(P("i"),) * 3,
                      out_specs=P("i"))
    return jax.jit(f)(q, k, v)
# [end:shard_map]


# [start:jit]
def attention_jit(q, k, v, mesh):
    sharding = NamedSharding(mesh, P("i"))
    return jax.jit(dense_attention, in_shardings=(sharding,) * 3,
                   out_shardings=sharding)(q, k, v)
# [end:jit]


# [start:numpy]
def attention_numpy(q, k, v):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("shd,thd->hst", q, k) / math.sqrt(q.shape[-1])
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("hst,thd->shd", p / p.sum(-1, keepdims=True), v)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 64, 16, 8)).astype(np.float32)
    want = attention_numpy(q, k, v)
    for form, got in (("pmap", all_to_all_attention_pmap(q, k, v, N_DEVICES)),
                      ("shard_map", all_to_all_attention_shard_map(q, k, v, mesh)),
                      ("jit", attention_jit(q, k, v, mesh))):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"all-to-all attention ({form} form)")
    try:
        all_to_all_attention_shard_map(q[:, :12], k[:, :12], v[:, :12], mesh)
    except ValueError as err:
        print("12 heads over 8 devices:", err)
    else:
        raise AssertionError("12 heads over 8 devices should be refused")
    print("ok: pmap, shard_map and jit agree with NumPy")


if __name__ == "__main__":
    main()
