"""All-to-all, exchange form: device d sends chunk j of its block to device j.

What it shows: with ``split_axis=0, concat_axis=0, tiled=True`` each device
cuts its block ``[n*c, ...]`` into ``n`` chunks along dim 0, sends chunk
``j`` to device ``j`` and concatenates what it receives, in device order,
along dim 0. Every device keeps one chunk and swaps the other ``n - 1``: an
``n x n`` transpose of chunks across devices. It is the form of JAX's
shard_map tutorial and of every mixture-of-experts dispatch (chunk ``j``
holds the tokens bound for the experts on device ``j``); applied twice it
gives back the input.

In the global view the array ``[n*n*c, ...]``, seen as ``[n (source), n
(chunk), c, ...]``, has its first two axes swapped; the layout (sharded by
dim 0) stays the same.

Which form when: shard_map inside a per-device program (MoE dispatch and
combine); jit when the global transpose is what you mean (XLA emits the same
one all-to-all); explicit to say the move in the types: reshapes that name
where the chunks live (``lax.reshape(..., out_sharding=)``: a sharded dim
does not split silently) and one ``reshard`` from source to chunk, which
compiles to the same one all-to-all; pmap as the legacy form.

The per-device body, the global program and the NumPy oracle below are the
ones ``collectives.RECIPES["all_to_all_blocks"]`` runs: ``axis`` may be one
mesh axis name or a tuple of them (devices counted row-major over them), and
dims after the first ride along.

Registered as: ``collectives.RECIPES["all_to_all_blocks"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/all_to_all_blocks.py``
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


def make_mesh(n_devices, axis_type=jax.sharding.AxisType.Auto):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from
    # 0.9) unless told otherwise; the explicit form asks for Explicit ones.
    return jax.make_mesh((n_devices,), (AXIS,), axis_types=(axis_type,))


# [start:body]
def all_to_all_blocks_body(x, axis=AXIS):
    # x: [n*c, ...] on each device -> [n*c, ...]; chunk d of the result is
    # device d's chunk `me` (this device's index along `axis`)
    return lax.all_to_all(x, axis, split_axis=0, concat_axis=0, tiled=True)
# [end:body]


# [start:pmap]
def all_to_all_blocks_pmap(x, n_devices):
    stacked = x.reshape(n_devices, -1, *x.shape[1:])  # [n, n*c, ...]
    out = jax.pmap(all_to_all_blocks_body, axis_name=AXIS)(stacked)
    return np.asarray(out).reshape(x.shape)
# [end:pmap]


# [start:shard_map]
def all_to_all_blocks_shard_map(x, mesh):
    f = jax.jit(jax.shard_map(all_to_all_blocks_body, mesh=mesh, in_specs=P(AXIS),
                              out_specs=P(AXIS)))
    return f(x)
# [end:shard_map]


# [start:jit]
def all_to_all_blocks_program(x, n):
    # x: [n*n*c, ...] sharded by dim 0, seen as [source, chunk, c, ...]: swap
    # source and chunk. The layout stays, so jit moves chunk j of every block
    # to device j: one all-to-all.
    chunks = x.reshape(n, n, x.shape[0] // (n * n), *x.shape[1:])
    return jnp.swapaxes(chunks, 0, 1).reshape(x.shape)


def all_to_all_blocks_jit(x, mesh):
    n = mesh.shape[AXIS]
    sharding = NamedSharding(mesh, P(AXIS))
    return jax.jit(lambda x: all_to_all_blocks_program(x, n),
                   in_shardings=sharding, out_shardings=sharding)(x)
# [end:jit]


# [start:explicit]
def all_to_all_blocks_explicit_program(x, n):
    # x: [n*n*c@axis, ...]: the layout is in the type; read it there.
    spec = tuple(jax.typeof(x).sharding.spec)
    rows, *rest = spec + (None,) * (x.ndim - len(spec))
    c = x.shape[0] // (n * n)
    # Splitting a sharded dim: say where the pieces live (the source dim keeps
    # the axis, each device its own block). No data moves.
    chunks = lax.reshape(x, (n, n, c, *x.shape[1:]),
                         out_sharding=P(rows, None, None, *rest))
    swapped = jnp.swapaxes(chunks, 0, 1)  # [chunk, source@axis, c, ...]
    # The all-to-all, in the types: the sharding moves from source to chunk.
    moved = jax.sharding.reshard(swapped, P(rows, None, None, *rest))
    return lax.reshape(moved, x.shape, out_sharding=P(rows, *rest))


def all_to_all_blocks_explicit(x, mesh):
    # mesh: Explicit axes
    n = mesh.shape[AXIS]
    with jax.set_mesh(mesh):
        f = jax.jit(lambda x: jax.sharding.reshard(
            all_to_all_blocks_explicit_program(x, n), P(AXIS)))
        return f(jax.device_put(x, NamedSharding(mesh, P(AXIS))))
# [end:explicit]


# [start:numpy]
def all_to_all_blocks_numpy(x, n):
    x = np.asarray(x)
    chunks = x.reshape(n, n, x.shape[0] // (n * n), *x.shape[1:])
    return np.swapaxes(chunks, 0, 1).reshape(x.shape).copy()
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    n = N_DEVICES
    # 1-D input of n*n*c elements, c = 2: device d holds 100*d + 0..15
    x = (100 * np.repeat(np.arange(n), n * 2) + np.tile(np.arange(n * 2), n)
         ).astype(np.int32)
    want = all_to_all_blocks_numpy(x, n)
    for form, got in (("pmap", all_to_all_blocks_pmap(x, n)),
                      ("shard_map", all_to_all_blocks_shard_map(x, mesh)),
                      ("jit", all_to_all_blocks_jit(x, mesh)),
                      ("explicit", all_to_all_blocks_explicit(
                          x, make_mesh(n, jax.sharding.AxisType.Explicit)))):
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"all_to_all_blocks ({form} form)")
    twice = all_to_all_blocks_shard_map(all_to_all_blocks_shard_map(x, mesh), mesh)
    np.testing.assert_array_equal(np.asarray(twice), x)
    print("device 1 before:", x[2 * n:4 * n].tolist())
    print("device 1 after: ", want[2 * n:4 * n].tolist())
    print("  (chunk 1 of every device d, in device order: 100*d + 2, 100*d + 3)")
    print("ok: pmap, shard_map, jit and explicit agree with NumPy; the exchange "
          "applied twice restores the input")


if __name__ == "__main__":
    main()
