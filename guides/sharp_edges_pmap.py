"""Sharp edges of pmap outputs: unchecked ``out_axes=None``, reducing stacked copies.

What it shows, each as the wrong way and the fix:

  6. ``jax.pmap(f, out_axes=None)`` returns device 0's copy and does not
     check that the other devices hold the same value (jax issue 21671). A
     value that differs per device comes back as device 0's, silently. Fix:
     the shard_map form with ``out_specs=P()`` checks replication statically
     (an error if the value may differ); or return ``out_axes=0`` and compare
     the copies.
  7. Reducing a pmap output outside jit. pmap returns a *stacked* array, one
     row per device, sharded over the devices (``NamedSharding(mesh,
     P('i'))`` from JAX 0.8). When the body returned a replicated value (a
     ``psum``), ``jnp.sum(out)`` adds all n copies: n times the total. The
     pmap migration guide also warns that ``jnp.sum``/``jnp.mean(where=...)``
     on pmap outputs outside jit "may operate on only a subset of the data";
     on JAX 0.8.0, 0.10.2 and 0.12.0, one process with 8 CPU devices (and
     two processes of 4), ``jnp.sum`` of a sharded pmap output equals
     ``np.sum`` of it: ``main()`` checks that. Fix: take one copy of a
     replicated output (``out[0]``), or materialise with ``np.asarray``
     before reducing, or port to shard_map with ``out_specs=P()``.

Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python guides/sharp_edges_pmap.py``
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


# [start:pmap]
def block_sums_out_axes_none(x, n_devices):
    # WRONG (pitfall 6): each device's own block sum differs per device, but
    # out_axes=None returns device 0's without a word.
    stacked = x.reshape(n_devices, -1)  # [n, k]
    return jax.pmap(lambda b: b.sum(), axis_name="i", out_axes=None)(stacked)


def total_pmap_stacked(x, n_devices):
    # Every device returns the psum: the output holds n equal copies [n].
    stacked = x.reshape(n_devices, -1)  # [n, k]
    return jax.pmap(lambda b: lax.psum(b.sum(), "i"), axis_name="i")(stacked)


def total_pmap_checked(x, n_devices):
    # Fix 6/7 in pmap: out_axes=0, check the copies, keep one.
    copies = np.asarray(total_pmap_stacked(x, n_devices))
    assert (copies == copies[0]).all(), f"device copies differ: {copies}"
    return copies[0]
# [end:pmap]


# [start:shard_map]
def block_sums_replicated(x, mesh):
    # Pitfall 6 in shard_map: out_specs=P() is checked statically, so the
    # per-device sum is rejected instead of returning device 0's value.
    f = jax.shard_map(lambda b: b.sum(), mesh=mesh, in_specs=P("i"),
                      out_specs=P())
    return jax.jit(f)(x)


def total_shard_map(x, mesh):
    # Fix: psum makes the value invariant; out_specs=P() returns it once.
    f = jax.shard_map(lambda b: lax.psum(b.sum(), "i"), mesh=mesh,
                      in_specs=P("i"), out_specs=P())
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def total_jit(x, mesh):
    f = jax.jit(jnp.sum, in_shardings=NamedSharding(mesh, P("i")),
                out_shardings=NamedSharding(mesh, P()))
    return f(x)
# [end:jit]


# [start:numpy]
def total_numpy(x):
    return x.astype(np.float64).sum()


def block_sums_numpy(x, n_devices):
    return x.astype(np.float64).reshape(n_devices, -1).sum(1)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    x = np.arange(2.0 * N_DEVICES, dtype=np.float32)
    print(f"JAX {jax.__version__}")

    got = float(block_sums_out_axes_none(x, N_DEVICES))
    sums = block_sums_numpy(x, N_DEVICES)
    assert got == sums[0], got
    print(f"6. pmap(out_axes=None) of per-device sums {sums.tolist()} -> {got} "
          "(device 0's, unchecked)")
    try:
        block_sums_replicated(x, mesh)
        raise AssertionError("shard_map should reject out_specs=P() here")
    except ValueError as err:
        print("   shard_map out_specs=P() ->", " ".join(str(err).split())[:90])

    stacked = total_pmap_stacked(x, N_DEVICES)
    want = total_numpy(x)
    wrong = float(jnp.sum(stacked))
    assert wrong == N_DEVICES * want, wrong
    # The migration guide's subset-of-the-data effect does not show here:
    assert float(jnp.sum(stacked)) == float(np.sum(np.asarray(stacked)))
    print(f"7. jnp.sum of the stacked psum output: {wrong} instead of {want} "
          f"({N_DEVICES} copies)")
    for form, got in (("pmap", total_pmap_checked(x, N_DEVICES)),
                      ("shard_map", total_shard_map(x, mesh)),
                      ("jit", total_jit(x, mesh))):
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=form)
    print("ok: one copy (pmap), out_specs=P() (shard_map) and jit agree with NumPy")


if __name__ == "__main__":
    main()
