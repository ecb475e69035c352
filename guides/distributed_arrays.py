"""Distributed arrays: layouts that jit keeps, constraints, committed arrays.

What it shows, on a 4 x 2 grid of devices (mesh axes ``"a"`` and ``"b"``):

  * ``jax.device_put(x, NamedSharding(mesh, P("a", "b")))`` splits a
    [64, 32] array into [16, 16] blocks, one per device.
  * Elementwise functions keep the layout: ``jnp.sin(x)`` is sharded the same
    way, with no communication.
  * ``jnp.dot(y, z)`` with ``y`` split by rows over ``"a"`` (whole along
    ``"b"``) and ``z`` split by columns over ``"b"`` needs no communication
    either: device (a, b) multiplies row block a by column block b, and the
    result comes out as ``P("a", "b")``. ``main()`` checks the compiled
    program has no collective in it.
  * ``lax.with_sharding_constraint`` inside jit forces an intermediate into a
    layout (here ``P("b", "a")``, or replicated ``P()``); XLA inserts the
    collectives that get it there (all-gathers for ``P()``).
  * Committed arrays (placed with ``jax.device_put`` on a device or a
    sharding) must agree on their devices: mixing arrays committed to
    different devices, or to the same devices in a different order, raises
    ``ValueError: Received incompatible devices for jitted computation``.
    Uncommitted arrays (``jnp.zeros``, ``jnp.arange``, results of them) move
    to wherever the committed operand is.

Which form when: jit with shardings is the natural form here (global arrays,
the compiler keeps or changes layouts); shard_map when you want to write the
per-block product yourself; pmap (the legacy form) needs the blocks stacked
by hand, one per device. Timing one device against eight means nothing on
simulated CPU devices; see the benchmarks page for what the collectives cost.

Devices: 8 (simulated on CPU by ``main()``), as a 4 x 2 mesh.
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python guides/distributed_arrays.py``
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
COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                  "collective-permute")


def make_mesh(shape=GRID, names=("a", "b"), devices=None):
    # Auto axes on every JAX version (jax.make_mesh gives Explicit from 0.9).
    return jax.make_mesh(shape, names, devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def collectives_in(fn, *args):
    """The collective ops in ``fn``'s compiled program, by their HLO names."""
    text = fn.lower(*args).compile().as_text()
    return [op for op in COLLECTIVE_OPS if op in text]


# [start:layout]
def place_grid(x, mesh):
    # x: [64, 32] -> a [16, 16] block on each of the 4 x 2 devices
    return jax.device_put(x, NamedSharding(mesh, P("a", "b")))


def block_shapes(x):
    return {shard.device.id: shard.data.shape for shard in x.addressable_shards}


def sin_keeps_layout(x):
    y = jnp.sin(x)  # elementwise: each device works on its own block
    return y, y.sharding.is_equivalent_to(x.sharding, x.ndim)
# [end:layout]


# [start:pmap]
def dot_pmap(y, z):
    # The legacy form: stack the blocks by hand.
    # y: [4k, d] -> [4, 1, k, d] (row block a, the same for both b);
    # z: [d, 2c] -> [1, 2, d, c] (column block b, the same for every a)
    (a, b), k, c = GRID, y.shape[0] // GRID[0], z.shape[1] // GRID[1]
    ys = np.broadcast_to(y.reshape(a, 1, k, -1), (a, b, k, y.shape[1]))
    zs = np.broadcast_to(z.reshape(-1, b, c).transpose(1, 0, 2)[None],
                         (a, b, z.shape[0], c))
    f = jax.pmap(jax.vmap(jnp.dot, axis_name="b"), axis_name="a")
    out = np.asarray(f(ys, zs))  # [4, 2, k, c]: block (a, b) of the product
    return out.transpose(0, 2, 1, 3).reshape(a * k, b * c)
# [end:pmap]


# [start:shard_map]
def dot_shard_map(y, z, mesh):
    # y_block: [k, d] (rows a), z_block: [d, c] (columns b) -> [k, c]
    f = jax.shard_map(jnp.dot, mesh=mesh,
                      in_specs=(P("a", None), P(None, "b")),
                      out_specs=P("a", "b"))
    return jax.jit(f)(y, z)
# [end:shard_map]


# [start:jit]
def place_for_dot(y, z, mesh):
    # y by rows over "a", whole along "b"; z by columns over "b"
    return (jax.device_put(y, NamedSharding(mesh, P("a", None))),
            jax.device_put(z, NamedSharding(mesh, P(None, "b"))))


