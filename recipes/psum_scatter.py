"""Reduce-scatter: sum over devices, each device keeps only its slice.

What it shows: ``psum_scatter(x, "i", tiled=True)`` sums the blocks of all
devices like ``psum``, but device ``d`` keeps only rows ``d*c:(d+1)*c`` of
the sum. It moves half the bytes of an all-reduce, and an all-gather of its
result *is* the all-reduce: ``all_gather(psum_scatter(x)) == psum(x)``.
That is how ring all-reduce works, and why ZeRO/FSDP-style training keeps
gradients scattered.

Which form when: shard_map to keep the scattered slice for more local work
(e.g. updating a sharded parameter); jit when a sum's output sharding is
``P("i")`` (XLA emits the reduce-scatter for you); pmap as the legacy form.

Registered as: ``collectives.RECIPES["psum_scatter"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/psum_scatter.py``
"""

import os

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), ("i",),
                         axis_types=(jax.sharding.AxisType.Auto,))


# [start:pmap]
def psum_scatter_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, n*c, m]
    scatter = jax.pmap(lambda b: lax.psum_scatter(b, "i", tiled=True),
                       axis_name="i")
    out = scatter(stacked)  # [n, c, m]: device d's slice of the sum
    return np.asarray(out).reshape(-1, *x.shape[1:])  # [n*c, m]
# [end:pmap]


# [start:shard_map]
def psum_scatter_shard_map(x, mesh):
    def per_device(block):
        # block: [n*c, m] -> [c, m], this device's slice of the sum
        return lax.psum_scatter(block, "i", scatter_dimension=0, tiled=True)

    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return jax.jit(f)(x)


def psum_via_scatter_then_gather(x, mesh):
    # The identity behind ring all-reduce: reduce-scatter, then all-gather.
    def per_device(block):
        part = lax.psum_scatter(block, "i", tiled=True)
        return lax.all_gather(part, "i", tiled=True), lax.psum(block, "i")

    # Both results are typed varying here (all_gather's result is), so the
    # out_specs stack the n equal copies: [n * n*c, m].
    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"),
                      out_specs=(P("i"), P("i")))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def psum_scatter_jit(x, mesh):
    n = mesh.shape["i"]

    def global_program(x):
        return x.reshape(n, -1, *x.shape[1:]).sum(0, dtype=x.dtype)  # [n*c, m]

    # The sum stays sharded by rows: XLA reduces and scatters in one go.
    f = jax.jit(global_program, in_shardings=NamedSharding(mesh, P("i")),
                out_shardings=NamedSharding(mesh, P("i")))
    return f(x)
# [end:jit]


# [start:numpy]
def psum_scatter_numpy(x, n_devices):
    return x.reshape(n_devices, -1, *x.shape[1:]).sum(0, dtype=x.dtype)
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
                      ("jit", psum_scatter_jit(x, mesh))):
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"psum_scatter ({form} form)")
    gathered, summed = psum_via_scatter_then_gather(x, mesh)
    np.testing.assert_array_equal(np.asarray(gathered), np.asarray(summed))
    print(f"x: int32{list(x.shape)}; each device holds [{N_DEVICES}, 2] and keeps "
          "[1, 2] of the sum")
    print("sum, reassembled from the slices ->", np.asarray(want).ravel().tolist())
    print("ok: pmap, shard_map and jit agree with NumPy; "
          "all_gather(psum_scatter(x)) == psum(x)")


if __name__ == "__main__":
    main()
