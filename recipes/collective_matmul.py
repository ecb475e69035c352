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

The per-device bodies, the global program and the NumPy oracle below are the
ones the six recipes named next run: ``axis`` may be one mesh axis name or a
tuple of them, the operands may have any dtypes that ``@`` takes, and the
legacy pmap form of a 2-D mesh (``pmap`` of ``vmap``) passes
``stepwise=True`` (one mesh axis per collective: all vmap batches).

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
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8
AXIS = "i"


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Auto,))


def names_of(axis):
    # a mesh axis name or a tuple of them -> a tuple
    return (axis,) if isinstance(axis, str) else tuple(axis)


# [start:ring_shift]
def ring_shift(x, axis=AXIS, shift=1):
    # Device d (numbered as lax.axis_index(axis) numbers it) receives the block
    # of device d - shift.
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    sizes = [lax.axis_size(name) for name in names]
    n = math.prod(sizes)
    pairs = [(d, (d + shift) % n) for d in range(n)]
    # Over several axes ppermute numbers devices in mesh order (JAX 0.12
    # refuses a tuple in another order), axis_index in the tuple's: renumber.
    mesh_order = tuple(name for name in jax.sharding.get_abstract_mesh().axis_names
                       if name in names) if len(names) > 1 else names
    if len(mesh_order) == len(names) and mesh_order != names:
        where = [names.index(name) for name in mesh_order]

        def renumber(d):
            digits = np.unravel_index(d, sizes)
            return int(np.ravel_multi_index([digits[w] for w in where],
                                            [sizes[w] for w in where]))

        axis, pairs = mesh_order, [(renumber(s), renumber(t)) for s, t in pairs]
    return lax.ppermute(x, axis, pairs)


def stepwise_shift(x, axis=AXIS, shift=1):
    # ring_shift by +1 or -1 with one ppermute per mesh axis: vmap batches a
    # ppermute over one axis only, so pmap(vmap(...)) needs this. Shift along
    # the last (minor) axis; where that wrapped round, take the block one
    # more step along the next axis out.
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    out = ring_shift(x, names[-1], shift)

    def at_edge(name):  # this device received a block that wrapped round `name`
        return lax.axis_index(name) == (0 if shift == 1 else lax.axis_size(name) - 1)

    wrapped = at_edge(names[-1])
    for name in reversed(names[:-1]):
        out = jnp.where(wrapped, ring_shift(out, name, shift), out)
        wrapped = wrapped & at_edge(name)
    return out
# [end:ring_shift]


# [start:body]
# -- all-gather matmul: x [m, K] rows of device me, w [K, c] its columns
#    -> [n*m, c]: every row of x @ w, for this device's columns
def allgather_matmul(x, w, axis=AXIS, stepwise=False):
    if stepwise:  # vmap gathers one axis at a time: the minor one first
        for name in reversed(names_of(axis)):
            x = lax.all_gather(x, name, tiled=True)
        return x @ w
    return lax.all_gather(x, axis, tiled=True) @ w


def allgather_matmul_overlapped(x, w, axis=AXIS, stepwise=False):
    shift = stepwise_shift if stepwise else ring_shift
    n, me, m = lax.axis_size(axis), lax.axis_index(axis), x.shape[0]
    out = jnp.zeros((n * m, w.shape[1]), jnp.result_type(x, w))
    for step in range(n):
        # send the block on before multiplying it: the two can overlap
        incoming = shift(x, axis, 1) if step < n - 1 else None
        # x now holds the rows of device me - step
        out = lax.dynamic_update_slice_in_dim(out, x @ w, ((me - step) % n) * m, 0)
        x = incoming
    return out


def allgather_matmul_bidirectional(x, w, axis=AXIS, stepwise=False):
    # m must be even: half of each block goes each way round the ring
    shift = stepwise_shift if stepwise else ring_shift
    n, me, m = lax.axis_size(axis), lax.axis_index(axis), x.shape[0]
    half = m // 2
    up, down = x[:half], x[half:]  # top halves travel +1, bottom halves -1
    out = jnp.zeros((n * m, w.shape[1]), jnp.result_type(x, w))
    for step in range(n):
        if step < n - 1:
            next_up, next_down = shift(up, axis, 1), shift(down, axis, -1)
        out = lax.dynamic_update_slice_in_dim(out, up @ w, ((me - step) % n) * m, 0)
        out = lax.dynamic_update_slice_in_dim(out, down @ w,
                                              ((me + step) % n) * m + half, 0)
        if step < n - 1:
            up, down = next_up, next_down
    return out


# -- matmul reduce-scatter: x [M, k] columns of device me, w [k, N] its rows
#    -> [M/n, N]: this device's rows of x @ w, summed over devices
def matmul_reduce_scatter(x, w, axis=AXIS, stepwise=False):
    if stepwise:  # vmap scatters one axis at a time: the major one first
        out = x @ w
        for name in names_of(axis):
            out = lax.psum_scatter(out, name, scatter_dimension=0, tiled=True)
        return out
    return lax.psum_scatter(x @ w, axis, scatter_dimension=0, tiled=True)


def matmul_reduce_scatter_overlapped(x, w, axis=AXIS, stepwise=False):
    shift = stepwise_shift if stepwise else ring_shift
    n, me = lax.axis_size(axis), lax.axis_index(axis)
    m = x.shape[0] // n

    def term(chunk):  # this device's share of output chunk `chunk`: [m, N]
        return lax.dynamic_slice_in_dim(x, chunk * m, m, 0) @ w

    # The partial sum of output chunk j starts on device j + 1, gains a term
    # on every device it passes, and ends on device j.
    acc = term((me - 1) % n)
    for step in range(1, n):
        acc = shift(acc, axis, 1) + term((me - 1 - step) % n)
    return acc