def dot_jit(y, z):
    # y, z placed by place_for_dot: the layouts say it all
    return jax.jit(jnp.dot)(y, z)
# [end:jit]


# [start:constraint]
def sin_then_transposed_layout(mesh):
    @jax.jit
    def f(x):
        h = jnp.sin(x)
        # Force the intermediate into P("b", "a"): rows over "b",
        # columns over "a". XLA moves the blocks to get there.
        h = lax.with_sharding_constraint(h, NamedSharding(mesh, P("b", "a")))
        return 2 * h

    return f


def sin_then_replicated(mesh):
    @jax.jit
    def f(x):
        h = lax.with_sharding_constraint(jnp.sin(x), NamedSharding(mesh, P()))
        return 2 * h  # every device computes the whole result

    return f
# [end:constraint]


# [start:committed]
def mix_committed(x, devices):
    # Committed to device 0 and to device 1: jit refuses to guess
    a = jax.device_put(x, devices[0])
    b = jax.device_put(x, devices[1])
    try:
        return a + b
    except ValueError as error:
        return error


def mix_device_orders(x, devices):
    # The same 8 devices in two orders: also incompatible
    forward = NamedSharding(make_mesh((8,), ("i",), devices), P("i"))
    backward = NamedSharding(make_mesh((8,), ("i",), devices[::-1]), P("i"))
    try:
        return jax.device_put(x, forward) + jax.device_put(x, backward)
    except ValueError as error:
        return error


def mix_uncommitted(x, devices):
    # jnp.zeros is uncommitted: it follows the committed operand
    b = jax.device_put(x, devices[1])
    out = jnp.zeros(x.shape, x.dtype) + b
    return out, b.committed, jnp.zeros(1).committed
# [end:committed]


# [start:numpy]
def dot_numpy(y, z):
    return y.astype(np.float64) @ z.astype(np.float64)


def sin_numpy(x):
    return np.sin(x.astype(np.float64))
# [end:numpy]


def example_data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    # Small integers: the products and their sums are exact in float32.
    y = rng.integers(-4, 5, size=(64, 32)).astype(np.float32)
    z = rng.integers(-4, 5, size=(32, 16)).astype(np.float32)
    return x, y, z


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh()
    x, y, z = example_data()

    xs = place_grid(x, mesh)
    shapes = set(block_shapes(xs).values())
    sin, same_layout = sin_keeps_layout(xs)
    assert shapes == {(16, 16)} and same_layout
    np.testing.assert_allclose(np.asarray(sin), sin_numpy(x), rtol=1e-6, atol=1e-6)
    print(f"x: float32{list(x.shape)} as P('a', 'b') on a 4 x 2 mesh: blocks "
          f"{shapes.pop()}; jnp.sin keeps the layout: {same_layout}")

    yp, zp = place_for_dot(y, z, mesh)
    want = dot_numpy(y, z)
    results = {"pmap": dot_pmap(y, z), "shard_map": dot_shard_map(y, z, mesh),
               "jit": dot_jit(yp, zp)}
    for form, got in results.items():
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=form)
    found = collectives_in(jax.jit(jnp.dot), yp, zp)
    assert not found, found
    print(f"dot(rows over a, columns over b) -> {results['jit'].sharding.spec}, "
          f"collectives in the compiled program: {found or 'none'}")

    transposed = sin_then_transposed_layout(mesh)(xs)
    replicated_fn = sin_then_replicated(mesh)
    replicated = replicated_fn(xs)
    for got in (transposed, replicated):
        np.testing.assert_allclose(np.asarray(got), 2 * sin_numpy(x),
                                   rtol=1e-6, atol=1e-6)
    print(f"with_sharding_constraint: {transposed.sharding.spec}; "
          f"{replicated.sharding.spec} needs {collectives_in(replicated_fn, xs)}")

    devices = jax.devices()
    error = mix_committed(x[:4, :4], devices)
    assert isinstance(error, ValueError), error
    assert isinstance(mix_device_orders(x[:8, :4], devices[:8]), ValueError)
    out, committed, zeros_committed = mix_uncommitted(x[:4, :4], devices)
    assert out.devices() == {devices[1]} and committed and not zeros_committed
    print(f"committed to devices 0 and 1: ValueError: {str(error)[:52]}...")
    print(f"uncommitted jnp.zeros + array on device 1 -> on {out.devices()}")
    print("ok: pmap, shard_map and jit agree with NumPy; layouts, constraints "
          "and committed arrays behave as described")


if __name__ == "__main__":
    main()
