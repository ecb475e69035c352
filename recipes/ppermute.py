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
collective-permute); explicit for that roll on Explicit axes, in an
``auto_axes`` island (a roll of a sharded dim has no sharding rule there) with
the layout stated on the way out: the same one collective-permute; pmap as
the legacy form.

The per-device bodies, the global program and the NumPy oracle below are
the ones ``collectives.RECIPES["ppermute_ring"]`` runs, and ``permute`` and
``ring_shift`` are the ones ``collectives.permute`` and
``collectives.ring_shift`` call once they have checked their arguments.
``axis`` may be one mesh axis name or a tuple of them: device indices then
run over the axes together, the first one major, as
``lax.axis_index(axis)`` counts them (whatever the mesh's own axis order).

Registered as: ``collectives.RECIPES["ppermute_ring"]``.
Devices: 8 (simulated on CPU by ``main()``), as a 4x2 mesh too.
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
AXIS = "i"


def make_mesh(shape, names, axis_type=jax.sharding.AxisType.Auto):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from
    # 0.9) unless told otherwise; the explicit form asks for Explicit ones.
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


def axis_names(axis):
    # one mesh axis name or a tuple of them -> a tuple of names
    return (axis,) if isinstance(axis, str) else tuple(axis)


def ring(n, shift=1):
    # device s sends to device s + shift (mod n)
    return [(s, (s + shift) % n) for s in range(n)]


def pairs_in_mesh_order(axis, perm):
    # Over a tuple of axes, lax.ppermute numbers devices in the *mesh's* axis
    # order, whatever the tuple's order (JAX 0.8 to 0.11 silently; JAX 0.12
    # raises for other orders), while axis_index and all_gather follow the
    # tuple's order. Renumber the pairs so both count alike.
    names = axis_names(axis)
    if len(names) < 2:
        return axis, perm
    mesh_order = tuple(jax.sharding.get_abstract_mesh().axis_names)
    if not set(names) <= set(mesh_order):
        return axis, perm
    ordered = tuple(name for name in mesh_order if name in names)
    if ordered == names:
        return axis, perm
    sizes = [lax.axis_size(name) for name in names]
    where = [names.index(name) for name in ordered]

    def renumber(index):
        digits = np.unravel_index(index, sizes)
        return int(np.ravel_multi_index([digits[w] for w in where],
                                        [sizes[w] for w in where]))

    return ordered, [(renumber(s), renumber(d)) for s, d in perm]


# [start:body]
def permute(x, axis, perm):
    # x: any block; perm: (source, destination) pairs of indices along `axis`
    return lax.ppermute(x, *pairs_in_mesh_order(axis, perm))


def ring_shift(x, axis=AXIS, shift=1):
    # x: [k, m] on each device -> [k, m], the block of the device `shift`
    # places back along the ring
    return permute(x, axis, ring(lax.axis_size(axis), shift))


def ppermute_ring_body(x, axis=AXIS):
    # x: [k, m] on each device -> [k, m], the previous device's block
    return ring_shift(x, axis, 1)


# The legacy pmap body: pmap maps mesh axes after the first with vmap, which
# permutes over one axis at a time. So step the ring digit by digit: shift
# along the innermost axis, and where that wrapped around (index 0) take the
# block one step further along the next axis out.
def ppermute_ring_pmap_body(x, axis=AXIS):
    names = axis_names(axis)
    out = ring_shift(x, names[-1], 1)
    wrapped = lax.axis_index(names[-1]) == 0
    for name in reversed(names[:-1]):
        out = jnp.where(wrapped, ring_shift(out, name, 1), out)
        wrapped = wrapped & (lax.axis_index(name) == 0)
    return out
# [end:body]


# [start:pmap]
def ring_shift_pmap(x, n_devices, shift=1):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, m]
    f = jax.pmap(lambda b: ring_shift(b, AXIS, shift), axis_name=AXIS)
    return np.asarray(f(stacked)).reshape(x.shape)
# [end:pmap]


