"""All-reduce: psum, pmean, pmax and pmin in pmap, shard_map, jit and explicit form.

What it shows: every device holds one block of rows of ``x``; an all-reduce
combines the blocks elementwise (sum, mean, max, min) and leaves the result
on every device.

Which form when:
  * shard_map: you write the per-device program and say where to reduce. The
    modern replacement for pmap; use it when you want to control the
    communication.
  * jit: you write the global program (``x.reshape(n, k, m).sum(0)``) and
    say how inputs and outputs are laid out; XLA inserts the all-reduce.
  * explicit: the jit form's global program, unchanged, on a mesh whose
    axes are Explicit (JAX's default from 0.9): the sharding is part of each
    array's type (``jax.typeof(x)`` is ``float32[16@i,3]``), the reduction
    over the sharded blocks is the all-reduce, and ``jax.sharding.reshard``
    says where the result lives. It compiles to the same all-reduce as the
    jit and shard_map forms.
  * pmap: the legacy form, shown as the "before" of a migration.

The per-device bodies, the global programs and the NumPy oracles below are
the ones ``collectives.RECIPES["psum"]`` (and ``"pmean"``, ``"pmax"``,
``"pmin"``) run: ``axis`` may be one mesh axis name or a tuple of them.

Registered as: ``collectives.RECIPES["psum"]``,
``collectives.RECIPES["pmean"]``, ``collectives.RECIPES["pmax"]``,
``collectives.RECIPES["pmin"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/reductions.py``
"""

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
    # Auto axes on every JAX version: jax.make_mesh gives Explicit axes from
    # JAX 0.9 on, and shard_map then insists inputs already match in_specs.
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Auto,))


# [start:body]
# x: [k, m] on each device -> [k, m], the same on every device of `axis`
def psum_body(x, axis=AXIS):
    return lax.psum(x, axis)


def pmean_body(x, axis=AXIS):
    return lax.pmean(x, axis)


def pmax_body(x, axis=AXIS):
    return lax.pmax(x, axis)


def pmin_body(x, axis=AXIS):
    return lax.pmin(x, axis)
# [end:body]


BODIES = (psum_body, pmean_body, pmax_body, pmin_body)


# [start:pmap]
def reductions_pmap(x, n_devices):
    # pmap maps over a leading device axis: x: [n*k, m] -> [n, k, m]
    stacked = x.reshape(n_devices, -1, *x.shape[1:])

    def per_device(block):
        # block: [k, m] on each device
        return tuple(body(block) for body in BODIES)

    outs = jax.pmap(per_device, axis_name=AXIS)(stacked)  # each [n, k, m]
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
        return tuple(body(block) for body in BODIES)

    # in_specs P("i"): rows split over devices. out_specs P(): replicated,
    # which shard_map checks statically (the results are invariant over "i").
    f = jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS), out_specs=P())
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def blocks(x, n):
    # x: [n*k, m] global -> [n, k, m]: the block each of n devices holds
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])


def psum_program(x, n):
    return blocks(x, n).sum(0, dtype=x.dtype)


def pmean_program(x, n):
    # lax.pmean is psum, then divide: integers sum as integers first
    return blocks(x, n).sum(0, dtype=x.dtype) / n


def pmax_program(x, n):
    return blocks(x, n).max(0)


def pmin_program(x, n):
    return blocks(x, n).min(0)


def reductions_jit(x, mesh):
    n = mesh.shape[AXIS]

    def global_program(x):
        # x: [n*k, m], rows sharded; jit turns each reduction over the n
        # blocks into an all-reduce
        return tuple(program(x, n) for program in
                     (psum_program, pmean_program, pmax_program, pmin_program))

    f = jax.jit(global_program, in_shardings=NamedSharding(mesh, P(AXIS)),
                out_shardings=NamedSharding(mesh, P()))
    return f(x)
# [end:jit]


# [start:explicit]
# The jit form's programs, unchanged, on Explicit axes: x: f32[n*k@i, m], the
# rows' split in its type. A reduction over the sharded blocks is the
# all-reduce (the same one the jit and shard_map forms compile to), and the
# result's type says it is on every device: f32[k, m].
def psum_explicit_program(x, n):
    return psum_program(x, n)


def pmean_explicit_program(x, n):
    return pmean_program(x, n)


def pmax_explicit_program(x, n):
    return pmax_program(x, n)


def pmin_explicit_program(x, n):
    return pmin_program(x, n)


def reductions_explicit(x, n_devices):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS))  # jax.typeof(x): float32[16@i,3]

        @jax.jit
        def global_program(x):
            # reshard says where each result lives: float32[2,3], everywhere
            return tuple(jax.sharding.reshard(program(x, n_devices), P())
                         for program in (psum_explicit_program, pmean_explicit_program,
                                         pmax_explicit_program, pmin_explicit_program))

        return global_program(x)
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


def psum_numpy(x, n):
    # integers wrap around as they do on the devices
    return blocks(wide(x), n).sum(0).astype(x.dtype)


def pmean_numpy(x, n):
    # a mean of integers is a float: float32 (float64 with jax_enable_x64)
    return blocks(wide(x), n).mean(0).astype(jnp.result_type(x.dtype, float))


def pmax_numpy(x, n):
    return np.max(blocks(np.asarray(x), n), axis=0)


def pmin_numpy(x, n):
    return np.min(blocks(np.asarray(x), n), axis=0)
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
    want = tuple(oracle(x, N_DEVICES) for oracle in
                 (psum_numpy, pmean_numpy, pmax_numpy, pmin_numpy))
    results = {
        "pmap": reductions_pmap(x, N_DEVICES),
        "shard_map": reductions_shard_map(x, mesh),
        "jit": reductions_jit(x, mesh),
        "explicit": reductions_explicit(x, N_DEVICES),
    }
    for form, outs in results.items():
        for op, got, expected in zip(("psum", "pmean", "pmax", "pmin"), outs, want,
                                     strict=True):
            np.testing.assert_array_equal(np.asarray(got), expected,
                                          err_msg=f"{op} ({form} form)")
    print(f"x: float32{list(x.shape)} on {N_DEVICES} devices, blocks of "
          f"{x.shape[0] // N_DEVICES} rows")
    psum, pmax = (np.asarray(results["shard_map"][i]) for i in (0, 2))
    # each device's block is rows 2d, 2d+1: the psum's row 0 adds rows 0, 2, 4..
    print("psum, row 0              :", psum[0].tolist())
    print("x[0::2].sum(0), by hand  :", x[0::2].sum(0).tolist())
    print("pmax, row 0              :", pmax[0].tolist())
    print("x[0::2].max(0), by hand  :", x[0::2].max(0).tolist())
    print("ok: pmap, shard_map, jit and explicit agree with NumPy for psum, pmean, "
          "pmax, pmin")


if __name__ == "__main__":
    main()
