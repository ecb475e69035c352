"""Reduce-scatter: sum over devices, each device keeps only its slice.

What it shows: ``psum_scatter(x, "i", tiled=True)`` sums the blocks of all
devices like ``psum``, but device ``d`` keeps only rows ``d*c:(d+1)*c`` of
the sum. It moves half the bytes of an all-reduce, and an all-gather of its
result *is* the all-reduce: ``all_gather(psum_scatter(x)) == psum(x)``.
That is how ring all-reduce works, and why ZeRO/FSDP-style training keeps
gradients scattered.

Which form when: shard_map to keep the scattered slice for more local work
(e.g. updating a sharded parameter); jit when a sum's output sharding is
``P("i")`` (XLA emits the reduce-scatter for you); explicit (Explicit mesh
axes) when the sum's result type should say it stays sharded: the program
reshards it to ``P("i")`` (GPU and TPU compilers emit a reduce-scatter;
XLA:CPU an all-reduce and a slice, as for jit); pmap as the legacy form.

The per-device bodies, the global program and the NumPy oracle below are
the ones ``collectives.RECIPES["psum_scatter"]`` runs: ``axis`` may be one
mesh axis name or a tuple of them (device ``d`` counts row-major over them).

Registered as: ``collectives.RECIPES["psum_scatter"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/psum_scatter.py``
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8
AXIS = "i"


def make_explicit_mesh(n_devices):
    # jax.make_mesh's default from JAX 0.9 on, spelled out for every version.
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Explicit,))


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Auto,))


def axis_names(axis):
    # one mesh axis name or a tuple of them -> a tuple of names
    return (axis,) if isinstance(axis, str) else tuple(axis)


# [start:body]
def psum_scatter_body(x, axis=AXIS):
    # x: [n*c, m] on each device -> [c, m]: device d keeps rows d*c:(d+1)*c
    # of the sum over the devices of `axis`
    return lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)


# The legacy pmap body: pmap maps mesh axes after the first with vmap, which
# scatters over one axis at a time: the outer axis picks a group of chunks,
# the inner axis one chunk of it (row-major device order).
def psum_scatter_pmap_body(x, axis=AXIS):
    # x: [n_i * n_j * c, m] -> [n_j * c, m] -> [c, m]
    for name in axis_names(axis):
        x = lax.psum_scatter(x, name, scatter_dimension=0, tiled=True)
    return x
# [end:body]


# [start:pmap]
def psum_scatter_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, n*c, m]
    out = jax.pmap(psum_scatter_pmap_body, axis_name=AXIS)(stacked)
    # out: [n, c, m], device d's slice of the sum
    return np.asarray(out).reshape(-1, *x.shape[1:])  # [n*c, m]
# [end:pmap]


# [start:shard_map]
def psum_scatter_shard_map(x, mesh):
    # block: [n*c, m] -> [c, m], this device's slice of the sum
    f = jax.shard_map(psum_scatter_body, mesh=mesh, in_specs=P(AXIS),
                      out_specs=P(AXIS))
    return jax.jit(f)(x)


def psum_via_scatter_then_gather(x, mesh):
    # The identity behind ring all-reduce: reduce-scatter, then all-gather.
    def per_device(block):
        part = psum_scatter_body(block)
        return lax.all_gather(part, AXIS, tiled=True), lax.psum(block, AXIS)

    # Both results are typed varying here (all_gather's result is), so the
    # out_specs stack the n equal copies: [n * n*c, m].
    f = jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS),
                      out_specs=(P(AXIS), P(AXIS)))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def blocks(x, n):
    # x: [n*k, m] global -> [n, k, m]: the block each of n devices holds
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])


def psum_scatter_program(x, n):
    # [n * n*c, m] -> [n*c, m], the sum of the n blocks; out_shardings that
    # keep it sharded by rows make XLA reduce and scatter in one go
    return blocks(x, n).sum(0, dtype=x.dtype)


def psum_scatter_jit(x, mesh):
    n = mesh.shape[AXIS]
    f = jax.jit(lambda x: psum_scatter_program(x, n),
                in_shardings=NamedSharding(mesh, P(AXIS)),
                out_shardings=NamedSharding(mesh, P(AXIS)))
    return f(x)
# [end:jit]


# [start:explicit]
def psum_scatter_explicit_program(x, n):
    # x: int32[n*n*c@i, m]: the jit form's program, its sum over the sharded
    # blocks resharded to x's own split of rows: int32[n*c@i, m]
    return jax.sharding.reshard(psum_scatter_program(x, n),
                                jax.typeof(x).sharding.spec)


def psum_scatter_explicit(x, n_devices):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS))  # jax.typeof(x): int32[64@i,2]
        # the sum, kept sharded by rows: int32[8@i,2]
        return jax.jit(lambda x: psum_scatter_explicit_program(x, n_devices))(x)
# [end:explicit]


# [start:numpy]
def wide(x):
    # x in the widest dtype of its kind, so NumPy rounds once, at the end
    x = np.asarray(x)
    for kind, dtype in ((jnp.complexfloating, np.complex128),
                        (jnp.floating, np.float64), (jnp.integer, np.int64)):
        if jnp.issubdtype(x.dtype, kind):
            return x.astype(dtype)
    return x


def psum_scatter_numpy(x, n):
    # integers wrap around as they do on the devices
    return blocks(wide(x), n).sum(0).astype(x.dtype)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    rng = np.random.default_rng(0)
    # Each device's block must split again into n chunks: n*n rows in all.
    x = rng.integers(-8, 9, size=(N_DEVICES * N_DEVICES, 2)).astype(np.int32)
    want = psum_scatter_numpy(x, N_DEVICES)
    for form, got in (("pmap", psum_scatter_pmap(x, N_DEVICES)),
                      ("shard_map", psum_scatter_shard_map(x, mesh)),
                      ("jit", psum_scatter_jit(x, mesh)),
                      ("explicit", psum_scatter_explicit(x, N_DEVICES))):
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"psum_scatter ({form} form)")
    gathered, summed = psum_via_scatter_then_gather(x, mesh)
    np.testing.assert_array_equal(np.asarray(gathered), np.asarray(summed))
    print(f"x: int32{list(x.shape)}; each device holds [{N_DEVICES}, 2] and keeps "
          "[1, 2] of the sum")
    print("row 0 of every device's block (x[0::8]):", x[0::N_DEVICES].tolist())
    print("device 0 keeps their sum              :",
          np.asarray(psum_scatter_shard_map(x, mesh))[0].tolist())
    print("sum, reassembled from the slices ->", np.asarray(want).ravel().tolist())
    print("ok: pmap, shard_map, jit and explicit agree with NumPy; "
          "all_gather(psum_scatter(x)) == psum(x)")


if __name__ == "__main__":
    main()
