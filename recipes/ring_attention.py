"""Ring attention: sequence-parallel attention with K/V passed round a ring.

What it shows: ``q``, ``k``, ``v`` (``[seq, heads, head_dim]``) are sharded
along the sequence. Each device keeps its query block and passes its key and
value blocks to the next device with ``ppermute``, ``n - 1`` times inside a
``lax.scan``; an online (log-sum-exp) softmax folds each arriving block into
running statistics (max ``m``, sum ``total``, output ``o``), so no device
ever holds more than one remote K/V block or the full score matrix. A causal
variant masks keys after each query (blocks from later devices are wholly
masked). Gradients flow through the scan.

Which form when: shard_map for long sequences (K/V per device is 1/n of the
sequence; on accelerators each permute overlaps the previous block's
compute); jit of dense attention is the all-gather-K/V baseline (XLA gathers
the whole K and V on every device); pmap as the legacy form.

Registered as: ``collectives.RECIPES["ring_attention"]``,
``collectives.RECIPES["ring_attention_causal"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.10.2, 0.12.0.
Run: ``python recipes/ring_attention.py``
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


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), ("i",),
                         axis_types=(jax.sharding.AxisType.Auto,))


def fold_block(stats, q, k, v, mask):
    """Online softmax: fold one K/V block into (m, total, o)."""
    m, total, o = stats  # m, total: [h, s]; o: [h, s, d]
    scores = jnp.einsum("shd,thd->hst", q, k) / math.sqrt(q.shape[-1])
    scores = jnp.where(mask, scores, -jnp.inf)
    m_new = jnp.maximum(m, scores.max(-1))
    rescale = jnp.exp(m - m_new)
    p = jnp.exp(scores - m_new[..., None])
    return (m_new, total * rescale + p.sum(-1),
            o * rescale[..., None] + jnp.einsum("hst,thd->hsd", p, v))


def ring_attention(q, k, v, axis, causal):
    # q, k, v: [s, h, d] on each device: positions me*s : (me+1)*s
    n, me, rows = lax.axis_size(axis), lax.axis_index(axis), q.shape[0]
    heads = q.shape[1]
    perm = [(j, (j + 1) % n) for j in range(n)]

    def mask(src):
        if not causal:
            return jnp.ones((1, rows, rows), bool)
        q_pos = me * rows + jnp.arange(rows)
        k_pos = src * rows + jnp.arange(rows)
        return (q_pos[:, None] >= k_pos[None, :])[None]

    start = (jnp.full((heads, rows), -jnp.inf), jnp.zeros((heads, rows)),
             jnp.zeros((heads, rows, q.shape[2])))
    stats = fold_block(start, q, k, v, mask(me))  # own block: finite max

    def step(carry, i):
        k, v, stats = carry
        k, v = lax.ppermute(k, axis, perm), lax.ppermute(v, axis, perm)
        return (k, v, fold_block(stats, q, k, v, mask((me - i) % n))), None

    (_, _, (_, total, o)), _ = lax.scan(step, (k, v, stats), jnp.arange(1, n),
                                        unroll=True)
    return jnp.transpose(o / total[..., None], (1, 0, 2))


# [start:pmap]
def ring_attention_pmap(q, k, v, n_devices, causal=False):
    stack = lambda x: x.reshape(n_devices, -1, *x.shape[1:])  # [n, s, h, d]
    f = jax.pmap(functools.partial(ring_attention, axis="i", causal=causal),
                 axis_name="i")
    return np.asarray(f(stack(q), stack(k), stack(v))).reshape(q.shape)
# [end:pmap]


# [start:shard_map]
def ring_attention_shard_map(q, k, v, mesh, causal=False):
    f = jax.shard_map(functools.partial(ring_attention, axis="i", causal=causal),
                      mesh=mesh, in_specs=(P("i"),) * 3, out_specs=P("i"))
    return jax.jit(f)(q, k, v)
# [end:shard_map]


# [start:jit]
def ring_attention_jit(q, k, v, mesh, causal=False):
    # dense attention on the global arrays: XLA all-gathers K and V
    def dense(q, k, v):
        scores = jnp.einsum("shd,thd->hst", q, k) / math.sqrt(q.shape[-1])
        if causal:
            seq = q.shape[0]
            scores = jnp.where(jnp.tri(seq, dtype=bool)[None], scores, -jnp.inf)
        return jnp.einsum("hst,thd->shd", jax.nn.softmax(scores, axis=-1), v)

    sharding = NamedSharding(mesh, P("i"))
    return jax.jit(dense, in_shardings=(sharding,) * 3, out_shardings=sharding)(
        q, k, v)
# [end:jit]


# [start:numpy]
def attention_numpy(q, k, v, causal=False):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("shd,thd->hst", q, k) / math.sqrt(q.shape[-1])
    if causal:
        scores = np.where(np.tri(q.shape[0], dtype=bool)[None], scores, -np.inf)
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
    q, k, v = rng.standard_normal((3, 64, 4, 8)).astype(np.float32)
    for causal in (False, True):
        want = attention_numpy(q, k, v, causal)
        for form, got in (
                ("pmap", ring_attention_pmap(q, k, v, N_DEVICES, causal)),
                ("shard_map", ring_attention_shard_map(q, k, v, mesh, causal)),
                ("jit", ring_attention_jit(q, k, v, mesh, causal))):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5,
                                       err_msg=f"ring attention ({form}, {causal=})")
    kv_block = q.nbytes // N_DEVICES
    print(f"q, k, v: float32{list(q.shape)}; K and V blocks per device: "
          f"{kv_block} bytes each (1/{N_DEVICES} of the sequence)")
    print("ok: pmap, shard_map and jit agree with NumPy, causal and not")


if __name__ == "__main__":
    main()
