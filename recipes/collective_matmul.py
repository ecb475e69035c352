"""Collective matmuls: all-gather matmul and matmul reduce-scatter, plain and
overlapped with ppermute (one way and both ways round the ring).

What it shows: the two matmuls of a tensor-parallel layer pair.

  * all-gather matmul: x [M, K] rows sharded, w [K, N] columns sharded. Each
    device needs all of x: ``all_gather(x) @ w_block`` -> [M, N/n].
  * matmul reduce-scatter: x [M, K] columns sharded, w [K, N] rows sharded
    (the contraction split). ``x_block @ w_block`` is a partial sum of the
    whole [M, N]; ``psum_scatter`` adds them and keeps each device's rows.

Overlapped: instead of one collective before (or after) the matmul, pass the
blocks (or the partial sums) round the ring in n - 1 ppermutes, multiplying
the block in hand while the next one travels, so that on TPU/GPU the
communication hides behind the compute. Bidirectional: send half of each
block each way - the same number of steps, half the bytes per link direction.
Every version equals ``x @ w`` exactly on integer-valued data.

Which form when: shard_map to write the overlap yourself; jit for the plain
global ``x @ w`` (XLA picks the collective; XLA:CPU does not decompose it into
permutes); pmap as the legacy form.

Registered as: ``collectives.RECIPES["allgather_matmul"]``,
``collectives.RECIPES["allgather_matmul_overlapped"]``,
``collectives.RECIPES["allgather_matmul_bidirectional"]``,
``collectives.RECIPES["matmul_reduce_scatter"]``,
``collectives.RECIPES["matmul_reduce_scatter_overlapped"]``,
``collectives.RECIPES["matmul_reduce_scatter_bidirectional"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/collective_matmul.py``
"""

import functools
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


def shift(x, n, step):
    # device s sends to s + step (mod n)
    return lax.ppermute(x, "i", [(s, (s + step) % n) for s in range(n)])


# [start:allgather_matmul]
def allgather_matmul(x, w, n):
    # x: [m, K] rows of device me; w: [K, c] its columns -> [n*m, c]
    return lax.all_gather(x, "i", tiled=True) @ w


def allgather_matmul_overlapped(x, w, n):
    me, m = lax.axis_index("i"), x.shape[0]
    out = jnp.zeros((n * m, w.shape[1]), x.dtype)
    for step in range(n):
        # send the block on before multiplying it: the two can overlap
        incoming = shift(x, n, 1) if step < n - 1 else None
        # x now holds the rows of device me - step
        out = lax.dynamic_update_slice_in_dim(out, x @ w, ((me - step) % n) * m, 0)
        x = incoming
    return out


def allgather_matmul_bidirectional(x, w, n):
    me, m = lax.axis_index("i"), x.shape[0]
    half = m // 2
    up, down = x[:half], x[half:]  # top halves travel +1, bottom halves -1
    out = jnp.zeros((n * m, w.shape[1]), x.dtype)
    for step in range(n):
        if step < n - 1:
            next_up, next_down = shift(up, n, 1), shift(down, n, -1)
        out = lax.dynamic_update_slice_in_dim(out, up @ w, ((me - step) % n) * m, 0)
        out = lax.dynamic_update_slice_in_dim(out, down @ w,
                                              ((me + step) % n) * m + half, 0)
        if step < n - 1:
            up, down = next_up, next_down
    return out
# [end:allgather_matmul]


# [start:matmul_reduce_scatter]
def matmul_reduce_scatter(x, w, n):
    # x: [M, k] columns of device me; w: [k, N] its rows -> [M/n, N] its rows
    return lax.psum_scatter(x @ w, "i", scatter_dimension=0, tiled=True)


def matmul_reduce_scatter_overlapped(x, w, n):
    me, m = lax.axis_index("i"), x.shape[0] // n

    def term(chunk):  # this device's share of output chunk `chunk`: [m, N]
        return lax.dynamic_slice_in_dim(x, chunk * m, m, 0) @ w

    # The partial sum of output chunk j starts on device j + 1, gains a term
    # on every device it passes, and ends on device j.
    acc = term((me - 1) % n)
    for step in range(1, n):
        acc = shift(acc, n, 1) + term((me - 1 - step) % n)
    return acc


