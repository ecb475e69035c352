"""All-gather: every device ends up with every block, tiled or stacked.

What it shows: ``all_gather(x, "i", tiled=True)`` concatenates the blocks of
all devices along dim 0 (the global array, on every device);
``tiled=False`` stacks them on a new leading axis instead.

The sharp edge: in shard_map the plain all-gather result is typed *varying*
over the axis, so ``out_specs=P()`` fails the static replication (VMA)
check even though every device holds the same value. Use the invariant
gather (``lax.all_gather(..., to="invarying")`` from JAX 0.10.0,
``lax.all_gather_invariant`` on 0.8.0 and 0.8.1, the private one in
``jax._src.lax.parallel`` on 0.8.2 to 0.9.2). pmap has no such types, so
legacy pmap code used the plain gather.

Which form when: shard_map when the gather feeds more per-device work; jit
when you only need the data replicated (an output sharding of ``P()`` is the
whole recipe); pmap only as the legacy "before".

Registered as: ``collectives.RECIPES["all_gather"]``,
``collectives.RECIPES["all_gather_stacked"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/all_gather.py``
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


def all_gather_invariant(x, axis_name, *, tiled):
    # The invariant gather is spelled differently across JAX versions:
    # public lax.all_gather_invariant on 0.8.0-0.8.1, private on 0.8.2-0.9.2,
    # lax.all_gather(..., to="invarying") from 0.10.0.
    if hasattr(lax, "all_gather_invariant"):  # JAX 0.8.0, 0.8.1
        return lax.all_gather_invariant(x, axis_name, tiled=tiled)
    if jax.__version_info__[:3] < (0, 10, 0):  # JAX 0.8.2 to 0.9.2
        from jax._src.lax.parallel import all_gather_invariant as private
        return private(x, axis_name, tiled=tiled)
    return lax.all_gather(x, axis_name, tiled=tiled, to="invarying")  # >= 0.10


# [start:pmap]
def all_gather_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, m]

    def per_device(block):
        # block: [k, m] -> tiled [n*k, m] and stacked [n, k, m]
        return (lax.all_gather(block, "i", tiled=True),
                lax.all_gather(block, "i", tiled=False))

    tiled, untiled = jax.pmap(per_device, axis_name="i")(stacked)
    return np.asarray(tiled)[0], np.asarray(untiled)[0]  # copy 0 of n equal copies
# [end:pmap]


# [start:shard_map]
def all_gather_shard_map(x, mesh):
    def per_device(block):
        # block: [k, m] on each device
        return (all_gather_invariant(block, "i", tiled=True),   # [n*k, m]
                all_gather_invariant(block, "i", tiled=False))  # [n, k, m]

    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"),
                      out_specs=(P(), P()))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def all_gather_jit(x, mesh):
    n = mesh.shape["i"]

    def global_program(x):
        # The values do not change; the replicated out_shardings make XLA gather.
        return x, x.reshape(n, -1, *x.shape[1:])

    f = jax.jit(global_program, in_shardings=NamedSharding(mesh, P("i")),
                out_shardings=NamedSharding(mesh, P()))
    return f(x)
# [end:jit]


# [start:numpy]
def all_gather_numpy(x, n_devices):
    return x.copy(), x.reshape(n_devices, -1, *x.shape[1:])
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    x = np.arange(N_DEVICES * 2 * 3, dtype=np.int32).reshape(N_DEVICES * 2, 3)
    want = all_gather_numpy(x, N_DEVICES)
    results = {
        "pmap": all_gather_pmap(x, N_DEVICES),
        "shard_map": all_gather_shard_map(x, mesh),
        "jit": all_gather_jit(x, mesh),
    }
    for form, outs in results.items():
        for op, got, expected in zip(("tiled", "stacked"), outs, want, strict=True):
            np.testing.assert_array_equal(np.asarray(got), expected,
                                          err_msg=f"all_gather {op} ({form} form)")
    tiled, stacked = results["shard_map"]
    print(f"x: int32{list(x.shape)}, a [2, 3] block on each of {N_DEVICES} devices")
    print(f"tiled gather   -> {list(tiled.shape)} on every device")
    print(f"stacked gather -> {list(stacked.shape)} on every device")
    print("ok: pmap, shard_map and jit agree with NumPy for all_gather")


if __name__ == "__main__":
    main()
