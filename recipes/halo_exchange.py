"""Halo exchange: a 1-D stencil on an array sharded by rows.

What it shows: the 3-point stencil ``y[r] = x[r-1] - 2 x[r] + x[r+1]`` needs,
on each device, one row from each neighbour. Two ``ppermute``s fetch them
(last row one device forward, first row one device back); then every device
applies the stencil to its padded block alone, and the result matches the
stencil on one device:

  * periodic boundary: the ring wraps round (``x[-1]`` is the last row);
  * open boundary: rows beyond the ends are zero. The ppermute simply has no
    pair for the end devices, and a device that receives nothing gets zeros.

Which form when: shard_map to control the exchange (wider halos, several
stencil steps per exchange); jit for the global program with ``jnp.roll``
(XLA emits the same two collective-permutes; for the open boundary mask the
wrapped row rather than ``jnp.pad`` + slices, which XLA:CPU compiles to many
more permutes); explicit for that global program on Explicit axes, its halo
(the rolls and the open boundary's mask) in an ``auto_axes`` island (a roll
of a sharded dim has no sharding rule there): the same two
collective-permutes; pmap as the legacy form.

The per-device bodies, the global programs and the NumPy oracles below are
the ones ``collectives.RECIPES["halo_exchange"]`` (periodic) and
``"halo_exchange_open"`` run: ``axis`` may be one mesh axis name or a tuple
of them, ``halo_exchange`` takes any ``width``, and the legacy pmap form of
a 2-D mesh (``pmap`` of ``vmap``) passes ``shift=stepwise_shift``.

Registered as: ``collectives.RECIPES["halo_exchange"]``,
``collectives.RECIPES["halo_exchange_open"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/halo_exchange.py``
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


def make_mesh(n_devices, axis_type=jax.sharding.AxisType.Auto):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from
    # 0.9) unless told otherwise; the explicit form asks for Explicit ones.
    return jax.make_mesh((n_devices,), (AXIS,), axis_types=(axis_type,))


# [start:shift]
def line_shift(x, axis=AXIS, shift=1, periodic=True):
    # Device d (numbered as lax.axis_index(axis) numbers it) receives the block
    # of device d - shift. On an open line (periodic=False) no pair sends to
    # the devices at the ends: ppermute gives them zeros.
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    sizes = [lax.axis_size(name) for name in names]
    n = math.prod(sizes)
    pairs = [(d, (d + shift) % n) for d in range(n)
             if periodic or 0 <= d + shift < n]
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


def stepwise_shift(x, axis=AXIS, shift=1, periodic=True):
    # line_shift by +1 or -1 with one ppermute per mesh axis: vmap batches a
    # ppermute over one axis only, so pmap(vmap(...)) needs this. Shift round
    # the last (minor) axis; where that wrapped round, take the block one more
    # step along the next axis out. An open line then zeroes what wrapped
    # round the whole axis.
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    out = line_shift(x, names[-1], shift)

    def at_edge(name):  # this device received a block that wrapped round `name`
        return lax.axis_index(name) == (0 if shift == 1 else lax.axis_size(name) - 1)

    wrapped = at_edge(names[-1])
    for name in reversed(names[:-1]):
        out = jnp.where(wrapped, line_shift(out, name, shift), out)
        wrapped = wrapped & at_edge(name)
    return out if periodic else jnp.where(wrapped, jnp.zeros_like(out), out)
# [end:shift]


# [start:body]
def halo_exchange(block, axis=AXIS, width=1, periodic=True, shift=line_shift):
    # block: [k, ...] -> [width + k + width, ...] with the neighbours' edge rows
    first, last = block[:width], block[block.shape[0] - width:]
    from_left = shift(last, axis, 1, periodic)  # last rows go one device forward
    from_right = shift(first, axis, -1, periodic)  # first rows go one device back
    return jnp.concatenate([from_left, block, from_right])


def stencil(padded):
    # padded: [1 + k + 1, ...] -> [k, ...]: the 3-point second difference
    return padded[:-2] - 2 * padded[1:-1] + padded[2:]


def stencil_body(block, axis=AXIS, periodic=True, shift=line_shift):
    # block: [k, m] -> [k, m], no communication after the exchange
    return stencil(halo_exchange(block, axis, 1, periodic, shift))
# [end:body]


# [start:pmap]
def stencil_pmap(x, n_devices, periodic):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, k, m]
    # stepwise_shift is the shift pmap(vmap(...)) over a 2-D mesh needs; over
    # one axis it is line_shift
    f = jax.pmap(lambda b: stencil_body(b, AXIS, periodic, shift=stepwise_shift),
                 axis_name=AXIS)
    return np.asarray(f(stacked)).reshape(x.shape)
# [end:pmap]


# [start:shard_map]
def stencil_shard_map(x, mesh, periodic):
    def per_device(block):
        # block: [k, m] -> [k, m]
        return stencil_body(block, AXIS, periodic)

    f = jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def neighbour_rows(x, periodic=True):
    # x: [n*k, m] global -> the row above and the row below each row; the
    # rolls of a sharded dim become collective-permutes
    above, below = jnp.roll(x, 1, axis=0), jnp.roll(x, -1, axis=0)
    if not periodic:  # zero the rows that wrapped round
        index = jnp.arange(x.shape[0]).reshape((-1,) + (1,) * (x.ndim - 1))
        above = jnp.where(index == 0, jnp.zeros_like(x), above)
        below = jnp.where(index == x.shape[0] - 1, jnp.zeros_like(x), below)
    return above, below


def stencil_program(x, periodic=True, neighbours=neighbour_rows):
    # x: [n*k, m] global -> [n*k, m]
    above, below = neighbours(x, periodic)
    return above - 2 * x + below


def stencil_jit(x, mesh, periodic):
    rows = NamedSharding(mesh, P(AXIS))
    return jax.jit(lambda x: stencil_program(x, periodic), in_shardings=rows,
                   out_shardings=rows)(x)
# [end:jit]


# [start:explicit]
def neighbour_rows_in_auto_island(x, periodic=True):
    # jnp.roll of a sharded dim has no sharding rule on Explicit axes
    # ("slicing on sharded dims ... not implemented"), nor has the open
    # boundary's mask (a replicated row index against sharded rows).
    # auto_axes hands the halo alone to the partitioner, which makes each
    # roll a collective-permute as in the jit form, and out_sharding puts x's
    # layout back in the types. (A shard_map island with ppermute would be
    # the shard_map form again.)
    layout = jax.typeof(x).sharding
    return jax.sharding.auto_axes(lambda x: neighbour_rows(x, periodic),
                                  out_sharding=(layout, layout))(x)


def stencil_explicit_program(x, periodic=True):
    # x: f32[n*k@axis, m]: the jit form's program with its halo in an Auto
    # island; the stencil arithmetic stays Explicit.
    return stencil_program(x, periodic, neighbours=neighbour_rows_in_auto_island)


def stencil_explicit(x, mesh, periodic):
    # mesh: Explicit axes
    with jax.set_mesh(mesh):
        f = jax.jit(lambda x: jax.sharding.reshard(
            stencil_explicit_program(x, periodic), P(AXIS)))
        return f(jax.device_put(x, NamedSharding(mesh, P(AXIS))))
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


def stencil_numpy(x, periodic=True):
    mode = "wrap" if periodic else "constant"
    padded = np.pad(wide(x), [(1, 1)] + [(0, 0)] * (x.ndim - 1), mode=mode)
    return stencil(padded).astype(x.dtype)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    explicit_mesh = make_mesh(N_DEVICES, jax.sharding.AxisType.Explicit)
    # x[r] = (r + 1)**2: the second difference is 2 inside; the ends show
    # the boundary
    x = (np.arange(1, N_DEVICES * 2 + 1, dtype=np.float32) ** 2)[:, None]
    for periodic in (True, False):
        want = stencil_numpy(x, periodic)
        for form, got in (("pmap", stencil_pmap(x, N_DEVICES, periodic)),
                          ("shard_map", stencil_shard_map(x, mesh, periodic)),
                          ("jit", stencil_jit(x, mesh, periodic)),
                          ("explicit", stencil_explicit(x, explicit_mesh, periodic))):
            np.testing.assert_array_equal(np.asarray(got), want,
                                          err_msg=f"periodic={periodic} ({form})")
        name = "periodic" if periodic else "open    "
        print(f"{name}: {np.asarray(want).ravel().astype(int).tolist()}")
    print("(x = 1, 4, 9, .., 256: inside, (r-1)^2 - 2 r^2 + (r+1)^2 = 2; the first "
          "row is 256 - 2 + 4 = 258 periodic, 0 - 2 + 4 = 2 open; the last is "
          "225 - 512 + 1 = -286 periodic, 225 - 512 + 0 = -287 open)")
    print("ok: pmap, shard_map, jit and explicit halo-exchange stencils equal the "
          "single-device NumPy stencil, periodic and open")


if __name__ == "__main__":
    main()
