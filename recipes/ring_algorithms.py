"""Ring all-reduce, all-gather and reduce-scatter built from ppermute.

What it shows: the classic ring algorithms, written with nothing but
``lax.ppermute`` by one place round the ring, give the same results as the
native collectives they mirror, on the same inputs and layouts:

  * ring reduce-scatter == ``lax.psum_scatter(x, "i", tiled=True)``:
    partial sums travel n - 1 steps, each device adding its own chunk;
  * ring all-gather == ``lax.all_gather(x, "i", tiled=True)``: blocks travel
    n - 1 steps and each device drops them into place;
  * ring all-reduce == ``lax.psum(x, "i")``: a reduce-scatter phase then an
    all-gather phase, 2 (n - 1) ppermutes that each move 1/n of the data -
    the bandwidth-optimal all-reduce (what NCCL's ring algorithm does).

Which form when: use the native collectives; XLA and the runtime pick good
algorithms. Write a ring yourself to overlap its steps with computation (see
collective_matmul.py) or to control the exact communication pattern. There
is no jit form of a hand-written ring: the global program of a jit form is
``x.sum(...)`` and XLA chooses the collective, shown here for comparison;
the explicit form (Explicit mesh axes) reuses that global program
unchanged, with the layouts in the types: it has no ring either, and
compiles to the native collectives (an all-reduce, an all-gather, a
reduce-scatter or XLA:CPU's all-reduce and slice).
A ring result is the same on every device, but shard_map types ppermute
results as varying, so a replicated out_specs needs ``check_vma=False``.

The per-device bodies, the global programs and the NumPy oracles below are
the ones ``collectives.RECIPES["ring_all_reduce"]`` (and
``"ring_all_gather"``, ``"ring_reduce_scatter"``) run: ``axis`` may be one
mesh axis name or a tuple of them, and the legacy pmap form of a 2-D mesh
(``pmap`` of ``vmap``) passes ``shift=stepwise_shift``.

Registered as: ``collectives.RECIPES["ring_all_reduce"]``,
``collectives.RECIPES["ring_all_gather"]``,
``collectives.RECIPES["ring_reduce_scatter"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/ring_algorithms.py``
"""

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


def make_explicit_mesh(n_devices):
    # jax.make_mesh's default from JAX 0.9 on, spelled out for every version.
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Explicit,))


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Auto,))


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
def ring_reduce_scatter(x, axis=AXIS, shift=ring_shift):
    # x: [n*c, ...] on each device -> [c, ...]: chunk `me` of the sum
    n, me = lax.axis_size(axis), lax.axis_index(axis)
    c = x.shape[0] // n

    def chunk(j):
        return lax.dynamic_slice_in_dim(x, j * c, c, axis=0)

    # Chunk j starts on device j + 1 and collects one term per step; after
    # n - 1 steps it arrives, complete, on device j.
    acc = chunk((me - 1) % n)
    for step in range(1, n):
        acc = shift(acc, axis, 1) + chunk((me - 1 - step) % n)
    return acc


def ring_all_gather(x, axis=AXIS, shift=ring_shift):
    # x: [k, ...] on each device -> [n*k, ...], the same on every device
    n, me = lax.axis_size(axis), lax.axis_index(axis)
    k = x.shape[0]
    out = jnp.zeros((n * k, *x.shape[1:]), x.dtype)
    out = lax.dynamic_update_slice_in_dim(out, x, me * k, axis=0)
    block = x
    for step in range(1, n):
        block = shift(block, axis, 1)  # the block of device me - step
        out = lax.dynamic_update_slice_in_dim(out, block, ((me - step) % n) * k,
                                              axis=0)
    return out


def ring_all_reduce(x, axis=AXIS, shift=ring_shift):
    # x: any shape; flatten and pad to n equal chunks, then two ring phases
    n = lax.axis_size(axis)
    flat = x.reshape(-1)
    flat = jnp.concatenate([flat, jnp.zeros((-flat.shape[0]) % n, x.dtype)])
    # flat: [n*c]; phase 1 leaves chunk `me` of the sum: [c]; phase 2 passes
    # the finished chunks round: [n*c] on every device
    total = ring_all_gather(ring_reduce_scatter(flat, axis, shift), axis, shift)
    return total[:x.size].reshape(x.shape)
# [end:body]


RINGS = (ring_all_reduce, ring_all_gather, ring_reduce_scatter)


# [start:pmap]
def rings_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, m]

    def per_device(block):
        # block: [k, m]. stepwise_shift is the shift pmap(vmap(...)) over a
        # 2-D mesh needs; over one axis it is ring_shift
        return tuple(ring(block, AXIS, shift=stepwise_shift) for ring in RINGS)

    reduced, gathered, scattered = jax.pmap(per_device, axis_name=AXIS)(stacked)
    for out in (reduced, gathered):  # replicated: check, then take copy 0
        copies = np.asarray(out)
        assert (copies == copies[0]).all(), "device copies differ"
    return (np.asarray(reduced)[0], np.asarray(gathered)[0],
            np.asarray(scattered).reshape(-1, *x.shape[1:]))
# [end:pmap]


# [start:shard_map]
def rings_shard_map(x, mesh):
    def per_device(block):
        # block: [k, m] -> ([k, m] sum, [n*k, m] gathered, [k/n, m] chunk of sum)
        return tuple(ring(block, AXIS) for ring in RINGS)

    # check_vma=False: the first two are replicated in value, varying in type.
    f = jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS),
                      out_specs=(P(), P(), P(AXIS)), check_vma=False)
    return jax.jit(f)(x)


