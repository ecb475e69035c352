"""All-to-all: reshard from rows to columns in one collective.

What it shows: with ``split_axis=1, concat_axis=0, tiled=True`` each device
cuts its row block into ``n`` column chunks, sends chunk ``j`` to device
``j`` and stacks what it receives. The global array does not change, only
its layout: sharded by rows before, by columns after. It is the collective
behind transposing a sharded matrix, expert routing (MoE) and switching
between sequence- and head-sharded attention.

Applied again with the axes swapped (``split_axis=0, concat_axis=1``) it
undoes itself.

Which form when: jit when all you need is the new layout (change the output
sharding, XLA emits the all-to-all); explicit (Explicit mesh axes) when the
layout is in the type: ``jax.sharding.reshard(x, P(None, "i"))`` turns
``int32[16@i,24]`` into ``int32[16,24@i]`` with one all-to-all; shard_map
inside a larger per-device program; pmap as the legacy form.

The per-device body, the global program and the NumPy oracle below are the
ones ``collectives.RECIPES["all_to_all"]`` runs: ``axis`` may be one mesh
axis name or a tuple of them, and dims after the first two ride along.

Registered as: ``collectives.RECIPES["all_to_all"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/all_to_all.py``
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


# [start:body]
def all_to_all_body(x, axis=AXIS):
    # x: [k, n*c, ...] on each device (a row block) -> [n*k, c, ...] (a
    # column block)
    return lax.all_to_all(x, axis, split_axis=1, concat_axis=0, tiled=True)


def all_to_all_inverse_body(x, axis=AXIS):
    # the inverse: x: [n*k, c, ...] (a column block) -> [k, n*c, ...] (a row
    # block)
    return lax.all_to_all(x, axis, split_axis=0, concat_axis=1, tiled=True)
# [end:body]


# [start:pmap]
def all_to_all_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, n*c]: row blocks
    cols = np.asarray(jax.pmap(all_to_all_body, axis_name=AXIS)(stacked))
    # cols: [n, n*k, c], device d holds column block d
    return np.concatenate(list(cols), axis=1)  # back to the global [n*k, n*c]
# [end:pmap]


# [start:shard_map]
def all_to_all_shard_map(x, mesh):
    forward = jax.jit(jax.shard_map(all_to_all_body, mesh=mesh,
                                    in_specs=P(AXIS, None), out_specs=P(None, AXIS)))
    back = jax.jit(jax.shard_map(all_to_all_inverse_body, mesh=mesh,
                                 in_specs=P(None, AXIS), out_specs=P(AXIS, None)))
    moved = forward(x)
    return moved, back(moved)
# [end:shard_map]


# [start:jit]
def all_to_all_program(x):
    # The identity program: only the layout changes, rows -> columns.
    return x


def all_to_all_jit(x, mesh):
    f = jax.jit(all_to_all_program, in_shardings=NamedSharding(mesh, P(AXIS, None)),
                out_shardings=NamedSharding(mesh, P(None, AXIS)))
    return f(x)
# [end:jit]


# [start:explicit]
def all_to_all_explicit_program(x):
    # x: int32[n*k@i, n*c, ...]: the jit form's program (x itself), with its
    # split moved from rows to columns in the type: int32[n*k, n*c@i, ...],
    # one all-to-all (the one the jit form compiles to)
    rows, _, *rest = tuple(jax.typeof(x).sharding.spec) + (None,) * x.ndim
    return jax.sharding.reshard(all_to_all_program(x),
                                P(None, rows, *rest[:x.ndim - 2]))


def all_to_all_explicit(x, n_devices):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS, None))  # jax.typeof(x): int32[16@i,24]
        # rows -> columns in the type: int32[16,24@i]
        return jax.jit(all_to_all_explicit_program)(x)
# [end:explicit]


# [start:numpy]
def all_to_all_numpy(x):
    return np.array(x)  # a copy: the same values, a new layout
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    x = np.arange(N_DEVICES * 2 * N_DEVICES * 3, dtype=np.int32).reshape(
        N_DEVICES * 2, N_DEVICES * 3)
    want = all_to_all_numpy(x)
    moved, restored = all_to_all_shard_map(x, mesh)
    for form, got in (("pmap", all_to_all_pmap(x, N_DEVICES)),
                      ("shard_map", moved), ("jit", all_to_all_jit(x, mesh)),
                      ("explicit", all_to_all_explicit(x, N_DEVICES))):
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"all_to_all ({form} form)")
    np.testing.assert_array_equal(np.asarray(restored), x)
    assert moved.sharding.spec == P(None, AXIS), moved.sharding
    print(f"x: int32{list(x.shape)} = arange; before: row blocks [2, {x.shape[1]}] "
          f"per device; after: column blocks [{x.shape[0]}, 3]")
    print("layout after all_to_all:", moved.sharding.spec)
    device_1 = np.asarray(moved.addressable_shards[1].data)  # its column block
    np.testing.assert_array_equal(device_1, x[:, 3:6])
    print("device 1 now holds columns 3..5; its first two rows:",
          device_1[:2].tolist(), f"(x[r, c] = {x.shape[1]}*r + c)")
    print("ok: pmap, shard_map, jit and explicit agree with NumPy; applying the "
          "inverse "
          "all_to_all restores the rows layout")


if __name__ == "__main__":
    main()