# [start:shard_map]
def ring_shift_shard_map(x, mesh, shift=1, axis=AXIS):
    # block: [k, m] -> the block of the device `shift` places back
    f = jax.shard_map(lambda b: ring_shift(b, axis, shift), mesh=mesh,
                      in_specs=P(axis), out_specs=P(axis))
    return jax.jit(f)(x)


def send_only_to_first_half(x, mesh):
    # Only devices 0..n/2-1 receive anything; the others get zeros.
    n = mesh.shape[AXIS]
    perm = [(s, s - n // 2) for s in range(n // 2, n)]
    f = jax.shard_map(lambda b: lax.ppermute(b, AXIS, perm), mesh=mesh,
                      in_specs=P(AXIS), out_specs=P(AXIS))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def ppermute_ring_program(x, n, shift=1):
    # Rolling by whole blocks moves every block `shift` devices on; jit
    # lowers it to a collective-permute.
    return jnp.roll(x, shift * (x.shape[0] // n), axis=0)


def ring_shift_jit(x, mesh, shift=1):
    n = mesh.shape[AXIS]
    rows = NamedSharding(mesh, P(AXIS))
    f = jax.jit(lambda x: ppermute_ring_program(x, n, shift),
                in_shardings=rows, out_shardings=rows)
    return f(x)
# [end:jit]


# [start:explicit]
def ppermute_ring_explicit_program(x, n, shift=1):
    # x: f32[n*k@axis, m]. jnp.roll of a sharded dim has no sharding rule on
    # Explicit axes ("slicing on sharded dims ... not implemented"), and the
    # roll is the whole program: auto_axes hands it to the partitioner (one
    # collective-permute, as in the jit form), and out_sharding puts x's
    # layout back in the types. (A shard_map island with ppermute would be
    # the shard_map form again.)
    return jax.sharding.auto_axes(lambda x: ppermute_ring_program(x, n, shift),
                                  out_sharding=jax.typeof(x).sharding)(x)


def ring_shift_explicit(x, mesh, shift=1):
    # mesh: Explicit axes
    n = mesh.shape[AXIS]
    with jax.set_mesh(mesh):
        f = jax.jit(lambda x: jax.sharding.reshard(
            ppermute_ring_explicit_program(x, n, shift), P(AXIS)))
        return f(jax.device_put(x, NamedSharding(mesh, P(AXIS))))
# [end:explicit]


# [start:numpy]
def ppermute_ring_numpy(x, n, shift=1):
    return np.roll(x, shift * (x.shape[0] // n), axis=0)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh((N_DEVICES,), (AXIS,))
    x = np.arange(N_DEVICES * 2, dtype=np.float32).reshape(N_DEVICES * 2, 1)
    want = ppermute_ring_numpy(x, N_DEVICES)
    for form, got in (("pmap", ring_shift_pmap(x, N_DEVICES)),
                      ("shard_map", ring_shift_shard_map(x, mesh)),
                      ("jit", ring_shift_jit(x, mesh)),
                      ("explicit", ring_shift_explicit(
                          x, make_mesh((N_DEVICES,), (AXIS,),
                                       jax.sharding.AxisType.Explicit)))):
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"ring shift ({form} form)")
    there_and_back = ring_shift_shard_map(ring_shift_shard_map(x, mesh, 3), mesh, -3)
    np.testing.assert_array_equal(np.asarray(there_and_back), x)
    # Over a tuple of axes out of mesh order, the ring still follows axis_index:
    # rows sharded over ("j", "i") of a 4x2 mesh, block b on the device with
    # axis_index(("j", "i")) == b.
    mesh_4x2 = make_mesh((4, 2), ("i", "j"))
    np.testing.assert_array_equal(
        np.asarray(ring_shift_shard_map(x, mesh_4x2, axis=("j", "i"))), want)

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
    print("ok: pmap, shard_map, jit and explicit agree with NumPy; shift(+3) then "
          "shift(-3) is the identity; the ring over axes ('j', 'i') follows axis_index")


if __name__ == "__main__":
    main()
