"""Sharp edge: sharded random numbers, partitionable vs non-partitionable threefry.

What it shows (pitfall 8): ``jax.jit(lambda key, x: x + uniform(key,
x.shape))`` on a sharded ``x``. With ``jax_threefry_partitionable`` on (the
default since JAX 0.5) each device generates its own slice: the compiled
program has no collective. With it off (the old stream) the compiled program
contains ``collective-permute`` ops (and all-gathers) to build the same bits
everywhere. The two settings give **different values** for the same key, so
numbers saved before an upgrade (or by code that turns the flag off) do not
reproduce after it. Both streams are independent of the sharding: sharded and
single-device generation agree under either setting.

Fix: keep the default (partitionable) stream; if old numbers must be
reproduced, set the flag only around that code, with
``jax.threefry_partitionable(False)`` as a context manager. In shard_map,
derive per-device keys with ``jax.random.fold_in(key, lax.axis_index(...))``.

Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0 (same values and ops on all three).
Run: ``python guides/sharp_edges_rng.py``
"""

import os

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), ("i",),
                         axis_types=(jax.sharding.AxisType.Auto,))


def count_ops(compiled_text, opcode):
    # HLO instructions look like `%name = f32[3]{0} collective-permute(...)`.
    return sum(compiled_text.count(f" {opcode}{suffix}(")
               for suffix in ("", "-start"))


# [start:pmap]
def noise_pmap(key, x, n_devices):
    # The legacy idiom: one key per device, split on the host.
    keys = jax.random.split(key, n_devices)
    stacked = x.reshape(n_devices, -1)
    f = jax.pmap(lambda k, b: b + jax.random.uniform(k, b.shape), axis_name="i")
    return np.asarray(f(keys, stacked)).reshape(x.shape)
# [end:pmap]


# [start:shard_map]
def noise_shard_map(key, x, mesh):
    # Per-device streams: fold the device index into the key.
    def per_device(key, block):
        k = jax.random.fold_in(key, lax.axis_index("i"))
        return block + jax.random.uniform(k, block.shape)

    f = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("i")),
                      out_specs=P("i"))
    return jax.jit(f)(key, x)
# [end:shard_map]


# [start:jit]
def noise_jit(key, x, mesh, partitionable=True):
    # The global program; the flag decides how XLA generates the bits.
    rows = NamedSharding(mesh, P("i"))
    with jax.threefry_partitionable(partitionable):
        f = jax.jit(lambda key, x: x + jax.random.uniform(key, x.shape),
                    out_shardings=rows)
        x = jax.device_put(x, rows)
        text = f.lower(key, x).compile().as_text()
        return np.asarray(f(key, x)), count_ops(text, "collective-permute")
# [end:jit]


# [start:numpy]
def noise_numpy(key, x, partitionable=True):
    # The oracle: the same stream drawn on one device, added on the host.
    with jax.threefry_partitionable(partitionable):
        u = np.asarray(jax.device_get(jax.random.uniform(key, x.shape)))
    return x + u
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    key = jax.random.key(0)
    x = np.arange(24, dtype=np.float32)
    new, new_permutes = noise_jit(key, x, mesh, partitionable=True)
    old, old_permutes = noise_jit(key, x, mesh, partitionable=False)
    np.testing.assert_array_equal(new, noise_numpy(key, x, True))
    np.testing.assert_array_equal(old, noise_numpy(key, x, False))
    assert new_permutes == 0 < old_permutes, (new_permutes, old_permutes)
    assert not np.array_equal(new, old)
    for got in (noise_pmap(key, x, N_DEVICES), noise_shard_map(key, x, mesh)):
        got = np.asarray(got)
        assert ((got - x >= 0) & (got - x < 1)).all()  # uniform in [0, 1)
    print(f"JAX {jax.__version__}")
    print(f"partitionable (default): {new_permutes} collective-permutes, "
          f"first values {np.round(new[:3] - x[:3], 4).tolist()}")
    print(f"non-partitionable:       {old_permutes} collective-permutes, "
          f"first values {np.round(old[:3] - x[:3], 4).tolist()}")
    print("ok: each stream matches single-device generation; only the "
          "non-partitionable one communicates")


if __name__ == "__main__":
    main()