def matmul_reduce_scatter_bidirectional(x, w, n):
    me, m = lax.axis_index("i"), x.shape[0] // n
    half = m // 2

    def term(chunk, start):
        return lax.dynamic_slice_in_dim(x, chunk * m + start, half, 0) @ w

    up = term((me - 1) % n, 0)  # first halves travel +1
    down = term((me + 1) % n, half)  # second halves travel -1
    for step in range(1, n):
        up = shift(up, n, 1) + term((me - 1 - step) % n, 0)
        down = shift(down, n, -1) + term((me + 1 + step) % n, half)
    return jnp.concatenate([up, down])
# [end:matmul_reduce_scatter]


ALLGATHER = (allgather_matmul, allgather_matmul_overlapped,
             allgather_matmul_bidirectional)
SCATTER = (matmul_reduce_scatter, matmul_reduce_scatter_overlapped,
           matmul_reduce_scatter_bidirectional)


# [start:pmap]
def matmuls_pmap(x, w, n_devices):
    # all-gather family: x rows and w columns per device
    x_rows = x.reshape(n_devices, -1, x.shape[1])
    w_cols = w.reshape(w.shape[0], n_devices, -1).transpose(1, 0, 2)
    gathered = [np.concatenate(np.asarray(jax.pmap(
        functools.partial(f, n=n_devices), axis_name="i")(x_rows, w_cols)), axis=1)
        for f in ALLGATHER]
    # reduce-scatter family: x columns and w rows per device
    x_cols = x.reshape(x.shape[0], n_devices, -1).transpose(1, 0, 2)
    w_rows = w.reshape(n_devices, -1, w.shape[1])
    scattered = [np.asarray(jax.pmap(
        functools.partial(f, n=n_devices), axis_name="i")(x_cols, w_rows)).reshape(
            x.shape[0], w.shape[1]) for f in SCATTER]
    return gathered + scattered
# [end:pmap]


# [start:shard_map]
def matmuls_shard_map(x, w, mesh):
    n = mesh.shape["i"]
    outs = []
    for f in ALLGATHER:
        g = jax.shard_map(functools.partial(f, n=n), mesh=mesh,
                          in_specs=(P("i", None), P(None, "i")),
                          out_specs=P(None, "i"))
        outs.append(jax.jit(g)(x, w))
    for f in SCATTER:
        g = jax.shard_map(functools.partial(f, n=n), mesh=mesh,
                          in_specs=(P(None, "i"), P("i", None)), out_specs=P("i"))
        outs.append(jax.jit(g)(x, w))
    return outs
# [end:shard_map]


# [start:jit]
def matmuls_jit(x, w, mesh):
    def sharded(*spec):
        return NamedSharding(mesh, P(*spec))

    # The same global x @ w; only the layouts differ between the two families.
    gather = jax.jit(jnp.matmul, in_shardings=(sharded("i"), sharded(None, "i")),
                     out_shardings=sharded(None, "i"))
    scatter = jax.jit(jnp.matmul, in_shardings=(sharded(None, "i"), sharded("i")),
                      out_shardings=sharded("i"))
    return [gather(x, w)] * 3 + [scatter(x, w)] * 3
# [end:jit]


# [start:numpy]
def matmul_numpy(x, w):
    return x.astype(np.float64) @ w.astype(np.float64)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    rng = np.random.default_rng(0)
    # Small integers: every partial sum is exact in float32.
    n = N_DEVICES
    x = rng.integers(-8, 9, size=(n * 2, n * 3)).astype(np.float32)
    w = rng.integers(-8, 9, size=(n * 3, n * 2)).astype(np.float32)
    want = matmul_numpy(x, w)
    names = [f.__name__ for f in ALLGATHER + SCATTER]
    for form, outs in (("pmap", matmuls_pmap(x, w, n)),
                       ("shard_map", matmuls_shard_map(x, w, mesh)),
                       ("jit", matmuls_jit(x, w, mesh))):
        for name, got in zip(names, outs, strict=True):
            np.testing.assert_array_equal(np.asarray(got), want,
                                          err_msg=f"{name} ({form} form)")
    print(f"x: float32{list(x.shape)}, w: float32{list(w.shape)} on {n} devices")
    print("x @ w, row 0:", want[0].astype(int).tolist())
    print("ok: " + ", ".join(names) + " equal x @ w exactly in pmap, shard_map and "
          "jit form")


if __name__ == "__main__":
    main()
