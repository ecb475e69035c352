"""Ring attention: sequence-parallel attention with K/V passed round a ring.

What it shows: ``q``, ``k``, ``v`` (``[seq, heads, head_dim]``) are sharded
along the sequence. Each device keeps its query block and passes its key and
value blocks to the next device with ``ppermute``, ``n - 1`` times inside a
``lax.scan``; an online (log-sum-exp) softmax folds each arriving block into
running statistics (max ``m``, sum ``total``, output ``o``), so no device
ever holds more than one remote K/V block or the full score matrix. A causal
variant masks keys after each query (blocks from later devices are wholly
masked). Gradients flow through the scan. Scores and softmax statistics are
computed in float32 at least (float16/bfloat16 inputs are upcast), and the
output comes back in the input dtype.

Which form when: shard_map for long sequences (K/V per device is 1/n of the
sequence; on accelerators each permute overlaps the previous block's
compute); jit of dense attention is the all-gather-K/V baseline (XLA gathers
the whole K and V on every device); explicit says that baseline in the types
(K and V resharded to whole sequences: the same two all-gathers; a ring's
per-device schedule has no spelling there); pmap as the legacy form.

The per-device body, the dense global program and the NumPy oracle below
are the ones ``collectives.RECIPES["ring_attention"]`` (and
``"ring_attention_causal"``) run: ``axis`` may be one mesh axis name or a
tuple of them, and the legacy pmap form of a 2-D mesh (``pmap`` of ``vmap``)
passes ``shift=stepwise_shift``.

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
AXIS = "i"


def make_mesh(shape, names=(AXIS,), axis_type=jax.sharding.AxisType.Auto):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from
    # 0.9) unless told otherwise; the explicit form asks for Explicit ones.
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


# -- the ring: one ppermute moves every block one place ------------------------

# [start:ring_shift]
def ring_shift(x, axis=AXIS, shift=1):
    # Device d (numbered as lax.axis_index(axis) numbers it) receives the block
    # of device d - shift.
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    sizes = [lax.axis_size(name) for name in names]
    n = math.prod(sizes)
    pairs = [(d, (d + shift) % n) for d in range(n)]
    # Over several axes ppermute numbers devices in mesh order (JAX 0.12
    # refuses a tuple in another order), axis_index in the tuple's: renumber.
    mesh_order = tuple(name for name in jax.sharding.get_abstract_mesh().axis_names
                       if name in names) if len(names) > 1 else names
    if len(mesh_order) == len(names) and mesh_order != names:
        where = [names.index(name) for name in mesh_order]

        def renumber(d):
            digits = np.unravel_index(d, sizes)
            return int(np.ravel_multi_index([digits[w] for w in where],
                                            [sizes[w] for w in where]))

        axis, pairs = mesh_order, [(renumber(s), renumber(t)) for s, t in pairs]
    return lax.ppermute(x, axis, pairs)


def stepwise_shift(x, axis=AXIS, shift=1):
    # ring_shift by +1 or -1 with one ppermute per mesh axis: vmap batches a
    # ppermute over one axis only, so pmap(vmap(...)) needs this. Shift along
    # the last (minor) axis; where that wrapped round, take the block one
    # more step along the next axis out.
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    out = ring_shift(x, names[-1], shift)

    def at_edge(name):  # this device received a block that wrapped round `name`
        return lax.axis_index(name) == (0 if shift == 1 else lax.axis_size(name) - 1)

    wrapped = at_edge(names[-1])
    for name in reversed(names[:-1]):
        out = jnp.where(wrapped, ring_shift(out, name, shift), out)
        wrapped = wrapped & at_edge(name)
    return out
# [end:ring_shift]


# -- the online softmax ---------------------------------------------------------
# Stats per head and query: m [h, s] running max, total [h, s] running sum of
# exp(score - m), o [h, s, d] running sum of exp(score - m) * v.

def accumulator_dtype(dtype):
    # scores and softmax statistics: float32 at least
    return jnp.promote_types(dtype, jnp.float32)


def scores_of(q, k, mask):
    # q: [s, h, d], k: [t, h, d] -> [h, s, t], scaled; masked entries -inf
    scores = jnp.einsum("shd,thd->hst", q, k) / math.sqrt(q.shape[-1])
    return scores if mask is None else jnp.where(mask, scores, -jnp.inf)


def first_block(q, k, v, mask):
    # The stats of the first block seen: every row has a finite score (a
    # device's own block holds the diagonal).
    scores = scores_of(q, k, mask)
    m = scores.max(-1)
    p = jnp.exp(scores - m[..., None])
    return m, p.sum(-1), jnp.einsum("hst,thd->hsd", p, v)


def fold_block(stats, q, k, v, mask):
    # Fold one more K/V block into the stats (log-sum-exp rescaling).
    m, total, o = stats
    scores = scores_of(q, k, mask)
    m_new = jnp.maximum(m, scores.max(-1))  # finite: m is
    rescale = jnp.exp(m - m_new)
    p = jnp.exp(scores - m_new[..., None])  # exp(-inf) = 0 where masked
    return (m_new, total * rescale + p.sum(-1),
            o * rescale[..., None] + jnp.einsum("hst,thd->hsd", p, v))


def finish(stats, dtype):
    # stats -> the output [s, h, d] in `dtype`
    _, total, o = stats
    return jnp.transpose(o / total[..., None], (1, 0, 2)).astype(dtype)


def causal_mask(q_block, k_block, rows):
    # query position p sees key position t when t <= p: [1, s, t], all heads
    q_pos = q_block * rows + jnp.arange(rows)
    k_pos = k_block * rows + jnp.arange(rows)
    return (q_pos[:, None] >= k_pos[None, :])[None]


# [start:body]
# q, k, v: [s, h, d] on each device (positions me*s : (me+1)*s) -> [s, h, d]
def ring_attention_body(q, k, v, axis=AXIS, causal=False, shift=ring_shift):
    n, me, rows = lax.axis_size(axis), lax.axis_index(axis), q.shape[0]
    acc = accumulator_dtype(q.dtype)
    qf = q.astype(acc)

    def mask(src):
        return causal_mask(me, src, rows) if causal else None

    # step 0: the own block (for causal, the diagonal block)
    stats = first_block(qf, k.astype(acc), v.astype(acc), mask(me))

    def step(carry, i):
        k, v, stats = carry
        # one ppermute each: now the K and V blocks of device me - i
        k, v = shift(k, axis, 1), shift(v, axis, 1)
        stats = fold_block(stats, qf, k.astype(acc), v.astype(acc),
                           mask((me - i) % n))
        return (k, v, stats), None

    (_, _, stats), _ = lax.scan(step, (k, v, stats), jnp.arange(1, n), unroll=True)
    return finish(stats, q.dtype)
# [end:body]


# [start:pmap]
def ring_attention_pmap(q, k, v, n_devices, causal=False):
    stack = lambda x: x.reshape(n_devices, -1, *x.shape[1:])  # [n, s, h, d]
    f = jax.pmap(functools.partial(ring_attention_body, axis=AXIS, causal=causal),
                 axis_name=AXIS)
    return np.asarray(f(stack(q), stack(k), stack(v))).reshape(q.shape)


def ring_attention_pmap_2d(q, k, v, shape, causal=False):
    # The legacy 2-D mesh: pmap over "i" of vmap over "j", the sequence over
    # both (device i * n_j + j holds block i * n_j + j). vmap batches a
    # ppermute over one axis only: shift one axis at a time.
    body = functools.partial(ring_attention_body, axis=("i", "j"), causal=causal,
                             shift=stepwise_shift)
    stack = lambda x: x.reshape(*shape, -1, *x.shape[1:])  # [n_i, n_j, s, h, d]
    f = jax.pmap(jax.vmap(body, axis_name="j"), axis_name="i",
                 devices=jax.devices()[:shape[0]])
    return np.asarray(f(stack(q), stack(k), stack(v))).reshape(q.shape)
# [end:pmap]


# [start:shard_map]
def ring_attention_shard_map(q, k, v, mesh, causal=False, axis=AXIS):
    body = functools.partial(ring_attention_body, axis=axis, causal=causal)
    f = jax.shard_map(body, mesh=mesh, in_specs=(P(axis),) * 3, out_specs=P(axis))
    return jax.jit(f)(q, k, v)
# [end:shard_map]


# [start:jit]
def attention_program(q, k, v, causal=False):
    # dense attention on the global arrays [S, h, d], in float32 at least
    acc = accumulator_dtype(q.dtype)
    mask = causal_mask(0, 0, q.shape[0]) if causal else None
    return finish(first_block(q.astype(acc), k.astype(acc), v.astype(acc), mask),
                  q.dtype)


def ring_attention_jit(q, k, v, mesh, causal=False):
    # jit partitions the dense program: XLA all-gathers K and V
    sharding = NamedSharding(mesh, P(AXIS))
    f = jax.jit(functools.partial(attention_program, causal=causal),
                in_shardings=(sharding,) * 3, out_shardings=sharding)
    return f(q, k, v)
# [end:jit]


# [start:explicit]
def ring_attention_explicit_program(q, k, v, causal=False):
    # q, k, v: f32[S@seq, h@heads, d]: the layout is in the types; read it.
    spec = tuple(jax.typeof(q).sharding.spec)
    seq, heads, _ = spec + (None,) * (q.ndim - len(spec))
    # What jit does, in the types: K and V resharded to whole sequences (two
    # all-gathers). A ring has no spelling here: its schedule is per device.
    k, v = (jax.sharding.reshard(x, P(None, heads, None)) for x in (k, v))
    acc = accumulator_dtype(q.dtype)
    mask = None
    if causal:  # [1, S@seq, S]: each device the rows of its own queries
        mask = jax.sharding.reshard(causal_mask(0, 0, q.shape[0]), P(None, seq, None))
    # scores: [h@heads, S@seq, S]: each device its queries against every key
    stats = first_block(q.astype(acc), k.astype(acc), v.astype(acc), mask)
    return finish(stats, q.dtype)  # f32[S@seq, h@heads, d]


def ring_attention_explicit(q, k, v, mesh, causal=False):
    # mesh: Explicit axes
    rows = NamedSharding(mesh, P(AXIS))
    with jax.set_mesh(mesh):
        f = jax.jit(lambda q, k, v: jax.sharding.reshard(
            ring_attention_explicit_program(q, k, v, causal), P(AXIS)))
        return f(*(jax.device_put(x, rows) for x in (q, k, v)))
# [end:explicit]


# [start:numpy]
def attention_numpy(q, k, v, causal=False):
    # dense softmax attention in float64 (stable: the row max is subtracted),
    # returned in q's dtype
    dtype = np.result_type(q)
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("shd,thd->hst", q, k) / math.sqrt(q.shape[-1])
    if causal:
        scores = np.where(np.tri(q.shape[0], dtype=bool)[None], scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    out = np.einsum("hst,thd->shd", p / p.sum(-1, keepdims=True), v)
    return out.astype(dtype)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh((N_DEVICES,))
    mesh_2d = make_mesh((4, 2), ("i", "j"))
    explicit_mesh = make_mesh((N_DEVICES,), axis_type=jax.sharding.AxisType.Explicit)
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 64, 4, 8)).astype(np.float32)
    for causal in (False, True):
        want = attention_numpy(q, k, v, causal)
        for form, got in (
                ("pmap", ring_attention_pmap(q, k, v, N_DEVICES, causal)),
                ("pmap(vmap), 4x2", ring_attention_pmap_2d(q, k, v, (4, 2), causal)),
                ("shard_map", ring_attention_shard_map(q, k, v, mesh, causal)),
                ("shard_map, 4x2", ring_attention_shard_map(q, k, v, mesh_2d, causal,
                                                            axis=("i", "j"))),
                ("jit", ring_attention_jit(q, k, v, mesh, causal)),
                ("explicit", ring_attention_explicit(q, k, v, explicit_mesh, causal))):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5,
                                       err_msg=f"ring attention ({form}, {causal=})")
    kv_block = q.nbytes // N_DEVICES
    print(f"q, k, v: float32{list(q.shape)}; K and V blocks per device: "
          f"{kv_block} bytes each (1/{N_DEVICES} of the sequence)")
    # By hand: the first query of a causal sequence sees only the first key,
    # so its output row is v[0] itself.
    got = np.asarray(ring_attention_shard_map(q, k, v, mesh, causal=True))
    print("causal, output row 0, head 0:", np.round(got[0, 0, :3], 5).tolist(),
          "= v[0, 0, :3]:", np.round(v[0, 0, :3], 5).tolist())
    print("ok: pmap, pmap(vmap), shard_map (8 and 4x2), jit and explicit agree "
          "with NumPy, causal and not")


if __name__ == "__main__":
    main()
