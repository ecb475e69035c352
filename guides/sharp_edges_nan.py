"""Sharp edge: a cross-device max or min drops NaN.

What it shows (pitfall 11): ``lax.pmax`` / ``lax.pmin`` across devices ignore
NaN: a NaN on one device loses to any number on another, and if *every*
device holds NaN the result is ``-inf`` (pmax) or ``+inf`` (pmin), the
reduction's start value. The jit form does the same: ``x.reshape(n, k).max(0)``
with dim 0 sharded becomes the same all-reduce. ``np.max``, and ``jnp.max`` on
one device, return NaN. Seen on CPU with JAX 0.8.0, 0.10.2 and 0.12.0
(infinities and every other collective propagate as in NumPy).

Fix: reduce a NaN mask alongside and put NaN back where any device had one
(``pmax_keep_nan`` below), or clean the data before the reduction.

Which form when: as for any all-reduce (see ``reductions.py``); the fix is
one extra all-reduce of a mask in shard_map, one ``any`` in jit.

Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python guides/sharp_edges_nan.py``
"""

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


def pmax_keep_nan(x, axis_name):
    # The fix: NaN wherever any device holds NaN, else the max.
    any_nan = lax.psum(jnp.isnan(x).astype(jnp.int32), axis_name) > 0
    return jnp.where(any_nan, jnp.nan, lax.pmax(x, axis_name))


# [start:pmap]
def pmax_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, m]
    out = jax.pmap(lambda b: lax.pmax(b, "i"), axis_name="i")(stacked)
    return np.asarray(out)[0]
# [end:pmap]


# [start:shard_map]
def pmax_shard_map(x, mesh, keep_nan=False):
    def per_device(block):
        # block: [k, m] -> [k, m], the elementwise max over devices
        return pmax_keep_nan(block, "i") if keep_nan else lax.pmax(block, "i")

    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"), out_specs=P())
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def pmax_jit(x, mesh, keep_nan=False):
    n = mesh.shape["i"]

    def global_program(x):
        blocks = x.reshape(n, -1, *x.shape[1:])
        out = blocks.max(0)  # an all-reduce: drops NaN like lax.pmax
        if keep_nan:
            out = jnp.where(jnp.isnan(blocks).any(0), jnp.nan, out)
        return out

    f = jax.jit(global_program, in_shardings=NamedSharding(mesh, P("i")),
                out_shardings=NamedSharding(mesh, P()))
    return f(x)
# [end:jit]


# [start:numpy]
def pmax_numpy(x, n_devices):
    return x.reshape(n_devices, -1, *x.shape[1:]).max(0)  # NaN propagates
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    x = np.arange(3.0 * N_DEVICES, dtype=np.float32).reshape(N_DEVICES, 3)
    x[2, 0] = np.nan              # one device has NaN in column 0
    x[:, 2] = np.nan              # every device has NaN in column 2
    x[5, 1] = np.inf
    want = pmax_numpy(x, N_DEVICES)
    print(f"JAX {jax.__version__}")
    print("NumPy max over devices:", want.ravel().tolist())
    for form, got in (("pmap", pmax_pmap(x, N_DEVICES)),
                      ("shard_map", pmax_shard_map(x, mesh)),
                      ("jit", pmax_jit(x, mesh))):
        got = np.asarray(got).ravel()
        print(f"{form:>9} plain max:    ", got.tolist())
        assert got[0] == x[:, 0][~np.isnan(x[:, 0])].max() and got[1] == np.inf
        assert got[2] == -np.inf  # all NaN: the reduction's start value
    for got in (pmax_shard_map(x, mesh, keep_nan=True),
                pmax_jit(x, mesh, keep_nan=True)):
        np.testing.assert_array_equal(np.asarray(got), want)
    print("ok: with a NaN mask reduced alongside, shard_map and jit agree with "
          "NumPy")


if __name__ == "__main__":
    main()
