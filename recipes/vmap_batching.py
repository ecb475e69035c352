"""vmap batching: named vmap axes in collectives, next to devices.

What it shows: ``jax.vmap(f, axis_name="example")`` names the mapped axis, and
``lax.psum`` / ``lax.pmean`` / ``lax.axis_index`` accept that name like a
device axis. Each device holds a batch of k examples; one collective over
``("i", "example")`` reduces over the devices AND the examples at once:
  * ``psum(row, ("i", "example"))``: the sum of all n * k rows;
  * ``row - pmean(row, ("i", "example"))``: every row centred on the global
    mean row (the batch statistics of a cross-device batch norm).

The same body runs as
  * pmap of vmap (legacy): ``pmap(vmap(f, axis_name="example"), axis_name="i")``;
  * shard_map with a vmap inside the body. Sharp edge: shard_map's
    varying-axes check (``check_vma=True``, the default) rejects collectives
    over a vmapped axis on JAX 0.8 to 0.12, so this form passes
    ``check_vma=False``; or keep the check and reduce over the examples with
    a plain ``sum`` first (shown too);
  * vmap of vmap on ONE device: the device axis is just another named vmap;
  * jit: the global program ``x.sum(0)``, no names at all.
  * explicit: the jit form's global program, unchanged, on Explicit mesh
    axes; the example axis is just the rows of ``float32[32@i,3]``,
    ``reshard`` says where each result lives, and it compiles to the jit
    form's one all-reduce.
And the other way round: ``vmap`` of a shard_map adds a batch dimension to
it; ``spmd_axis_name="i"`` splits that batch over mesh axis "i" instead of
repeating it on every device.

The per-device bodies, the global programs and the NumPy oracles below are
the ones ``collectives.RECIPES["vmap_psum"]`` and ``"vmap_center"`` run:
``axis`` may be one mesh axis name or a tuple of them. ``vmap_axes`` is
``collectives.vmap_axes``.

Registered as: ``collectives.RECIPES["vmap_psum"]``,
``collectives.RECIPES["vmap_center"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/vmap_batching.py``
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8
AXIS = "i"  # the device axis
EXAMPLE = "example"  # the vmapped example axis


def make_explicit_mesh(shape, names):
    # jax.make_mesh's default from JAX 0.9 on, spelled out for every version.
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Explicit,) * len(shape))


def make_mesh(shape, names):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def names_with_example(axis):
    # the device axis name (or tuple of them) and the example axis, as one tuple
    return (*((axis,) if isinstance(axis, str) else axis), EXAMPLE)


# [start:body]
# x: [k, m] on each device: k examples. vmap maps the rows under the name
# "example"; one collective over (*axis, "example") covers every row of
# every device.
def vmap_psum_body(x, axis=AXIS):
    # -> [m], the sum of all n*k rows: it no longer varies along "example"
    # (out_axes=None)
    names = names_with_example(axis)
    return jax.vmap(lambda row: lax.psum(row, names), axis_name=EXAMPLE,
                    out_axes=None)(x)


def vmap_center_body(x, axis=AXIS):
    # -> [k, m]: each row minus the mean of all n*k rows; still mapped along
    # "example"
    names = names_with_example(axis)
    return jax.vmap(lambda row: row - lax.pmean(row, names), axis_name=EXAMPLE)(x)
# [end:body]


def per_device(block):
    # block: [k, m] -> the total [m] and the centred rows [k, m]
    return vmap_psum_body(block), vmap_center_body(block)


def vmap_axes(fn, axis_names, in_axes=0, out_axes=0):
    # fn under one named vmap per axis, the first outermost: on ONE device,
    # vmap_axes(body, ("i", "j")) computes what pmap over "i" of vmap over "j"
    # computes on n_i devices (arrays stacked [n_i, n_j, *block]).
    for name in reversed((axis_names,) if isinstance(axis_names, str)
                         else tuple(axis_names)):
        fn = jax.vmap(fn, in_axes=in_axes, out_axes=out_axes, axis_name=name)
    return fn


# [start:pmap]
def batching_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, x.shape[1])  # [n, k, m]
    total, centred = jax.pmap(per_device, axis_name=AXIS)(stacked)
    copies = np.asarray(total)
    assert (copies == copies[0]).all(), "device copies differ"
    return copies[0], np.asarray(centred).reshape(x.shape)
# [end:pmap]


# [start:shard_map]
def batching_shard_map(x, mesh):
    # check_vma=False: the varying-axes check rejects the collectives over
    # the vmapped "example" axis (JAX 0.8-0.12).
    f = jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS),
                      out_specs=(P(), P(AXIS)), check_vma=False)
    return jax.jit(f)(x)


def total_checked_shard_map(x, mesh):
    # Keeping check_vma=True: reduce over the examples with a plain sum first,
    # then over the devices.
    f = jax.shard_map(lambda block: lax.psum(block.sum(0), AXIS), mesh=mesh,
                      in_specs=P(AXIS), out_specs=P())
    return jax.jit(f)(x)


def batching_one_device(x, n_devices):
    # No devices at all: the device axis "i" is a second, outer named vmap.
    stacked = x.reshape(n_devices, -1, x.shape[1])  # [n, k, m]
    total, centred = jax.jit(vmap_axes(per_device, AXIS))(stacked)
    return np.asarray(total)[0], np.asarray(centred).reshape(x.shape)


def per_example_sum_over_j(mesh):
    # A shard_map over "j" for ONE example v: [n_j * c] -> [c]
    return jax.shard_map(lambda v: lax.psum(v, "j"), mesh=mesh, in_specs=P("j"),
                         out_specs=P())


def vmap_of_shard_map(z, mesh, spmd_axis_name=None):
    # z: [batch, n_j * c]. vmap adds the batch dimension to the shard_map;
    # with spmd_axis_name="i" the batch is split over "i" as well.
    f = jax.vmap(per_example_sum_over_j(mesh), spmd_axis_name=spmd_axis_name)
    return jax.jit(f)(z)
# [end:shard_map]


# [start:jit]
def vmap_psum_program(x):
    # x: [n*k, m], rows sharded: the sum of all rows; jit all-reduces the
    # per-device partial sums
    return x.sum(0, dtype=x.dtype)


def vmap_center_program(x):
    return x - x.mean(0, keepdims=True)


def batching_jit(x, mesh):
    def global_program(x):
        # the same two results, no names
        return vmap_psum_program(x), vmap_center_program(x)

    f = jax.jit(global_program, in_shardings=NamedSharding(mesh, P(AXIS)),
                out_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))))
    return f(x)
# [end:jit]


# [start:explicit]
# The jit form's programs, unchanged, on Explicit axes: x: f32[n*k@i, m]; the
# example axis is just the rows. Each compiles to the jit form's all-reduce.
def vmap_psum_explicit_program(x):
    return vmap_psum_program(x)  # the total: f32[m], on every device


def vmap_center_explicit_program(x):
    return vmap_center_program(x)  # the centred rows, where they are: f32[n*k@i, m]


def batching_explicit(x, n_devices):
    mesh = make_explicit_mesh((n_devices,), (AXIS,))
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS))  # jax.typeof(x): float32[32@i,3]

        @jax.jit
        def global_program(x):
            # reshard says where each result lives: float32[3] on every
            # device, float32[32@i,3] by rows
            return (jax.sharding.reshard(vmap_psum_explicit_program(x), P()),
                    jax.sharding.reshard(vmap_center_explicit_program(x), P(AXIS)))

        return global_program(x)
# [end:explicit]


# [start:numpy]
def wide(x):
    # x in the widest dtype of its kind, so NumPy rounds once, at the end
    x = np.asarray(x)
    for kind, dtype in ((jnp.floating, np.float64), (jnp.integer, np.int64)):
        if jnp.issubdtype(x.dtype, kind):
            return x.astype(dtype)
    return x


def vmap_psum_numpy(x):
    # integers wrap around as they do on the devices
    return wide(x).sum(0).astype(np.asarray(x).dtype)


def vmap_center_numpy(x):
    x = np.asarray(x)
    rows = wide(x)
    return (rows - rows.mean(0, keepdims=True)).astype(x.dtype)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh((N_DEVICES,), (AXIS,))
    rng = np.random.default_rng(0)
    # k = 4 examples per device; integers with a power-of-two row count (32):
    # sums and means are exact, so every form must match exactly.
    x = rng.integers(-8, 9, size=(N_DEVICES * 4, 3)).astype(np.float32)
    want_total, want_centred = vmap_psum_numpy(x), vmap_center_numpy(x)
    results = {
        "pmap(vmap)": batching_pmap(x, N_DEVICES),
        "shard_map + vmap": batching_shard_map(x, mesh),
        "vmap(vmap), one device": batching_one_device(x, N_DEVICES),
        "jit": batching_jit(x, mesh),
        "explicit": batching_explicit(x, N_DEVICES),
    }
    for form, (total, centred) in results.items():
        np.testing.assert_array_equal(np.asarray(total), want_total,
                                      err_msg=f"total ({form})")
        np.testing.assert_array_equal(np.asarray(centred), want_centred,
                                      err_msg=f"centred ({form})")
    np.testing.assert_array_equal(np.asarray(total_checked_shard_map(x, mesh)),
                                  want_total)

    # vmap of a shard_map on a 4 x 2 mesh: 8 examples, each split over "j".
    mesh_2d = make_mesh((4, 2), ("i", "j"))
    z = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    want = z.reshape(8, 2, 3).sum(1)
    for spmd, rows_per_device in ((None, 8), ("i", 2)):
        out = vmap_of_shard_map(z, mesh_2d, spmd)
        np.testing.assert_array_equal(np.asarray(out), want)
        rows = {s.data.shape[0] for s in out.addressable_shards}
        assert rows == {rows_per_device}, (spmd, rows)

    print(f"x: float32{list(x.shape)}, {x.shape[0] // N_DEVICES} examples on each "
          f"of {N_DEVICES} devices")
    print("psum over ('i', 'example')    ->", np.asarray(results["jit"][0]).tolist())
    print("column sums of x, by NumPy     ->", x.sum(0).tolist())
    print("row 0 centred (x[0] - mean)    ->",
          np.asarray(results["shard_map + vmap"][1])[0].tolist(),
          "=", (x[0] - x.mean(0)).tolist())
    print("vmap(shard_map): each device computes 8 examples; with "
          "spmd_axis_name='i', 2")
    print("ok: pmap(vmap), shard_map + vmap, vmap(vmap) on one device, jit and "
          "explicit agree with NumPy")


if __name__ == "__main__":
    main()
