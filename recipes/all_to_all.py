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
sharding, XLA emits the all-to-all); shard_map inside a larger per-device
program; pmap as the legacy form.

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


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), ("i",),
                         axis_types=(jax.sharding.AxisType.Auto,))


# [start:pmap]
def all_to_all_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, x.shape[1])  # [n, k, n*c]: row blocks
    swap = jax.pmap(
        lambda b: lax.all_to_all(b, "i", split_axis=1, concat_axis=0, tiled=True),
        axis_name="i")
    cols = np.asarray(swap(stacked))  # [n, n*k, c]: device d holds column block d
    return np.concatenate(list(cols), axis=1)  # back to the global [n*k, n*c]
# [end:pmap]


# [start:shard_map]
def all_to_all_shard_map(x, mesh):
    def rows_to_columns(block):
        # block: [k, n*c] (a row block) -> [n*k, c] (a column block)
        return lax.all_to_all(block, "i", split_axis=1, concat_axis=0, tiled=True)

    def columns_to_rows(block):
        # the inverse: [n*k, c] -> [k, n*c]
        return lax.all_to_all(block, "i", split_axis=0, concat_axis=1, tiled=True)

    forward = jax.jit(jax.shard_map(rows_to_columns, mesh=mesh,
                                    in_specs=P("i", None), out_specs=P(None, "i")))
    back = jax.jit(jax.shard_map(columns_to_rows, mesh=mesh,
                                 in_specs=P(None, "i"), out_specs=P("i", None)))
    moved = forward(x)
    return moved, back(moved)
# [end:shard_map]


# [start:jit]
def all_to_all_jit(x, mesh):
    # The identity program; only the layout changes, rows -> columns.
    f = jax.jit(lambda x: x, in_shardings=NamedSharding(mesh, P("i", None)),
                out_shardings=NamedSharding(mesh, P(None, "i")))
    return f(x)
# [end:jit]


# [start:numpy]
def all_to_all_numpy(x):
    return x.copy()  # same values, new layout
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
                      ("shard_map", moved), ("jit", all_to_all_jit(x, mesh))):
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"all_to_all ({form} form)")
    np.testing.assert_array_equal(np.asarray(restored), x)
    assert moved.sharding.spec == P(None, "i"), moved.sharding
    print(f"x: int32{list(x.shape)}; before: row blocks [2, {x.shape[1]}] per "
          f"device; after: column blocks [{x.shape[0]}, 3]")
    print("layout after all_to_all:", moved.sharding.spec)
    print("ok: pmap, shard_map and jit agree with NumPy; applying the inverse "
          "all_to_all restores the rows layout")


if __name__ == "__main__":
    main()
