"""ppermute: send each device's block to another device (rings and shifts).

What it shows: ``lax.ppermute(x, "i", perm)`` sends block ``s`` to device
``d`` for each ``(s, d)`` pair in ``perm``. A ring shift by +1 is
``perm = [(s, (s + 1) % n) for s in range(n)]``; shifting by +k then by -k
is the identity. Rings of ppermutes build ring all-reduce, collective
matmuls and halo exchanges.

Two rules users trip on:
  * a device that no pair sends to receives zeros (no error, no warning);
  * a permutation may not repeat a source or a destination (an error).

Which form when: shard_map for explicit neighbour communication; jit when
the global program is a roll (``jnp.roll`` of a sharded axis becomes a
collective-permute); pmap as the legacy form.

Registered as: ``collectives.RECIPES["ppermute_ring"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/ppermute.py``
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


def ring(n, shift):
    # device s sends to device s + shift (mod n)
    return [(s, (s + shift) % n) for s in range(n)]


# [start:pmap]
def ring_shift_pmap(x, n_devices, shift=1):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, m]
    f = jax.pmap(lambda b: lax.ppermute(b, "i", ring(n_devices, shift)),
                 axis_name="i")
    return np.asarray(f(stacked)).reshape(x.shape)
# [end:pmap]


# [start:shard_map]
def ring_shift_shard_map(x, mesh, shift=1):
    n = mesh.shape["i"]

    def per_device(block):
        # block: [k, m] -> the block of the device `shift` places back
        return lax.ppermute(block, "i", ring(n, shift))

    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return jax.jit(f)(x)


def send_only_to_first_half(x, mesh):
    # Only devices 0..n/2-1 receive anything; the others get zeros.
    n = mesh.shape["i"]
    perm = [(s, s - n // 2) for s in range(n // 2, n)]
    f = jax.shard_map(lambda b: lax.ppermute(b, "i", perm), mesh=mesh,
                      in_specs=P("i"), out_specs=P("i"))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def ring_shift_jit(x, mesh, shift=1):
    n = mesh.shape["i"]
    rows = NamedSharding(mesh, P("i"))
    # Rolling by whole blocks moves every block to the next device.
    f = jax.jit(lambda x: jnp.roll(x, shift * (x.shape[0] // n), axis=0),
                in_shardings=rows, out_shardings=rows)
    return f(x)
# [end:jit]


# [start:numpy]
def ring_shift_numpy(x, n_devices, shift=1):
    return np.roll(x, shift * (x.shape[0] // n_devices), axis=0)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    x = np.arange(N_DEVICES * 2, dtype=np.float32).reshape(N_DEVICES * 2, 1)
    want = ring_shift_numpy(x, N_DEVICES)
    for form, got in (("pmap", ring_shift_pmap(x, N_DEVICES)),
                      ("shard_map", ring_shift_shard_map(x, mesh)),
                      ("jit", ring_shift_jit(x, mesh))):
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"ring shift ({form} form)")
    there_and_back = ring_shift_shard_map(ring_shift_shard_map(x, mesh, 3), mesh, -3)
    np.testing.assert_array_equal(np.asarray(there_and_back), x)

    half = np.asarray(send_only_to_first_half(x, mesh)).reshape(N_DEVICES, -1)
    assert (half[N_DEVICES // 2:] == 0).all(), "non-destinations receive zeros"
    try:
        bad = jax.shard_map(lambda b: lax.ppermute(b, "i", [(0, 1), (2, 1)]),
                            mesh=mesh, in_specs=P("i"), out_specs=P("i"))
        jax.jit(bad)(x)
        raise AssertionError("a repeated destination should be an error")
    except ValueError as err:
        repeated = str(err).splitlines()[0]

    print("x rows, one block of 2 per device:", x.ravel().astype(int).tolist())
    print("after ring shift +1:              ",
          np.asarray(want).ravel().astype(int).tolist())
    print("devices that receive nothing get zeros:", half[:, 0].astype(int).tolist())
    print("repeated destination ->", repeated)
    print("ok: pmap, shard_map and jit agree with NumPy; shift(+3) then shift(-3) "
          "is the identity")


if __name__ == "__main__":
    main()
