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
whole recipe); explicit (Explicit mesh axes, JAX's default from 0.9) when the
layout is part of the type: ``jax.sharding.reshard(x, P())`` turns
``int32[16@i,3]`` into ``int32[16,3]`` and is the all-gather; pmap only as
the legacy "before".

The per-device bodies, the global programs and the NumPy oracles below are
the ones ``collectives.RECIPES["all_gather"]`` and
``collectives.RECIPES["all_gather_stacked"]`` run: ``axis`` may be one mesh
axis name or a tuple of them (the blocks then come in row-major order over
them, the first axis major).

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


# [start:body]
# The invariant gather types the result as replicated over `axis`, so
# shard_map's out_specs may leave `axis` out.
def all_gather_body(x, axis=AXIS):
    # x: [k, m] on each device -> [n*k, m], the same on every device of `axis`
    return all_gather_invariant(x, axis, tiled=True)


def all_gather_stacked_body(x, axis=AXIS):
    # x: [k, m] on each device -> [n, k, m]: a new leading axis, one entry
    # per device
    return all_gather_invariant(x, axis, tiled=False)


# The legacy pmap bodies: pmap has no invariant types, so pmap code used the
# plain gather. pmap maps mesh axes after the first with vmap, which gathers
# over one axis at a time: gathering the innermost axis first keeps the
# blocks in row-major device order.
def all_gather_pmap_body(x, axis=AXIS):
    # x: [k, m] -> [n_j * k, m] -> [n_i * n_j * k, m]
    for name in reversed(axis_names(axis)):
        x = lax.all_gather(x, name, tiled=True)
    return x


def all_gather_stacked_pmap_body(x, axis=AXIS):
    # x: [k, m] -> [n_j, k, m] -> [n_i, n_j, k, m] -> [n_i * n_j, k, m]
    names = axis_names(axis)
    for name in reversed(names):
        x = lax.all_gather(x, name, tiled=False)
    return x.reshape(-1, *x.shape[len(names):])
# [end:body]


# [start:pmap]
def all_gather_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, m]

    def per_device(block):
        # block: [k, m] -> tiled [n*k, m] and stacked [n, k, m]
        return all_gather_pmap_body(block), all_gather_stacked_pmap_body(block)

    outs = jax.pmap(per_device, axis_name=AXIS)(stacked)  # [n, n*k, m], [n, n, k, m]
    # Every device holds the same result. pmap(out_axes=None) would return
    # copy 0 without checking that; check it here instead.
    for out in outs:
        copies = np.asarray(out)
        assert (copies == copies[0]).all(), "device copies differ"
    return tuple(np.asarray(out)[0] for out in outs)
# [end:pmap]


# [start:shard_map]
def all_gather_shard_map(x, mesh):
    def per_device(block):
        # block: [k, m] on each device -> [n*k, m] and [n, k, m]
        return all_gather_body(block), all_gather_stacked_body(block)

    f = jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS),
                      out_specs=(P(), P()))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def blocks(x, n):
    # x: [n*k, m] global -> [n, k, m]: the block each of n devices holds
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])


def all_gather_program(x):
    # The value does not change; the replicated out_shardings make XLA gather.
    return x


def all_gather_stacked_program(x, n):
    # [n*k, m] -> [n, k, m]; replicated out_shardings again gather
    return blocks(x, n)


def all_gather_jit(x, mesh):
    n = mesh.shape[AXIS]

    def global_program(x):
        return all_gather_program(x), all_gather_stacked_program(x, n)

    f = jax.jit(global_program, in_shardings=NamedSharding(mesh, P(AXIS)),
                out_shardings=NamedSharding(mesh, P()))
    return f(x)
# [end:jit]


# [start:explicit]
def whole_rows(x):
    # x: int32[n*k@i, m] -> the layout with dim 0 whole on every device (any
    # other dim keeps its split): resharding to it is the all-gather
    _, *rest = jax.typeof(x).sharding.spec
    return P(None, *rest)


def all_gather_explicit_program(x):
    # the jit form's program (x itself), resharded: int32[n*k, m] everywhere
    return jax.sharding.reshard(all_gather_program(x), whole_rows(x))


def all_gather_stacked_explicit_program(x, n):
    # the jit form's program (x split into its n blocks: no data moves),
    # resharded: int32[n, k, m] on every device
    return jax.sharding.reshard(all_gather_stacked_program(x, n),
                                P(None, *whole_rows(x)))


def all_gather_explicit(x, n_devices):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS))  # jax.typeof(x): int32[16@i,3]

        @jax.jit
        def global_program(x):
            # int32[16,3] and int32[8,2,3], whole on every device
            return (all_gather_explicit_program(x),
                    all_gather_stacked_explicit_program(x, n_devices))

        return global_program(x)
# [end:explicit]


# [start:numpy]
def all_gather_numpy(x):
    return np.array(x)  # a copy: the same values, now on every device


def all_gather_stacked_numpy(x, n):
    return blocks(np.array(x), n)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    x = np.arange(N_DEVICES * 2 * 3, dtype=np.int32).reshape(N_DEVICES * 2, 3)
    want = all_gather_numpy(x), all_gather_stacked_numpy(x, N_DEVICES)
    results = {
        "pmap": all_gather_pmap(x, N_DEVICES),
        "shard_map": all_gather_shard_map(x, mesh),
        "jit": all_gather_jit(x, mesh),
        "explicit": all_gather_explicit(x, N_DEVICES),
    }
    for form, outs in results.items():
        for op, got, expected in zip(("tiled", "stacked"), outs, want, strict=True):
            np.testing.assert_array_equal(np.asarray(got), expected,
                                          err_msg=f"all_gather {op} ({form} form)")
    tiled, stacked = results["shard_map"]
    print(f"x: int32{list(x.shape)} = arange, a [2, 3] block on each of "
          f"{N_DEVICES} devices")
    print(f"tiled gather   -> {list(tiled.shape)} on every device; its row 6:",
          np.asarray(tiled)[6].tolist(), "(= x[6], from device 3)")
    print(f"stacked gather -> {list(stacked.shape)} on every device; entry 3:",
          np.asarray(stacked)[3].tolist(), "(= x[6:8], device 3's block)")
    print("ok: pmap, shard_map, jit and explicit agree with NumPy for all_gather and "
          "all_gather_stacked")


if __name__ == "__main__":
    main()
