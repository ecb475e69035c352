"""Sharp edges of shard_map's types: explicit meshes, VMA, invariant psums, groups.

What it shows, each as the wrong way (the real error or the wrong number)
and the fix:

  1. Explicit-axis meshes. ``jax.make_mesh`` gives ``AxisType.Explicit`` axes
     from JAX 0.9 on, and shard_map then refuses inputs whose sharding differs
     from ``in_specs`` (a NumPy array counts as replicated): "in_specs passed
     to shard_map: P('i',) does not match the specs of the input: P(None,
     None)" (from JAX 0.9.1; 0.8.0 to 0.9.0.1 accept them). Fix: build the
     mesh with ``Auto`` axes, or
     ``jax.device_put`` the inputs with ``NamedSharding(mesh, in_specs)``.
  2. ``all_gather`` then ``out_specs=P()``: the gathered value is typed
     *varying*, so the replication (VMA) check fails ("out_specs which require
     replication which can't be statically inferred"). Fix: the invariant
     gather (``lax.all_gather(..., to="invarying")`` from 0.10.0;
     ``lax.all_gather_invariant`` on 0.8.0-0.8.1, private on 0.8.2-0.9.2).
  4. ``psum`` of an invariant value (an ``in_specs=P()`` input, or a value
     already summed) multiplies it by the axis size, silently. Fix: psum only
     what varies per device; add the invariant part once.
  9. ``axis_index_groups`` in shard_map with ``check_vma=True`` raises a bare
     ``NotImplementedError`` (no message). Fix: make the groups a mesh axis
     (a 2-D mesh) and psum over the inner axis; or ``check_vma=False``.

Which form when: shard_map is where these types live; jit needs none of this
(the global program says what to compute); pmap has no varying/invariant
types, so ported pmap code is where these edges appear.

Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python guides/sharp_edges_sharding.py``
"""

import os

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8


def make_mesh(shape, names):
    # Auto axes on every JAX version: the fix for pitfall 1.
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def make_explicit_mesh(shape, names):
    # What jax.make_mesh(shape, names) gives by default from JAX 0.9 on.
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Explicit,) * len(shape))


def all_gather_invariant(x, axis_name, *, tiled):
    # The invariant gather is spelled differently across JAX versions:
    # public lax.all_gather_invariant on 0.8.0-0.8.1, private on 0.8.2-0.9.2,
    # lax.all_gather(..., to="invarying") from 0.10.0.
    if hasattr(lax, "all_gather_invariant"):  # JAX 0.8.0, 0.8.1
        return lax.all_gather_invariant(x, axis_name, tiled=tiled)
    if jax.__version_info__[:3] < (0, 10, 0):  # JAX 0.8.2 to 0.9.2
        from jax._src.lax.parallel import all_gather_invariant as private
        return private(x, axis_name, tiled=tiled)
    return lax.all_gather(x, axis_name, tiled=tiled, to="invarying")  # >= 0.10


# [start:pmap]
def psum_with_groups_pmap(x, groups):
    # pmap accepts axis_index_groups: x: [n, k] -> each device gets its group's sum
    return jax.pmap(lambda b: lax.psum(b, "i", axis_index_groups=groups),
                    axis_name="i")(x)
# [end:pmap]


# [start:shard_map]
def psum_rows(x, mesh):
    # Pitfall 1: on an Explicit mesh (JAX >= 0.9.1) a NumPy x raises here.
    f = jax.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh,
                      in_specs=P("i"), out_specs=P())
    return jax.jit(f)(x)


def psum_rows_placed(x, mesh):
    # Fix 1: place x as in_specs says first; works on every mesh and version.
    return psum_rows(jax.device_put(x, NamedSharding(mesh, P("i"))), mesh)


def gather_plain(x, mesh):
    # Pitfall 2: the plain gather is varying over "i"; out_specs=P() fails.
    f = jax.shard_map(lambda b: lax.all_gather(b, "i", tiled=True), mesh=mesh,
                      in_specs=P("i"), out_specs=P())
    return jax.jit(f)(x)


def gather_invariant(x, mesh):
    # Fix 2: the invariant gather is typed replicated; out_specs=P() passes.
    f = jax.shard_map(lambda b: all_gather_invariant(b, "i", tiled=True),
                      mesh=mesh, in_specs=P("i"), out_specs=P())
    return jax.jit(f)(x)


