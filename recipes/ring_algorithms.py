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
``x.sum(...)`` and XLA chooses the collective, shown here for comparison.
A ring result is the same on every device, but shard_map types ppermute
results as varying, so a replicated out_specs needs ``check_vma=False``.

Registered as: ``collectives.RECIPES["ring_all_reduce"]``,
``collectives.RECIPES["ring_all_gather"]``,
``collectives.RECIPES["ring_reduce_scatter"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/ring_algorithms.py``
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


# [start:ring]
def shift(x, axis, n):
    # device s sends to s + 1: each device receives its left neighbour's block
    return lax.ppermute(x, axis, [(s, (s + 1) % n) for s in range(n)])


def ring_reduce_scatter(x, axis, n):
    # x: [n*c, ...] on each device -> [c, ...]: chunk `me` of the sum
    me, c = lax.axis_index(axis), x.shape[0] // n

    def chunk(j):
        return lax.dynamic_slice_in_dim(x, j * c, c, axis=0)

    # Chunk j starts on device j + 1 and collects one term per step; after
    # n - 1 steps it arrives, complete, on device j.
    acc = chunk((me - 1) % n)
    for step in range(1, n):
        acc = shift(acc, axis, n) + chunk((me - 1 - step) % n)
    return acc


def ring_all_gather(x, axis, n):
    # x: [k, ...] on each device -> [n*k, ...], the same on every device
    me, k = lax.axis_index(axis), x.shape[0]
    out = jnp.zeros((n * k, *x.shape[1:]), x.dtype)
    out = lax.dynamic_update_slice_in_dim(out, x, me * k, axis=0)
    block = x
    for step in range(1, n):
        block = shift(block, axis, n)  # the block of device me - step
        out = lax.dynamic_update_slice_in_dim(out, block, ((me - step) % n) * k,
                                              axis=0)
    return out


def ring_all_reduce(x, axis, n):
    # x: any shape; flatten and pad to n equal chunks, then two ring phases
    flat = x.reshape(-1)
    flat = jnp.concatenate([flat, jnp.zeros((-flat.shape[0]) % n, x.dtype)])
    total = ring_all_gather(ring_reduce_scatter(flat, axis, n), axis, n)
    return total[:x.size].reshape(x.shape)
# [end:ring]


# [start:pmap]
def rings_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, m]

    def per_device(block):
        return (ring_all_reduce(block, "i", n_devices),
                ring_all_gather(block, "i", n_devices),
                ring_reduce_scatter(block, "i", n_devices))

    reduced, gathered, scattered = jax.pmap(per_device, axis_name="i")(stacked)
    for out in (reduced, gathered):  # replicated: check, then take copy 0
        copies = np.asarray(out)
        assert (copies == copies[0]).all(), "device copies differ"
    return (np.asarray(reduced)[0], np.asarray(gathered)[0],
            np.asarray(scattered).reshape(-1, *x.shape[1:]))
# [end:pmap]


# [start:shard_map]
def rings_shard_map(x, mesh):
    n = mesh.shape["i"]

    def per_device(block):
        # block: [k, m] -> ([k, m] sum, [n*k, m] gathered, [k/n, m] chunk of sum)
        return (ring_all_reduce(block, "i", n), ring_all_gather(block, "i", n),
                ring_reduce_scatter(block, "i", n))

    # check_vma=False: the first two are replicated in value, varying in type.
    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"),
                      out_specs=(P(), P(), P("i")), check_vma=False)
    return jax.jit(f)(x)


def natives_shard_map(x, mesh):
    def per_device(block):
        return (lax.psum(block, "i"), lax.all_gather(block, "i", tiled=True),
                lax.psum_scatter(block, "i", tiled=True))

    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"),
                      out_specs=(P(), P(), P("i")), check_vma=False)
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def rings_jit(x, mesh):
    # The global view: XLA picks the collectives (no ring to write).
    n = mesh.shape["i"]
    rows = NamedSharding(mesh, P("i"))

    def program(x):
        blocks = x.reshape(n, -1, *x.shape[1:])
        total = blocks.sum(0, dtype=x.dtype)
        return total, x, total

    f = jax.jit(program, in_shardings=rows,
                out_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P()),
                               rows))
    return f(x)
# [end:jit]


# [start:numpy]
def rings_numpy(x, n_devices):
    total = x.astype(np.float64).reshape(n_devices, -1, *x.shape[1:]).sum(0)
    return total, x, total
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
               "jit": rings_jit(x, mesh)}
    ops = ("all-reduce", "all-gather", "reduce-scatter")
    for form, outs in results.items():
        for op, got, expected in zip(ops, outs, want, strict=True):
            np.testing.assert_array_equal(np.asarray(got), expected,
                                          err_msg=f"{op} ({form} form)")
    text = jax.jit(jax.shard_map(
        lambda b: ring_all_reduce(b, "i", N_DEVICES), mesh=mesh, in_specs=P("i"),
        out_specs=P(), check_vma=False)).lower(x).compile().as_text()
    permutes = sum(" collective-permute(" in line or "collective-permute-start("
                   in line for line in text.splitlines())
    assert "all-reduce(" not in text and permutes == 2 * (N_DEVICES - 1), permutes
    print(f"x: float32{list(x.shape)} on {N_DEVICES} devices")
    print("ring all-reduce, row 0:", np.asarray(results["shard_map"][0])[0].tolist())
    print(f"ring all-reduce compiles to {permutes} collective-permutes, no all-reduce")
    print("ok: ring all-reduce, all-gather and reduce-scatter equal psum, all_gather "
          "and psum_scatter and NumPy in pmap, shard_map and jit form")


if __name__ == "__main__":
    main()