def matmul_reduce_scatter_bidirectional(x, w, axis=AXIS, stepwise=False):
    # M/n must be even: half of each partial sum goes each way round the ring
    shift = stepwise_shift if stepwise else ring_shift
    n, me = lax.axis_size(axis), lax.axis_index(axis)
    m = x.shape[0] // n
    half = m // 2

    def term(chunk, start):
        return lax.dynamic_slice_in_dim(x, chunk * m + start, half, 0) @ w

    up = term((me - 1) % n, 0)  # first halves travel +1
    down = term((me + 1) % n, half)  # second halves travel -1
    for step in range(1, n):
        up = shift(up, axis, 1) + term((me - 1 - step) % n, 0)
        down = shift(down, axis, -1) + term((me + 1 + step) % n, half)
    return jnp.concatenate([up, down])
# [end:body]


ALLGATHER = (allgather_matmul, allgather_matmul_overlapped,
             allgather_matmul_bidirectional)
SCATTER = (matmul_reduce_scatter, matmul_reduce_scatter_overlapped,
           matmul_reduce_scatter_bidirectional)


# [start:pmap]
def matmuls_pmap(x, w, n_devices):
    # stepwise=True: what pmap(vmap(...)) over a 2-D mesh needs; over one
    # axis it gives the same collectives
    def pmapped(f):
        return jax.pmap(functools.partial(f, axis=AXIS, stepwise=True),
                        axis_name=AXIS)

    # all-gather family: x rows and w columns per device
    x_rows = x.reshape(n_devices, -1, x.shape[1])
    w_cols = w.reshape(w.shape[0], n_devices, -1).transpose(1, 0, 2)
    gathered = [np.concatenate(np.asarray(pmapped(f)(x_rows, w_cols)), axis=1)
                for f in ALLGATHER]
    # reduce-scatter family: x columns and w rows per device
    x_cols = x.reshape(x.shape[0], n_devices, -1).transpose(1, 0, 2)
    w_rows = w.reshape(n_devices, -1, w.shape[1])
    scattered = [np.asarray(pmapped(f)(x_cols, w_rows)).reshape(
        x.shape[0], w.shape[1]) for f in SCATTER]
    return gathered + scattered
# [end:pmap]


# [start:shard_map]
def matmuls_shard_map(x, w, mesh):
    outs = []
    for f in ALLGATHER:
        g = jax.shard_map(f, mesh=mesh, in_specs=(P(AXIS, None), P(None, AXIS)),
                          out_specs=P(None, AXIS))
        outs.append(jax.jit(g)(x, w))
    for f in SCATTER:
        g = jax.shard_map(f, mesh=mesh, in_specs=(P(None, AXIS), P(AXIS, None)),
                          out_specs=P(AXIS))
        outs.append(jax.jit(g)(x, w))
    return outs
# [end:shard_map]


# [start:jit]
def matmul_program(x, w):
    # x: [M, K] @ w: [K, N]; the shardings make jit gather or scatter
    return x @ w


def matmuls_jit(x, w, mesh):
    def sharded(*spec):
        return NamedSharding(mesh, P(*spec))

    # The same global x @ w; only the layouts differ between the two families.
    gather = jax.jit(matmul_program, in_shardings=(sharded(AXIS), sharded(None, AXIS)),
                     out_shardings=sharded(None, AXIS))
    scatter = jax.jit(matmul_program, in_shardings=(sharded(None, AXIS), sharded(AXIS)),
                      out_shardings=sharded(AXIS))
    return [gather(x, w)] * 3 + [scatter(x, w)] * 3
# [end:jit]


# [start:numpy]
def wide(x):
    # x in the widest dtype of its kind, so NumPy rounds once, at the end
    x = np.asarray(x)
    for kind, dtype in ((jnp.complexfloating, np.complex128),
                        (jnp.floating, np.float64), (jnp.integer, np.int64)):
        if jnp.issubdtype(x.dtype, kind):
            return x.astype(dtype)
    return x


def matmul_numpy(x, w):
    # in the dtype x @ w has on the devices
    return (wide(x) @ wide(w)).astype(jnp.result_type(x.dtype, w.dtype))
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
    results = {"pmap": matmuls_pmap(x, w, n),
               "shard_map": matmuls_shard_map(x, w, mesh),
               "jit": matmuls_jit(x, w, mesh)}
    for form, outs in results.items():
        for name, got in zip(names, outs, strict=True):
            np.testing.assert_array_equal(np.asarray(got), want,
                                          err_msg=f"{name} ({form} form)")
    print(f"x: float32{list(x.shape)}, w: float32{list(w.shape)} on {n} devices")
    ring = np.asarray(results["shard_map"][4])  # matmul_reduce_scatter_overlapped
    print("ring reduce-scatter, row 0:", ring[0, :4].astype(int).tolist(), "...")
    terms = [int(a) * int(b) for a, b in zip(x[0], w[:, 0], strict=True)]
    print(f"x[0] . w[:, 0] = {' + '.join(map(str, terms[:4]))} + .. = {sum(terms)}"
          " (its first element)")
    print("ok: " + ", ".join(names) + " equal x @ w exactly in pmap, shard_map and "
          "jit form")


if __name__ == "__main__":
    main()
