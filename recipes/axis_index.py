"""axis_index: each device learns its position along a mesh axis.

What it shows: ``lax.axis_index("i")`` is this device's index along mesh
axis ``"i"`` (0..n-1) inside pmap or shard_map. It picks per-device work,
offsets global row numbers, seeds per-device random keys
(``fold_in(key, axis_index)``) and builds masks for ring algorithms. Over a
2-D mesh, ``axis_index(("i", "j"))`` is the row-major linear index.

In a global (jit) program there is no "this device": the same numbers come
from the row index, ``row // rows_per_device``. The explicit form (Explicit
mesh axes, JAX's default from 0.9) runs that jit program unchanged: the rows
keep their split in the type, and it compiles to no collective at all.

Checks that ``psum(axis_index) == n(n-1)/2``.

The per-device body, the global program and the NumPy oracle below are the
ones ``collectives.RECIPES["axis_index"]`` runs: ``axis`` may be one mesh
axis name or a tuple of them (the row-major index over them).

Registered as: ``collectives.RECIPES["axis_index"]``.
Devices: 8 (simulated on CPU by ``main()``), as a 4x2 mesh too.
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/axis_index.py``
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


def make_explicit_mesh(shape, names):
    # jax.make_mesh's default from JAX 0.9 on, spelled out for every version.
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Explicit,) * len(shape))


def make_mesh(shape, names):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


# [start:body]
def axis_index_body(x, axis=AXIS):
    # x: [k, m] on each device -> x + this device's index along `axis`
    return x + lax.axis_index(axis).astype(x.dtype)
# [end:body]


# [start:pmap]
def add_index_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, m]
    f = jax.pmap(axis_index_body, axis_name=AXIS)
    return np.asarray(f(stacked)).reshape(x.shape)
# [end:pmap]


# [start:shard_map]
def add_index_shard_map(x, mesh):
    # block: [k, m] -> block + this device's index
    f = jax.shard_map(axis_index_body, mesh=mesh, in_specs=P(AXIS),
                      out_specs=P(AXIS))
    return jax.jit(f)(x)


def linear_index_2d(mesh):
    # On a 4x2 mesh: index over both axes (row-major) and its psum.
    def per_device(_):
        index = lax.axis_index(("i", "j"))
        return index[None, None], lax.psum(index, ("i", "j"))

    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i", "j"),
                      out_specs=(P("i", "j"), P()))
    return jax.jit(f)(jnp.zeros(mesh.devices.shape))
# [end:shard_map]


# [start:jit]
def axis_index_program(x, n):
    # row r lives on device r // k (k rows per device): add that index
    device_of_row = jnp.arange(x.shape[0]) // (x.shape[0] // n)
    return x + device_of_row.reshape(-1, *([1] * (x.ndim - 1))).astype(x.dtype)


def add_index_jit(x, mesh):
    n = mesh.shape[AXIS]
    rows = NamedSharding(mesh, P(AXIS))
    return jax.jit(lambda x: axis_index_program(x, n), in_shardings=rows,
                   out_shardings=rows)(x)
# [end:jit]


# [start:explicit]
def axis_index_explicit_program(x, n):
    # x: int32[n*k@i, m]: the jit form's program, unchanged. The index of
    # each row's device is a function of the row: no communication; the
    # result keeps x's type, int32[n*k@i, m]
    return axis_index_program(x, n)


def add_index_explicit(x, n_devices):
    mesh = make_explicit_mesh((n_devices,), (AXIS,))
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS))  # jax.typeof(x): int32[16@i,2]
        return jax.jit(lambda x: axis_index_explicit_program(x, n_devices))(x)
# [end:explicit]


# [start:numpy]
def axis_index_numpy(x, n):
    device_of_row = np.repeat(np.arange(n), x.shape[0] // n)
    return x + device_of_row.reshape(-1, *([1] * (x.ndim - 1))).astype(x.dtype)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh((N_DEVICES,), (AXIS,))
    x = np.zeros((N_DEVICES * 2, 2), dtype=np.int32)
    want = axis_index_numpy(x, N_DEVICES)
    for form, got in (("pmap", add_index_pmap(x, N_DEVICES)),
                      ("shard_map", add_index_shard_map(x, mesh)),
                      ("jit", add_index_jit(x, mesh)),
                      ("explicit", add_index_explicit(x, N_DEVICES))):
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"axis_index ({form} form)")
    index, total = linear_index_2d(make_mesh((4, 2), ("i", "j")))
    np.testing.assert_array_equal(np.asarray(index), np.arange(8).reshape(4, 2))
    assert int(total) == N_DEVICES * (N_DEVICES - 1) // 2
    print("device of each row:", np.asarray(want)[:, 0].tolist())
    print("linear index on a 4x2 mesh:\n", np.asarray(index))
    print(f"psum of the index = {int(total)} = n(n-1)/2")
    print("ok: pmap, shard_map, jit and explicit agree with NumPy for axis_index")


if __name__ == "__main__":
    main()
