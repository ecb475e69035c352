"""Halo exchange: a 1-D stencil on an array sharded by rows.

What it shows: the 3-point stencil ``y[r] = x[r-1] - 2 x[r] + x[r+1]`` needs,
on each device, one row from each neighbour. Two ``ppermute``s fetch them
(last row one device forward, first row one device back); then every device
applies the stencil to its padded block alone, and the result matches the
stencil on one device:

  * periodic boundary: the ring wraps round (``x[-1]`` is the last row);
  * open boundary: rows beyond the ends are zero. The ppermute simply has no
    pair for the end devices, and a device that receives nothing gets zeros.

Which form when: shard_map to control the exchange (wider halos, several
stencil steps per exchange); jit for the global program with ``jnp.roll``
(XLA emits the same two collective-permutes; for the open boundary mask the
wrapped row rather than ``jnp.pad`` + slices, which XLA:CPU compiles to many
more permutes); pmap as the legacy form.

Registered as: ``collectives.RECIPES["halo_exchange"]``,
``collectives.RECIPES["halo_exchange_open"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/halo_exchange.py``
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


# [start:halo]
def halo_exchange(block, axis, n, periodic):
    # block: [k, ...] -> [1 + k + 1, ...] with the neighbours' edge rows
    if periodic:
        forward = [(s, (s + 1) % n) for s in range(n)]
        back = [(s, (s - 1) % n) for s in range(n)]
    else:  # devices 0 and n-1 receive nothing from outside: zeros
        forward = [(s, s + 1) for s in range(n - 1)]
        back = [(s + 1, s) for s in range(n - 1)]
    from_left = lax.ppermute(block[-1:], axis, forward)
    from_right = lax.ppermute(block[:1], axis, back)
    return jnp.concatenate([from_left, block, from_right])


def stencil(padded):
    # padded: [1 + k + 1, ...] -> [k, ...]
    return padded[:-2] - 2 * padded[1:-1] + padded[2:]
# [end:halo]


# [start:pmap]
def stencil_pmap(x, n_devices, periodic):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, m]
    f = jax.pmap(lambda b: stencil(halo_exchange(b, "i", n_devices, periodic)),
                 axis_name="i")
    return np.asarray(f(stacked)).reshape(x.shape)
# [end:pmap]


# [start:shard_map]
def stencil_shard_map(x, mesh, periodic):
    n = mesh.shape["i"]

    def per_device(block):
        # block: [k, m] -> [k, m], no communication after the exchange
        return stencil(halo_exchange(block, "i", n, periodic))

    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def stencil_jit(x, mesh, periodic):
    rows = NamedSharding(mesh, P("i"))

    def program(x):
        above, below = jnp.roll(x, 1, axis=0), jnp.roll(x, -1, axis=0)
        if not periodic:  # zero the rows that wrapped round
            index = jnp.arange(x.shape[0])[:, None]
            above = jnp.where(index == 0, 0, above)
            below = jnp.where(index == x.shape[0] - 1, 0, below)
        return above - 2 * x + below

    return jax.jit(program, in_shardings=rows, out_shardings=rows)(x)
# [end:jit]


# [start:numpy]
def stencil_numpy(x, periodic):
    mode = "wrap" if periodic else "constant"
    padded = np.pad(x.astype(np.float64), [(1, 1), (0, 0)], mode=mode)
    return padded[:-2] - 2 * padded[1:-1] + padded[2:]
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    # x[r] = (r + 1)**2: the second difference is 2 inside; the ends show
    # the boundary
    x = (np.arange(1, N_DEVICES * 2 + 1, dtype=np.float32) ** 2)[:, None]
    for periodic in (True, False):
        want = stencil_numpy(x, periodic)
        for form, got in (("pmap", stencil_pmap(x, N_DEVICES, periodic)),
                          ("shard_map", stencil_shard_map(x, mesh, periodic)),
                          ("jit", stencil_jit(x, mesh, periodic))):
            np.testing.assert_array_equal(np.asarray(got), want,
                                          err_msg=f"periodic={periodic} ({form})")
        name = "periodic" if periodic else "open    "
        print(f"{name}: {np.asarray(want).ravel().astype(int).tolist()}")
    print("ok: pmap, shard_map and jit halo-exchange stencils equal the "
          "single-device NumPy stencil, periodic and open")


if __name__ == "__main__":
    main()
