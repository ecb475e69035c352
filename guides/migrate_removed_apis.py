"""Removed parallel APIs that old tutorials teach, and the line to write today.

Tutorials from 2022 to 2024 use APIs that are gone or deprecated on JAX 0.8
and newer. Each "before" below is what such a tutorial writes; each "after"
runs on every JAX from 0.8.0 to the newest, and ``main()`` checks it against
NumPy:

  * ``jax.experimental.maps.xmap`` (removed in JAX 0.4.31): named axes with
    ``axis_resources``. After: ``jax.shard_map`` over a mesh whose axis names
    the collectives use, or ``jax.vmap(..., axis_name=...)`` on one device.
  * ``jax.sharding.PositionalSharding`` (removed in JAX 0.7):
    ``PositionalSharding(devices).reshape(4, 2)``. After:
    ``NamedSharding(mesh, P("a", "b"))`` on a ``("a", "b")`` mesh.
  * ``jax.experimental.pjit.pjit`` (deprecated): after, ``jax.jit`` with the
    same ``in_shardings`` / ``out_shardings``.
  * ``jax.experimental.shard_map.shard_map(f, mesh, ...)`` (deprecated since
    0.8): after, ``jax.shard_map(f, mesh=mesh, ...)``.
  * ``check_rep=False`` (the old shard_map's flag): ``jax.shard_map`` raises
    "unexpected keyword argument 'check_rep'"; after, ``check_vma=False``.
  * ``lax.psend`` / ``lax.precv``: "NotImplementedError: psend is currently
    only implemented on GPU" (deprecated on 0.12). After: ``lax.ppermute``
    with the same (source, destination) pairs.

Which form when: shard_map where the tutorial named axes and wrote
collectives; jit with shardings where it only placed data.

Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: every release 0.8.0 to 0.12.0.1 (docs/compatibility.md).
Run: ``python guides/migrate_removed_apis.py``
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8
GRID = (4, 2)


def make_mesh(shape, names):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def legacy(name):
    """The old API where this JAX still has it, else None."""
    try:
        if name == "pjit":
            from jax.experimental.pjit import pjit
            return pjit
        if name == "experimental_shard_map":
            from jax.experimental.shard_map import shard_map
            return shard_map
        if name == "xmap":
            from jax.experimental.maps import xmap
            return xmap
        if name == "PositionalSharding":
            return jax.sharding.PositionalSharding
        if name == "psend":
            return lax.psend
    except (ImportError, AttributeError):
        return None
    raise ValueError(f"legacy({name!r}): unknown name")


# -- xmap: normalise each column by its sum over all rows ----------------------
# Before (JAX <= 0.4.30):
#   from jax.experimental.maps import xmap
#   f = xmap(lambda row: row / lax.psum(row, "rows"),
#            in_axes=["rows", ...], out_axes=["rows", ...],
#            axis_resources={"rows": "i"})

# [start:shard_map]
def normalise_shard_map(x, mesh):
    # x: f32[n*k, m] rows over "i"; block: f32[k, m] on each device
    def body(block):
        return block / lax.psum(block.sum(0, keepdims=True), "i")

    f = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return jax.jit(f)(x)


def normalise_vmap(x):
    # One device: the named axis of xmap is a named vmap axis.
    return jax.vmap(lambda row: row / lax.psum(row, "rows"), axis_name="rows")(x)


def ring_shift_experimental(x, mesh):
    # Before: the old home and the old flag (deprecated; gone in a later JAX).
    shard_map = legacy("experimental_shard_map")
    f = shard_map(lambda b: lax.ppermute(b, "i", ring(mesh.shape["i"])), mesh,
                  in_specs=P("i"), out_specs=P("i"), check_rep=False)
    return jax.jit(f)(x)


def ring_shift_shard_map(x, mesh, **flags):
    # After: jax.shard_map, keyword mesh, check_vma (check_rep raises).
    f = jax.shard_map(lambda b: lax.ppermute(b, "i", ring(mesh.shape["i"])),
                      mesh=mesh, in_specs=P("i"), out_specs=P("i"), **flags)
    return jax.jit(f)(x)


def send_psend(x, mesh, pairs):
    # Before: psend/precv; NotImplementedError on CPU ("only implemented on GPU").
    def body(block):
        token = lax.psend(block, "i", pairs)
        return lax.precv(token, block, "i", pairs)

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"),
                                 out_specs=P("i"), check_vma=False))(x)


def send_ppermute(x, mesh, pairs):
    # After: ppermute; devices no pair sends to receive zeros.
    f = jax.shard_map(lambda block: lax.ppermute(block, "i", pairs), mesh=mesh,
                      in_specs=P("i"), out_specs=P("i"))
    return jax.jit(f)(x)
# [end:shard_map]


def ring(n):
    return [(s, (s + 1) % n) for s in range(n)]


# [start:jit]
def place_grid(x, mesh):
    # Before: PositionalSharding(jax.devices()).reshape(4, 2); device_put(x, s)
    return jax.device_put(x, NamedSharding(mesh, P("a", "b")))


def sin_keeps_layout(x, mesh):
    return jax.jit(jnp.sin)(place_grid(x, mesh))  # still P("a", "b")


def dot_rows_by_cols(y, z, mesh):
    # y rows over "a" (replicated over "b"), z columns over "b": every device
    # has the rows and columns of its output block, so no communication.
    y = jax.device_put(y, NamedSharding(mesh, P("a", None)))
    z = jax.device_put(z, NamedSharding(mesh, P(None, "b")))
    return jax.jit(jnp.dot)(y, z)


def scale_pjit(x, mesh):
    # Before: pjit (deprecated) with in_shardings / out_shardings.
    rows = NamedSharding(mesh, P("i"))
    return legacy("pjit")(lambda x: 2 * x, in_shardings=rows, out_shardings=rows)(x)


def scale_jit(x, mesh):
    # After: jax.jit takes the same arguments.
    rows = NamedSharding(mesh, P("i"))
    return jax.jit(lambda x: 2 * x, in_shardings=rows, out_shardings=rows)(x)
# [end:jit]


# [start:pmap]
def normalise_pmap(x, n_devices):
    # The legacy form of the same normalisation: x stacked as [n, k, m], one
    # block per device, the column sums combined by psum over "i".
    stacked = x.reshape(n_devices, -1, *x.shape[1:])
    f = jax.pmap(lambda block: block / lax.psum(block.sum(0, keepdims=True), "i"),
                 axis_name="i")
    return np.asarray(f(stacked)).reshape(x.shape)
# [end:pmap]


# [start:numpy]
def normalise_numpy(x):
    return x / x.sum(0, keepdims=True)


def send_numpy(x, n_devices, pairs):
    blocks = x.reshape(n_devices, -1, *x.shape[1:])
    out = np.zeros_like(blocks)
    for src, dst in pairs:
        out[dst] = blocks[src]
    return out.reshape(x.shape)
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh((N_DEVICES,), ("i",))
    grid = make_mesh(GRID, ("a", "b"))
    print(f"JAX {jax.__version__}; still here:",
          [name for name in ("xmap", "PositionalSharding", "pjit",
                             "experimental_shard_map", "psend") if legacy(name)])
    x = np.arange(1.0, 2 * N_DEVICES * 3 + 1, dtype=np.float32).reshape(-1, 3)

    want = normalise_numpy(x)
    np.testing.assert_allclose(np.asarray(normalise_shard_map(x, mesh)), want,
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(normalise_vmap(x)), want, rtol=1e-6)
    np.testing.assert_allclose(normalise_pmap(x, N_DEVICES), want, rtol=1e-6)
    print("xmap -> shard_map / named vmap: column sums",
          np.asarray(normalise_shard_map(x, mesh)).sum(0).tolist())

    square = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    out = sin_keeps_layout(square, grid)
    assert out.sharding.spec == P("a", "b")
    np.testing.assert_allclose(np.asarray(out), np.sin(square), rtol=1e-6)
    prod = dot_rows_by_cols(square, square.T, grid)
    np.testing.assert_allclose(np.asarray(prod), square @ square.T, rtol=1e-6)
    print("PositionalSharding -> NamedSharding: sin keeps", out.sharding.spec,
          "; rows x cols dot gives", prod.sharding.spec)

    np.testing.assert_array_equal(np.asarray(scale_jit(x, mesh)), 2 * x)
    want = send_numpy(x, N_DEVICES, ring(N_DEVICES))
    got = ring_shift_shard_map(x, mesh, check_vma=False)
    np.testing.assert_array_equal(np.asarray(got), want)
    try:
        ring_shift_shard_map(x, mesh, check_rep=False)
        raise AssertionError("jax.shard_map accepted check_rep")
    except TypeError as err:
        print("check_rep ->", err)

    pairs = [(0, 1)]
    np.testing.assert_array_equal(np.asarray(send_ppermute(x, mesh, pairs)),
                                  send_numpy(x, N_DEVICES, pairs))
    if legacy("psend") is not None:
        try:
            send_psend(x, mesh, pairs)
            print("psend/precv -> runs here")
        except NotImplementedError as err:
            print("psend/precv ->", err)
    print("ok: every replacement agrees with NumPy")


if __name__ == "__main__":
    main()
