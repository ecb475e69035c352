"""All-reduce: psum, pmean, pmax and pmin in pmap, shard_map and jit form.

What it shows: every device holds one block of rows of ``x``; an all-reduce
combines the blocks elementwise (sum, mean, max, min) and leaves the result
on every device.

Which form when:
  * shard_map: you write the per-device program and say where to reduce. The
    modern replacement for pmap; use it when you want to control the
    communication.
  * jit: you write the global program (``x.reshape(n, k, m).sum(0)``) and
    say how inputs and outputs are laid out; XLA inserts the all-reduce.
  * pmap: the legacy form, shown as the "before" of a migration.

Registered as: ``collectives.RECIPES["psum"]``,
``collectives.RECIPES["pmean"]``, ``collectives.RECIPES["pmax"]``,
``collectives.RECIPES["pmin"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/reductions.py``
"""

import os

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8


def make_mesh(n_devices):
    # Auto axes on every JAX version: jax.make_mesh gives Explicit axes from
    # JAX 0.9 on, and shard_map then insists inputs already match in_specs.
    return jax.make_mesh((n_devices,), ("i",),
                         axis_types=(jax.sharding.AxisType.Auto,))


# [start:pmap]
def reductions_pmap(x, n_devices):
    # pmap maps over a leading device axis: x: [n*k, m] -> [n, k, m]
    stacked = x.reshape(n_devices, -1, *x.shape[1:])

    def per_device(block):
        # block: [k, m] on each device
        return (lax.psum(block, "i"), lax.pmean(block, "i"),
                lax.pmax(block, "i"), lax.pmin(block, "i"))

    outs = jax.pmap(per_device, axis_name="i")(stacked)  # each [n, k, m]
    # Every device holds the same result. pmap(out_axes=None) would return
    # copy 0 without checking that; check it here instead.
    for out in outs:
        copies = np.asarray(out)
        assert (copies == copies[0]).all(), "device copies differ"
    return tuple(np.asarray(out)[0] for out in outs)
# [end:pmap]


# [start:shard_map]
def reductions_shard_map(x, mesh):
    def per_device(block):
        # block: [k, m] on each device -> four [k, m] results, equal everywhere
        return (lax.psum(block, "i"), lax.pmean(block, "i"),
                lax.pmax(block, "i"), lax.pmin(block, "i"))

    # in_specs P("i"): rows split over devices. out_specs P(): replicated,
    # which shard_map checks statically (the results are invariant over "i").
    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"), out_specs=P())
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def reductions_jit(x, mesh):
    n = mesh.shape["i"]
    replicated = NamedSharding(mesh, P())

    def global_program(x):
        # x: [n*k, m], rows sharded; view it as one [k, m] block per device
        blocks = x.reshape(n, -1, *x.shape[1:])
        total = blocks.sum(0, dtype=x.dtype)
        return total, total / n, blocks.max(0), blocks.min(0)

    f = jax.jit(global_program, in_shardings=NamedSharding(mesh, P("i")),
                out_shardings=replicated)
    return f(x)
# [end:jit]


# [start:numpy]
def reductions_numpy(x, n_devices):
    blocks = x.astype(np.float64).reshape(n_devices, -1, *x.shape[1:])
    return blocks.sum(0), blocks.mean(0), blocks.max(0), blocks.min(0)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    rng = np.random.default_rng(0)
    # Small integers are exact in float32, so every form must match exactly.
    x = rng.integers(-8, 9, size=(N_DEVICES * 2, 3)).astype(np.float32)
    want = reductions_numpy(x, N_DEVICES)
    results = {
        "pmap": reductions_pmap(x, N_DEVICES),
        "shard_map": reductions_shard_map(x, mesh),
        "jit": reductions_jit(x, mesh),
    }
    for form, outs in results.items():
        for op, got, expected in zip(("psum", "pmean", "pmax", "pmin"), outs, want,
                                     strict=True):
            np.testing.assert_array_equal(np.asarray(got), expected,
                                          err_msg=f"{op} ({form} form)")
    print(f"x: float32{list(x.shape)} on {N_DEVICES} devices, blocks of "
          f"{x.shape[0] // N_DEVICES} rows")
    print("psum  ->", np.asarray(results["shard_map"][0]).tolist())
    print("pmax  ->", np.asarray(results["shard_map"][2]).tolist())
    print("ok: pmap, shard_map and jit agree with NumPy for psum, pmean, pmax, pmin")


if __name__ == "__main__":
    main()