def total_wrong(x, offset, mesh):
    # Pitfall 4: sum of the rows plus one offset. offset is P() (invariant),
    # and psum adds every device's copy of it: n * offset instead of offset.
    def per_device(block, offset):
        # block: [k] on each device, offset: [] the same on every device
        return lax.psum(block.sum() + offset, "i")

    f = jax.shard_map(per_device, mesh=mesh, in_specs=(P("i"), P()),
                      out_specs=P())
    return jax.jit(f)(x, offset)


def total_right(x, offset, mesh):
    # Fix 4: psum only the per-device part; add the invariant part once.
    def per_device(block, offset):
        return lax.psum(block.sum(), "i") + offset

    f = jax.shard_map(per_device, mesh=mesh, in_specs=(P("i"), P()),
                      out_specs=P())
    return jax.jit(f)(x, offset)


def psum_groups_shard_map(x, mesh, groups, check_vma=True):
    # Pitfall 9: with check_vma=True this raises a bare NotImplementedError.
    f = jax.shard_map(lambda b: lax.psum(b, "i", axis_index_groups=groups),
                      mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                      check_vma=check_vma)
    return jax.jit(f)(x)


def psum_groups_as_mesh_axis(x, n_groups):
    # Fix 9: a (groups, members) mesh; psum over "member" sums within a group.
    mesh = make_mesh((n_groups, N_DEVICES // n_groups), ("group", "member"))
    f = jax.shard_map(lambda b: lax.psum(b, "member"), mesh=mesh,
                      in_specs=P(("group", "member")),
                      out_specs=P(("group", "member")))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def total_jit(x, offset, mesh):
    # The global program says what it means: jit inserts one all-reduce.
    f = jax.jit(lambda x, offset: x.sum() + offset,
                in_shardings=(NamedSharding(mesh, P("i")), NamedSharding(mesh, P())),
                out_shardings=NamedSharding(mesh, P()))
    return f(x, offset)
# [end:jit]


# [start:numpy]
def total_numpy(x, offset):
    return x.astype(np.float64).sum() + offset


def group_sums_numpy(x, n_groups):
    # every device of a group gets the elementwise sum of its group's blocks
    blocks = x.reshape(n_groups, N_DEVICES // n_groups, -1, *x.shape[1:])
    sums = blocks.sum(1, keepdims=True)
    return np.broadcast_to(sums, blocks.shape).reshape(x.shape)
# [end:numpy]


def _error_line(fn, *args):
    try:
        fn(*args)
    except (ValueError, NotImplementedError) as err:
        text = " ".join(str(err).split())
        return f"{type(err).__name__}: {text[:110] or '(empty message)'}"
    return "no error on this JAX version"


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh((N_DEVICES,), ("i",))
    x = np.arange(2.0 * N_DEVICES, dtype=np.float32)

    explicit = make_explicit_mesh((N_DEVICES,), ("i",))
    print(f"JAX {jax.__version__}")
    print("1. explicit mesh, NumPy input ->", _error_line(psum_rows, x, explicit))
    want = x.reshape(N_DEVICES, -1).sum(0)
    for got in (psum_rows(x, mesh), psum_rows_placed(x, explicit)):
        np.testing.assert_array_equal(np.asarray(got), want)

    print("2. all_gather, out_specs=P() ->", _error_line(gather_plain, x, mesh))
    np.testing.assert_array_equal(np.asarray(gather_invariant(x, mesh)), x)

    offset = np.float32(100.0)
    wrong = float(total_wrong(x, offset, mesh))
    want = total_numpy(x, offset)
    assert wrong == want + (N_DEVICES - 1) * offset, wrong
    for got in (total_right(x, offset, mesh), total_jit(x, offset, mesh)):
        np.testing.assert_array_equal(np.asarray(got), want)
    print(f"4. psum of an invariant offset: {wrong} instead of {want} "
          f"(offset {float(offset)} counted {N_DEVICES} times)")

    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    print("9. axis_index_groups, check_vma=True ->",
          _error_line(psum_groups_shard_map, x, mesh, groups))
    want = group_sums_numpy(x, 2)
    stacked = x.reshape(N_DEVICES, -1)
    for got in (psum_groups_as_mesh_axis(x, 2),
                psum_groups_shard_map(x, mesh, groups, check_vma=False),
                np.asarray(psum_with_groups_pmap(stacked, groups)).reshape(x.shape)):
        np.testing.assert_array_equal(np.asarray(got), want)
    print("ok: every fix agrees with NumPy (explicit mesh, invariant gather, "
          "psum of the varying part, groups as a mesh axis)")


if __name__ == "__main__":
    main()
