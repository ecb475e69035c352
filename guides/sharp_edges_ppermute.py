"""Sharp edges of ppermute: zeros, repeated pairs, and tuples of axes.

What it shows, each as the wrong way and the fix:

  5. ``lax.ppermute(x, "i", perm)``: a device that no pair sends to receives
     **zeros** (no error, no warning); a permutation that repeats a source or
     a destination raises "ppermute sources and destinations must be unique";
     an index past the axis size raises a bare ``IndexError`` ("list index out
     of range" on JAX 0.8/0.10, "tuple index out of range" on 0.12). Fix:
     send to every device you read from (a full permutation), and check the
     pairs first (``check_pairs`` below).
  10. ``lax.ppermute`` over a *tuple* of mesh axes in an order other than the
     mesh's, e.g. ``("j", "i")`` on a mesh ``("i", "j")``: JAX up to 0.11
     silently numbers the devices in *mesh* order, while ``lax.axis_index``
     and ``all_gather`` follow the tuple's order, so a ring shift lands on the
     wrong devices (up to 0.11.0). JAX 0.11.1 and later raise instead ("Make
     sure that the axis_name passed to jax.lax.ppermute is in the same order
     as the axis_names declared on the mesh"); with the check turned off
     (``jax.config.update("jax_raise_on_ppermute_sort_diff", False)``; the
     context manager the message names is not public in 0.12.0) it follows
     the tuple's order. Fix, on every version: pass the axes in mesh order
     and renumber the pairs (``pairs_in_mesh_order`` below).

Which form when: shard_map for explicit neighbour exchange; jit when the
global program is a roll (``jnp.roll`` of a sharded axis); pmap as the
legacy form (it maps one axis, so tuples of axes do not arise there).

Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python guides/sharp_edges_ppermute.py``
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8


def make_mesh(shape, names):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def ring(n, shift=1):
    # device s sends to device s + shift (mod n)
    return [(s, (s + shift) % n) for s in range(n)]


def check_pairs(perm, n):
    # Fix 5: say what is wrong before JAX does (or before zeros appear).
    for src, dst in perm:
        if not (0 <= src < n and 0 <= dst < n):
            raise ValueError(f"perm: pair {(src, dst)} is out of range for an "
                             f"axis of {n} devices; use indices 0..{n - 1}.")
    for role, column in (("source", 0), ("destination", 1)):
        seen = [pair[column] for pair in perm]
        if len(set(seen)) != len(seen):
            raise ValueError(f"perm: a {role} appears twice in {perm}.")
    return perm


def pairs_in_mesh_order(axes, perm, mesh):
    # Fix 10: ppermute numbers devices over a tuple of axes in *mesh* order.
    # Renumber pairs given in the tuple's order (as axis_index counts).
    ordered = tuple(name for name in mesh.axis_names if name in axes)
    sizes = [mesh.shape[name] for name in axes]
    where = [axes.index(name) for name in ordered]

    def renumber(index):
        digits = np.unravel_index(index, sizes)
        return int(np.ravel_multi_index([digits[w] for w in where],
                                        [sizes[w] for w in where]))

    return ordered, [(renumber(s), renumber(d)) for s, d in perm]


# [start:pmap]
def send_pmap(x, n_devices, perm):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, m]
    f = jax.pmap(lambda b: lax.ppermute(b, "i", perm), axis_name="i")
    return np.asarray(f(stacked)).reshape(x.shape)
# [end:pmap]


# [start:shard_map]
def send_shard_map(x, mesh, perm):
    # Pitfall 5: devices that no pair sends to receive zeros.
    f = jax.shard_map(lambda b: lax.ppermute(b, "i", perm), mesh=mesh,
                      in_specs=P("i"), out_specs=P("i"))
    return jax.jit(f)(x)


def ring_shift_tuple(mesh, axes, mesh_order_fix=False):
    # Each device sends its index along `axes` (as axis_index counts it) one
    # step around the ring: device d should receive d - 1.
    n = int(np.prod([mesh.shape[a] for a in axes]))

    def per_device(block):
        index = lax.axis_index(axes).reshape(1, 1)  # [1, 1]
        if mesh_order_fix:
            return lax.ppermute(index, *pairs_in_mesh_order(axes, ring(n), mesh))
        return lax.ppermute(index, axes, ring(n))  # Pitfall 10 if axes unsorted

    spec = P(axes)  # dim 0 laid out in the tuple's order, like axis_index
    f = jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=spec)
    return np.asarray(jax.jit(f)(np.zeros((n, 1), np.int32))).ravel()
# [end:shard_map]


# [start:jit]
def ring_shift_jit(x, mesh, shift=1):
    # The global program is a roll by whole blocks; jit emits the permute.
    n = mesh.shape["i"]
    rows = NamedSharding(mesh, P("i"))
    f = jax.jit(lambda x: jnp.roll(x, shift * (x.shape[0] // n), axis=0),
                in_shardings=rows, out_shardings=rows)
    return f(x)
# [end:jit]


# [start:numpy]
def send_numpy(x, n_devices, perm):
    # devices that receive nothing hold zeros, as in lax.ppermute
    blocks = x.reshape(n_devices, -1, *x.shape[1:])
    out = np.zeros_like(blocks)
    for src, dst in perm:
        out[dst] = blocks[src]
    return out.reshape(x.shape)
# [end:numpy]


def _error_line(fn, *args):
    try:
        fn(*args)
    except (ValueError, IndexError, RuntimeError) as err:
        return f"{type(err).__name__}: {' '.join(str(err).split())[:100]}"
    return None


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh((N_DEVICES,), ("i",))
    x = np.arange(1.0, 2 * N_DEVICES + 1, dtype=np.float32).reshape(-1, 1)
    print(f"JAX {jax.__version__}")

    half = [(s, s + 1) for s in range(0, N_DEVICES, 2)]  # odd devices only
    got = np.asarray(send_shard_map(x, mesh, half))
    np.testing.assert_array_equal(got, send_numpy(x, N_DEVICES, half))
    print("5. pairs", half, "-> devices 0, 2, 4, 6 receive",
          got.reshape(N_DEVICES, -1)[0::2, 0].tolist())
    for bad in ([(0, 1), (2, 1)], [(0, N_DEVICES)]):
        print("   perm", bad, "->", _error_line(send_shard_map, x, mesh, bad))
        try:
            check_pairs(bad, N_DEVICES)
            raise AssertionError("check_pairs should reject this permutation")
        except ValueError as err:
            print("   check_pairs ->", err)
    want = send_numpy(x, N_DEVICES, ring(N_DEVICES))
    for form, got in (("pmap", send_pmap(x, N_DEVICES, ring(N_DEVICES))),
                      ("shard_map", send_shard_map(x, mesh, ring(N_DEVICES))),
                      ("jit", ring_shift_jit(x, mesh))):
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=form)

    mesh2 = make_mesh((4, 2), ("i", "j"))
    want = np.roll(np.arange(N_DEVICES), 1)  # device d receives d - 1
    wrong = _error_line(ring_shift_tuple, mesh2, ("j", "i"))
    if wrong is None:  # JAX <= 0.11.0: silently in mesh order
        wrong = str(ring_shift_tuple(mesh2, ("j", "i")).tolist())
    print('10. ring over ("j", "i") on mesh ("i", "j"): want', want.tolist())
    print("    plain ppermute ->", wrong)
    fixed = ring_shift_tuple(mesh2, ("j", "i"), mesh_order_fix=True)
    np.testing.assert_array_equal(fixed, want)
    np.testing.assert_array_equal(ring_shift_tuple(mesh2, ("i", "j")), want)
    print("    renumbered in mesh order ->", fixed.tolist())
    print("ok: full permutations agree with NumPy in every form; the renumbered "
          "tuple ring lands on the right devices")


if __name__ == "__main__":
    main()
