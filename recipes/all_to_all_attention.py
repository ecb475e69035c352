"""All-to-all attention: reshard sequence -> heads, attend locally, reshard back.

What it shows: ``q``, ``k``, ``v`` (``[seq, heads, head_dim]``) arrive
sharded along the sequence. One ``all_to_all`` each (``split_axis=1`` heads,
``concat_axis=0`` sequence) turns every device's sequence block into whole
sequences for ``heads / n`` heads; attention needs nothing from other devices
then; one more ``all_to_all`` (the axes swapped) brings the output back to
sequence sharding. Four all-to-alls, each moving ``(n-1)/n`` of a block: far
fewer bytes than passing K/V round a ring, but the heads must divide by the
number of devices, and each device holds the full score matrix of its heads.
Scores and the softmax are computed in float32 at least (float16/bfloat16
inputs are upcast), and the output comes back in the input dtype.

Which form when: shard_map when heads >= devices (DeepSpeed-Ulysses style);
ring attention when they are not or sequences are too long for
``[heads/n, seq, seq]`` scores; jit of dense attention all-gathers K/V
instead; explicit writes this recipe's algorithm in the types (q, k, v
resharded from sequence- to head-sharded, dense attention, the output
resharded back: the same four all-to-alls, chosen by the reshards rather
than by hand); pmap as the legacy form.

The per-device body, the dense global program and the NumPy oracle below
are the ones ``collectives.RECIPES["all_to_all_attention"]`` runs: ``axis``
may be one mesh axis name or a tuple of them, and ``causal=True`` masks keys
after each query.

Registered as: ``collectives.RECIPES["all_to_all_attention"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.10.2, 0.12.0.
Run: ``python recipes/all_to_all_attention.py``
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


def make_mesh(n_devices, axis_type=jax.sharding.AxisType.Auto):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from
    # 0.9) unless told otherwise; the explicit form asks for Explicit ones.
    return jax.make_mesh((n_devices,), (AXIS,), axis_types=(axis_type,))


def attention_program(q, k, v, causal=False):
    # Dense softmax attention on whole sequences: q, k, v [S, h, d] -> [S, h, d].
    # Scores and softmax statistics in float32 at least; the output in q's dtype.
    acc = jnp.promote_types(q.dtype, jnp.float32)
    qf, kf, vf = (x.astype(acc) for x in (q, k, v))
    scores = jnp.einsum("shd,thd->hst", qf, kf) / math.sqrt(q.shape[-1])  # [h, S, S]
    if causal:  # query position p sees key position t when t <= p
        scores = jnp.where(jnp.tri(q.shape[0], dtype=bool)[None], scores, -jnp.inf)
    p = jnp.exp(scores - scores.max(-1)[..., None])  # stable: the row max first
    out = jnp.einsum("hst,thd->hsd", p, vf) / p.sum(-1)[..., None]  # [h, S, d]
    return jnp.transpose(out, (1, 0, 2)).astype(q.dtype)


# [start:body]
# q, k, v: [s, H, d] sequence blocks on each device -> [s, H, d]
def all_to_all_attention_body(q, k, v, axis=AXIS, causal=False):
    def to_heads(x):
        # [s, H, d] sequence block -> [n*s, H/n, d]: whole sequence, H/n heads
        return lax.all_to_all(x, axis, split_axis=1, concat_axis=0, tiled=True)

    out = attention_program(to_heads(q), to_heads(k), to_heads(v), causal)
    # [n*s, H/n, d] -> [s, H, d]: this device's sequence block, every head
    return lax.all_to_all(out, axis, split_axis=0, concat_axis=1, tiled=True)
# [end:body]


# [start:pmap]
def all_to_all_attention_pmap(q, k, v, n_devices, causal=False):
    stack = lambda x: x.reshape(n_devices, -1, *x.shape[1:])  # [n, s, H, d]
    f = jax.pmap(functools.partial(all_to_all_attention_body, axis=AXIS,
                                   causal=causal), axis_name=AXIS)
    return np.asarray(f(stack(q), stack(k), stack(v))).reshape(q.shape)
# [end:pmap]


# [start:shard_map]
def all_to_all_attention_shard_map(q, k, v, mesh, causal=False):
    heads, n = q.shape[1], mesh.shape[AXIS]
    if heads % n:
        raise ValueError(
            f"q, k, v have {heads} heads, which must split evenly over the {n} "
            f"devices along {AXIS!r}. Fix: use a multiple of {n} heads, or ring "
            "attention.")
    f = jax.shard_map(functools.partial(all_to_all_attention_body, axis=AXIS,
                                        causal=causal),
                      mesh=mesh, in_specs=(P(AXIS),) * 3, out_specs=P(AXIS))
    return jax.jit(f)(q, k, v)
# [end:shard_map]


# [start:jit]
def attention_jit(q, k, v, mesh, causal=False):
    # jit partitions the dense program: XLA all-gathers K and V
    sharding = NamedSharding(mesh, P(AXIS))
    f = jax.jit(functools.partial(attention_program, causal=causal),
                in_shardings=(sharding,) * 3, out_shardings=sharding)
    return f(q, k, v)
# [end:jit]


# [start:explicit]
def all_to_all_attention_explicit_program(q, k, v, causal=False):
    # q, k, v: f32[S@seq, H@heads, d]: the layout is in the types; read it.
    spec = tuple(jax.typeof(q).sharding.spec)
    seq, heads, _ = spec + (None,) * (q.ndim - len(spec))

    def names(entry):  # a spec entry -> a tuple of mesh axis names
        return () if entry is None else (entry,) if isinstance(entry, str) else entry

    # The body's algorithm in the types: from sequence-sharded to
    # head-sharded (each device whole sequences of H/n heads: one all-to-all
    # each), dense attention with nothing to fetch, and back (one more).
    by_heads = P(None, names(heads) + names(seq), None)
    out = attention_program(*(jax.sharding.reshard(x, by_heads) for x in (q, k, v)),
                            causal)  # f32[S, H@(heads, seq), d]
    return jax.sharding.reshard(out, P(seq, heads, None))  # f32[S@seq, H@heads, d]


def all_to_all_attention_explicit(q, k, v, mesh, causal=False):
    # mesh: Explicit axes; the heads must split over the devices
    rows = NamedSharding(mesh, P(AXIS))
    with jax.set_mesh(mesh):
        f = jax.jit(lambda q, k, v: jax.sharding.reshard(
            all_to_all_attention_explicit_program(q, k, v, causal), P(AXIS)))
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
    mesh = make_mesh(N_DEVICES)
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 64, 16, 8)).astype(np.float32)
    for causal in (False, True):
        want = attention_numpy(q, k, v, causal)
        for form, got in (
                ("pmap", all_to_all_attention_pmap(q, k, v, N_DEVICES, causal)),
                ("shard_map", all_to_all_attention_shard_map(q, k, v, mesh, causal)),
                ("jit", attention_jit(q, k, v, mesh, causal)),
                ("explicit", all_to_all_attention_explicit(
                    q, k, v, make_mesh(N_DEVICES, jax.sharding.AxisType.Explicit),
                    causal))):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5,
                                       err_msg=f"all-to-all attention ({form}, "
                                               f"{causal=})")
    # By hand: the first query of a causal sequence sees only the first key,
    # so its output row is v[0] itself.
    got = np.asarray(all_to_all_attention_shard_map(q, k, v, mesh, causal=True))
    print("causal, output row 0, head 0:", np.round(got[0, 0, :3], 5).tolist(),
          "= v[0, 0, :3]:", np.round(v[0, 0, :3], 5).tolist())
    try:
        all_to_all_attention_shard_map(q[:, :12], k[:, :12], v[:, :12], mesh)
    except ValueError as err:
        print("12 heads over 8 devices:", err)
    else:
        raise AssertionError("12 heads over 8 devices should be refused")
    print("ok: pmap, shard_map, jit and explicit agree with NumPy, causal and not")


if __name__ == "__main__":
    main()
