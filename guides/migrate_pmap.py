"""Migrating from pmap: each idiom of JAX's migration guide, before and after.

What it shows: the legacy pmap code ("before") next to the code that
replaces it ("after"), one pair per idiom, each pair computing the same
numbers (``main()`` checks every one against NumPy):

  * ``in_axes=None``, an argument every device gets whole: an ``in_specs``
    entry ``P()``.
  * ``out_axes=None``, an output every device holds: ``out_specs=P()``, which
    shard_map checks; pmap returns device 0's copy without checking.
  * Nested pmap: it raises from JAX 0.8 on. The legacy workaround maps the
    inner axis with ``vmap(axis_name=...)``; the replacement is one shard_map
    over a 2-D mesh.
  * ``jax.device_put_sharded`` / ``jax.device_put_replicated`` (deprecated in
    0.8.1, gone by 0.10): stacked arrays with a device axis. Replacement:
    ``jax.device_put(x, NamedSharding(mesh, P("i")))`` and ``P()``, no
    stacking.
  * ``unreplicate`` (copy 0 of stacked per-device copies): nothing to do; a
    ``P()`` result is the value itself.
  * ``donate_argnums``: the same argument, on the ``jax.jit`` around the
    shard_map (or around the global program).

The training step also shows where the gradient goes: pmap code takes
``grad`` inside the body and ``pmean``s it; in shard_map with replicated
parameters that would be n times too large, so the "after" takes ``grad``
of the shard_map'ed loss (docs: Sharp edges, 3).

Which form when: shard_map when you port per-device code and want its
collectives; jit when the global program says it all (here: every idiom but
the explicit ``psum`` over one axis of the mesh).

Devices: 8 (simulated on CPU by ``main()``): a 1-D mesh of 8 and a 4 x 2 mesh.
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python guides/migrate_pmap.py``
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8
GRID = (4, 2)
LR = 0.05


def make_mesh(shape, names):
    # Auto axes on every JAX version (jax.make_mesh gives Explicit from 0.9).
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def local_loss(params, x, y):
    # x: [k, d], y: [k] on each device (or the whole batch) -> mean squared error
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def update(params, grads):
    return jax.tree.map(lambda p, g: p - LR * g, params, grads)


# [start:pmap]
def scale_pmap(w, x):
    # in_axes=None: w [m] goes whole to every device
    xs = x.reshape(N_DEVICES, -1, x.shape[1])  # [n, k, m]
    ys = jax.pmap(lambda w, b: b * w[None], axis_name="i",
                  in_axes=(None, 0))(w, xs)
    return ys.reshape(x.shape)


def total_pmap(x):
    # out_axes=None: one copy back (device 0's),
    # NOT checked to be the same everywhere
    xs = x.reshape(N_DEVICES, -1, x.shape[1])
    return jax.pmap(lambda b: lax.psum(b.sum(0), "i"),
                    axis_name="i", out_axes=None)(xs)


def grid_sums_pmap(x):
    # x: [4k, 2m] -> [4, 2, k, m]: block (i, j)
    a, b = GRID
    k, m = x.shape[0] // a, x.shape[1] // b
    blocks = x.reshape(a, k, b, m).transpose(0, 2, 1, 3)

    def per_device(blk):
        return lax.psum(blk, "j"), lax.psum(blk, ("i", "j"))

    # pmap(pmap(...)) raises from JAX 0.8 on: vmap
    # names the inner axis instead
    f = jax.pmap(jax.vmap(per_device, axis_name="j"), axis_name="i")
    rows, total = f(blocks)  # [4, 2, k, m] each
    return np.asarray(rows)[:, 0].reshape(a * k, m), np.asarray(total)[0, 0]


def nested_pmap_error(x):
    a, b = GRID
    blocks = x.reshape(a, x.shape[0] // a, b, -1).transpose(0, 2, 1, 3)
    inner = jax.pmap(lambda blk: lax.psum(blk, "j"), axis_name="j")
    try:
        jax.pmap(inner, axis_name="i")(blocks)
    except ValueError as error:
        return error
    return None


def legacy_device_put_sharded(shards, devices):
    # What jax.device_put_sharded returned: the shards
    # stacked on a new axis, one per device
    mesh = jax.make_mesh((len(devices),), ("i",), devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,))
    stacked = jax.tree.map(lambda *s: np.stack(s), *shards)
    return jax.device_put(stacked, NamedSharding(mesh, P("i")))


def legacy_device_put_replicated(x, devices):
    # jax.device_put_replicated: n stacked copies,
    # sharded over the devices (not replicated)
    return legacy_device_put_sharded([x] * len(devices), devices)


def unreplicate(tree):
    # flax.jax_utils.unreplicate: copy 0 of each leaf
    return jax.tree.map(lambda x: x[0], tree)


def make_step_pmap():
    def step(params, xb, yb):
        grads = jax.grad(local_loss)(params, xb, yb)
        return update(params, lax.pmean(grads, "i"))

    return jax.pmap(step, axis_name="i", donate_argnums=(0,))


def train_pmap(params, x, y, steps):
    devices = jax.devices()[:N_DEVICES]
    params = legacy_device_put_replicated(params, devices)
    xs = legacy_device_put_sharded(np.split(x, N_DEVICES), devices)
    ys = legacy_device_put_sharded(np.split(y, N_DEVICES), devices)
    step = make_step_pmap()
    for _ in range(steps):
        params = step(params, xs, ys)  # donated
    return unreplicate(params)
# [end:pmap]


# [start:shard_map]
def scale_shard_map(w, x, mesh):
    # in_specs P(): w whole on every device
    f = jax.shard_map(lambda w, b: b * w[None], mesh=mesh,
                      in_specs=(P(), P("i")),
                      out_specs=P("i"))
    return jax.jit(f)(w, x)


def total_shard_map(x, mesh):
    # out_specs P(): replicated, and shard_map
    # checks it (psum's result is invariant)
    f = jax.shard_map(lambda b: lax.psum(b.sum(0), "i"),
                      mesh=mesh, in_specs=P("i"),
                      out_specs=P())
    return jax.jit(f)(x)


def grid_sums_shard_map(x, mesh2d):
    # One shard_map over the 4 x 2 mesh: block (i, j)
    # on device (i, j); collectives name either axis
    def per_device(blk):
        return lax.psum(blk, "j"), lax.psum(blk, ("i", "j"))

    f = jax.shard_map(per_device, mesh=mesh2d,
                      in_specs=P("i", "j"),
                      out_specs=(P("i"), P()))
    return jax.jit(f)(x)


def place(params, x, y, mesh):
    # was device_put_replicated / device_put_sharded
    replicated = NamedSharding(mesh, P())
    rows = NamedSharding(mesh, P("i"))
    return (jax.device_put(params, replicated),
            jax.device_put(x, rows), jax.device_put(y, rows))


def make_step_shard_map(mesh):
    loss = jax.shard_map(
        lambda p, xb, yb: lax.pmean(local_loss(p, xb, yb), "i"),
        mesh=mesh, in_specs=(P(), P("i"), P("i")), out_specs=P())

    @functools.partial(jax.jit, donate_argnums=(0,))
    def step(params, x, y):
        # grad OUTSIDE the shard_map: with params P(), grad
        # inside + pmean would be n times too large
        return update(params, jax.grad(loss)(params, x, y))

    return step


def train_shard_map(params, x, y, mesh, steps):
    params, x, y = place(params, x, y, mesh)
    step = make_step_shard_map(mesh)
    for _ in range(steps):
        params = step(params, x, y)  # donated
    return params  # replicated: nothing to unreplicate
# [end:shard_map]


# [start:jit]
def scale_jit(w, x, mesh):
    f = jax.jit(lambda w, x: x * w[None],
                in_shardings=(NamedSharding(mesh, P()),
                              NamedSharding(mesh, P("i"))))
    return f(w, x)


def total_jit(x, mesh):
    f = jax.jit(lambda x: x.sum(0),
                in_shardings=NamedSharding(mesh, P("i")),
                out_shardings=NamedSharding(mesh, P()))
    return f(x)


def make_step_jit():
    @functools.partial(jax.jit, donate_argnums=(0,))
    def step(params, x, y):
        return update(params, jax.grad(local_loss)(params, x, y))

    return step


def train_jit(params, x, y, mesh, steps):
    params, x, y = place(params, x, y, mesh)
    step = make_step_jit()
    for _ in range(steps):
        params = step(params, x, y)
    return params
# [end:jit]


# [start:numpy]
def scale_numpy(w, x):
    return x * w


def total_numpy(x):
    return x.astype(np.float64).sum(0)


def grid_sums_numpy(x):
    a, b = GRID
    k, m = x.shape[0] // a, x.shape[1] // b
    blocks = x.astype(np.float64).reshape(a, k, b, m)
    return blocks.sum(2).reshape(a * k, m), blocks.sum((0, 2))


def train_numpy(params, x, y, steps):
    w = np.asarray(params["w"], np.float64)
    b = float(params["b"])
    x, y = x.astype(np.float64), y.astype(np.float64)
    for _ in range(steps):
        r = x @ w + b - y
        w, b = w - LR * 2 * x.T @ r / len(y), b - LR * 2 * r.mean()
    return {"b": b, "w": w}
# [end:numpy]


def example_data(seed=0):
    rng = np.random.default_rng(seed)
    # Small integers: exact in float32, so the data-movement pairs match bit
    # for bit; training sums floats in different orders (rtol below).
    x = rng.integers(-4, 5, size=(N_DEVICES * 2, 4)).astype(np.float32)
    w = rng.integers(-2, 3, size=(4,)).astype(np.float32)
    features = rng.normal(size=(N_DEVICES * 4, 3)).astype(np.float32)
    targets = (features @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)
    params = {"b": np.float32(0.0), "w": np.zeros(3, np.float32)}
    return x, w, features, targets, params


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh((N_DEVICES,), ("i",))
    mesh2d = make_mesh(GRID, ("i", "j"))
    x, w, features, targets, params = example_data()
    same = np.testing.assert_array_equal
    close = functools.partial(np.testing.assert_allclose, rtol=2e-5, atol=2e-6)

    want = scale_numpy(w, x)
    for got in (scale_pmap(w, x), scale_shard_map(w, x, mesh), scale_jit(w, x, mesh)):
        same(np.asarray(got), want)
    print("in_axes=None -> in_specs P():          pmap == shard_map == jit == NumPy")

    want = total_numpy(x)
    for got in (total_pmap(x), total_shard_map(x, mesh), total_jit(x, mesh)):
        same(np.asarray(got), want)
    print("out_axes=None -> out_specs P():        column sums", want.tolist())

    error = nested_pmap_error(x)
    assert error is not None, "nested pmap ran: this JAX still supports it"
    print(f"nested pmap: {type(error).__name__}: {str(error)[:60]}...")
    rows_want, total_want = grid_sums_numpy(x)
    for rows, total in (grid_sums_pmap(x), grid_sums_shard_map(x, mesh2d)):
        same(np.asarray(rows), rows_want)
        same(np.asarray(total), total_want)
    print("nested pmap -> 4 x 2 mesh:             pmap(vmap) == shard_map == NumPy")

    steps = 20
    want = train_numpy(params, features, targets, steps)
    results = {"pmap": train_pmap(params, features, targets, steps),
               "shard_map": train_shard_map(params, features, targets, mesh, steps),
               "jit": train_jit(params, features, targets, mesh, steps)}
    for form, got in results.items():
        for leaf in ("w", "b"):
            close(np.asarray(got[leaf]), want[leaf], err_msg=f"{form} {leaf}")
    print(f"device_put_replicated/sharded, unreplicate, donate_argnums: "
          f"{steps} SGD steps, w = {np.round(want['w'], 4).tolist()}")
    print("ok: every pmap idiom and its replacement agree with NumPy")


if __name__ == "__main__":
    main()