def natives_shard_map(x, mesh):
    def per_device(block):
        return (lax.psum(block, AXIS), lax.all_gather(block, AXIS, tiled=True),
                lax.psum_scatter(block, AXIS, tiled=True))

    f = jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS),
                      out_specs=(P(), P(), P(AXIS)), check_vma=False)
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
# The global view: XLA picks the collectives (no ring to write).
def blocks(x, n):
    # x: [n*k, ...] global -> [n, k, ...]: the block each of n devices holds
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])


def all_reduce_program(x, n):
    # out_shardings replicated: an all-reduce
    return blocks(x, n).sum(0, dtype=x.dtype)


def all_gather_program(x, n):
    # The value does not change; replicated out_shardings make jit gather.
    del n
    return x


def reduce_scatter_program(x, n):
    # the same sum, out_shardings by rows: a reduce-scatter
    return blocks(x, n).sum(0, dtype=x.dtype)


def rings_jit(x, mesh):
    n = mesh.shape[AXIS]
    rows, replicated = NamedSharding(mesh, P(AXIS)), NamedSharding(mesh, P())

    def program(x):
        return (all_reduce_program(x, n), all_gather_program(x, n),
                reduce_scatter_program(x, n))

    f = jax.jit(program, in_shardings=rows,
                out_shardings=(replicated, replicated, rows))
    return f(x)
# [end:jit]


# [start:explicit]
# No ring here either: the jit form's global programs, unchanged, on Explicit
# axes (x: f32[n*k@i, m]), each result resharded to where it lives. They
# compile to the native collectives, as the jit form does.
def all_reduce_explicit_program(x, n):
    return all_reduce_program(x, n)  # the sum: f32[k, m], on every device


def all_gather_explicit_program(x, n):
    # whole rows on every device, f32[n*k, m]: the reshard is the all-gather
    _, *rest = jax.typeof(x).sharding.spec
    return jax.sharding.reshard(all_gather_program(x, n), P(None, *rest))


def reduce_scatter_explicit_program(x, n):
    # the sum, split by rows as x is: f32[k@i, m]
    return jax.sharding.reshard(reduce_scatter_program(x, n),
                                jax.typeof(x).sharding.spec)


def rings_explicit(x, n_devices):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS))  # jax.typeof(x): float32[64@i,3]

        @jax.jit
        def program(x):
            # replicated: float32[8,3] and float32[64,3]; by rows: [8@i,3]
            return (jax.sharding.reshard(all_reduce_explicit_program(x, n_devices),
                                         P()),
                    all_gather_explicit_program(x, n_devices),
                    reduce_scatter_explicit_program(x, n_devices))

        return program(x)
# [end:explicit]


# [start:numpy]
def wide(x):
    # x in the widest dtype of its kind, so NumPy rounds once, at the end
    x = np.asarray(x)
    for kind, dtype in ((jnp.complexfloating, np.complex128),
                        (jnp.floating, np.float64), (jnp.integer, np.int64)):
        if jnp.issubdtype(x.dtype, kind):
            return x.astype(dtype)
    return x


def all_reduce_numpy(x, n):
    # integers wrap around as they do on the devices
    return blocks(wide(x), n).sum(0).astype(x.dtype)


def all_gather_numpy(x, n):
    del n
    return np.array(x)


def reduce_scatter_numpy(x, n):
    return blocks(wide(x), n).sum(0).astype(x.dtype)


def rings_numpy(x, n_devices):
    return (all_reduce_numpy(x, n_devices), all_gather_numpy(x, n_devices),
            reduce_scatter_numpy(x, n_devices))
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    rng = np.random.default_rng(0)
    # Small integers: sums are exact, so every form must match exactly.
    x = rng.integers(-8, 9, size=(N_DEVICES * N_DEVICES, 3)).astype(np.float32)
    want = rings_numpy(x, N_DEVICES)
    results = {"pmap": rings_pmap(x, N_DEVICES),
               "shard_map": rings_shard_map(x, mesh),
               "native shard_map": natives_shard_map(x, mesh),
               "jit": rings_jit(x, mesh),
               "explicit": rings_explicit(x, N_DEVICES)}
    ops = ("all-reduce", "all-gather", "reduce-scatter")
    for form, outs in results.items():
        for op, got, expected in zip(ops, outs, want, strict=True):
            np.testing.assert_array_equal(np.asarray(got), expected,
                                          err_msg=f"{op} ({form} form)")
    text = jax.jit(jax.shard_map(
        ring_all_reduce, mesh=mesh, in_specs=P(AXIS),
        out_specs=P(), check_vma=False)).lower(x).compile().as_text()
    permutes = sum(" collective-permute(" in line or "collective-permute-start("
                   in line for line in text.splitlines())
    assert "all-reduce(" not in text and permutes == 2 * (N_DEVICES - 1), permutes
    print(f"x: float32{list(x.shape)} on {N_DEVICES} devices")
    k = x.shape[0] // N_DEVICES
    print("ring all-reduce, row 0:", np.asarray(results["shard_map"][0])[0].tolist())
    print(f"rows 0, {k}, {2 * k}, .. of x summed:", x[::k].sum(0).tolist(),
          "(the same: row 0 of every device's block)")
    print(f"ring all-reduce compiles to {permutes} collective-permutes, no all-reduce")
    print("ok: ring all-reduce, all-gather and reduce-scatter equal psum, all_gather "
          "and psum_scatter and NumPy in pmap, shard_map, jit and explicit form")


if __name__ == "__main__":
    main()
