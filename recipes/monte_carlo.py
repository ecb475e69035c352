"""Monte Carlo chains: many independent chains per device, keys from one key.

What it shows: C = n * k independent chains, k on each of n devices, all
seeded from ONE global key, with statistics combined across devices by
``pmean``. Each chain is a random-walk Metropolis sampler for a target with
a known mean and variance, ``Binomial(16, 1/2) - 8`` on ``{-8, ..., 8}``
(mean 0, variance 4), run for 128 steps from ``x0`` rounded into the
support; a chain state may be a vector (each coordinate is its own walk).

Keys: chain ``c`` uses ``fold_in(key, c)``. A device finds its chains'
indices from ``axis_index`` (``device * k + arange(k)``); the jit form and a
single-device ``vmap`` use ``arange(C)``. Under ``jax_threefry_partitionable``
(the default since JAX 0.5), ``split(key, C)[c] == fold_in(key, c)``, so
splitting on the host and sharding the keys ("split and shard", the classic
``pmap(vmap(...))`` idiom with keys of shape ``(n_devices, n_chains)``) gives
the same chains. Every form therefore draws the same numbers for the same
chain: the samples are BITWISE identical across pmap, shard_map, jit and one
device, whatever the device count or mesh.

Oracle: JAX's random stream (threefry2x32) re-implemented in NumPy, bit for
bit, and the same sampler run on the host. The sampler uses integer
arithmetic only (the acceptance test compares a 24-bit uniform integer
against a ratio of integers), so the NumPy samples equal the devices'
exactly, not just within a tolerance. Floats would not do: XLA:CPU evaluates
some functions differently in long vectorised loops and short remainders
(erf_inv on JAX 0.8, behind ``jax.random.normal``; log on JAX 0.10), so a
sampler built on them can differ in the last bit between one device holding
C chains and n devices holding C / n, and from NumPy.
``main()`` also checks the estimates against the known answers, within 6
standard errors.

Which form when: shard_map or jit for new code (jit needs no axis_index:
the keys come from arange); explicit, the jit program on Explicit axes,
where the keys are resharded to split like the chains they drive;
pmap(vmap) is the legacy idiom.

The per-device body, the global program and the NumPy oracle below are the
ones ``collectives.RECIPES["metropolis"]`` runs: ``axis`` may be one mesh
axis name or a tuple of them (devices then count in ``axis_index(axis)``
order). ``chain_keys`` and ``device_key`` are ``collectives.chain_keys`` and
``collectives.device_key``.

Registered as: ``collectives.RECIPES["metropolis"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/monte_carlo.py``
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
SEED = 0  # the global key is jax.random.key(SEED)
HALF_WIDTH = 8  # the target: Binomial(2 * HALF_WIDTH, 1/2) - HALF_WIDTH
TARGET_MEAN = 0.0
TARGET_VARIANCE = HALF_WIDTH / 2  # Binomial(2h, 1/2) has variance 2h / 4
# Steps per chain: the chain's second eigenvalue is about 0.90, so 128 steps
# from any start leave the variance within 1e-4 of the target.
N_STEPS = 128
U_BITS = 24  # bits of each random word used for the acceptance test
Z = 6.0  # main()'s confidence intervals: +- 6 standard errors


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Auto,))


# [start:keys]
def device_key(key, axis=AXIS):
    # One key per device: device d gets fold_in(key, d) (== split(key, n)[d])
    return jax.random.fold_in(key, lax.axis_index(axis))


def chain_keys(key, axis, k):
    # This device's k chains: global indices device * k + arange(k)
    first = lax.axis_index(axis) * k
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
        key, first + jnp.arange(k, dtype=jnp.int32))


def all_chain_keys(key, n_chains):
    # The same keys without devices: chain c -> fold_in(key, c)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
        key, jnp.arange(n_chains, dtype=jnp.int32))
# [end:keys]


# -- the sampler: integers only, so NumPy can run it too (xp = jnp or np) ------

def step(s, bits, xp=jnp):
    # One Metropolis step for Binomial(2h, 1/2) - h: propose s + 1 or s - 1
    # (bit 0 of `bits`); accept with probability min(1, target(new) /
    # target(s)), testing a 24-bit uniform u as u * den < num * 2**24.
    n = 2 * HALF_WIDTH
    up = (bits & 1) == 1
    u = (bits >> (32 - U_BITS)).astype(xp.int32)
    j = s + HALF_WIDTH  # in [0, 2h]
    num = xp.where(up, n - j, j)
    den = xp.where(up, j + 1, n - j + 1)
    accept = u * den < num * (1 << U_BITS)
    return s + xp.where(accept, xp.where(up, 1, -1), 0).astype(xp.int32)


def initial_states(x0, xp=jnp):
    # chain starts: x0 rounded and clipped into the support, as int32
    return xp.clip(xp.round(x0), -HALF_WIDTH, HALF_WIDTH).astype(xp.int32)


def run_chain(key, s0):
    # N_STEPS steps from s0 (int32, any shape): one uint32 word per step and
    # coordinate
    bits = jax.random.bits(key, (N_STEPS, *s0.shape), jnp.uint32)
    final, _ = lax.scan(lambda s, b: (step(s, b), None), s0, bits)
    return final


# [start:body]
# x0: [k, ...] chain starts on each device -> the mean and variance over all
# chains [...], the same on every device, and the final states [k, ...]
def metropolis_body(x0, axis=AXIS, seed=SEED):
    keys = chain_keys(jax.random.key(seed), axis, x0.shape[0])
    samples = jax.vmap(run_chain)(keys, initial_states(x0))
    values = samples.astype(jnp.float32)
    mean = lax.pmean(values.mean(0), axis)
    var = lax.pmean(((values - mean[None]) ** 2).mean(0), axis)
    return mean, var, samples
# [end:body]


# [start:pmap]
def metropolis_pmap(x0, n_devices):
    stacked = x0.reshape(n_devices, -1, *x0.shape[1:])  # [n, k, ...]
    mean, var, samples = jax.pmap(metropolis_body, axis_name=AXIS)(stacked)
    # The statistics went through pmean: every device holds the same value.
    for copies in (np.asarray(mean), np.asarray(var)):
        assert (copies == copies[0]).all(), "device copies differ"
    return mean[0], var[0], np.asarray(samples).reshape(x0.shape)


def split_and_shard_pmap(x0, n_devices):
    # The classic idiom: C keys split on the host, stacked [n, k] like x0
    keys = jax.random.split(jax.random.key(SEED), x0.shape[0])
    stack = lambda a: a.reshape(n_devices, -1, *a.shape[1:])
    f = jax.pmap(lambda keys, x0: jax.vmap(run_chain)(keys, initial_states(x0)))
    return np.asarray(f(stack(keys), stack(x0))).reshape(x0.shape)
# [end:pmap]


# [start:shard_map]
def metropolis_shard_map(x0, mesh):
    f = jax.shard_map(metropolis_body, mesh=mesh, in_specs=P(AXIS),
                      out_specs=(P(), P(), P(AXIS)))
    return jax.jit(f)(x0)
# [end:shard_map]


# [start:jit]
def metropolis_program(x0, seed=SEED):
    # x0: [C, ...] global; the same keys from arange(C), no axis_index
    keys = all_chain_keys(jax.random.key(seed), x0.shape[0])
    samples = jax.vmap(run_chain)(keys, initial_states(x0))
    values = samples.astype(jnp.float32)
    mean = values.mean(0)
    return mean, ((values - mean[None]) ** 2).mean(0), samples


def metropolis_jit(x0, mesh):
    f = jax.jit(metropolis_program, in_shardings=NamedSharding(mesh, P(AXIS)),
                out_shardings=(NamedSharding(mesh, P()),) * 2
                + (NamedSharding(mesh, P(AXIS)),))
    return f(x0)
# [end:jit]


# [start:explicit]
EXPLICIT_KEYS_SINCE = (0, 10, 0)  # resharding keys made inside jit: refused before


def metropolis_explicit_program(x0, seed=SEED):
    # x0: f32[C@i, ...]. vmap needs the chains' dimension split alike in
    # every input: the keys, built whole from arange(C) (key<fry>[C]), are
    # resharded to x0's split of the chains (each device keeps its own).
    chains = jax.typeof(x0).sharding.spec[0]
    keys = jax.sharding.reshard(
        all_chain_keys(jax.random.key(seed), x0.shape[0]), P(chains))
    samples = jax.vmap(run_chain)(keys, initial_states(x0))  # i32[C@i, ...]
    values = samples.astype(jnp.float32)
    mean = values.mean(0)  # f32[...], summed over i
    return mean, ((values - mean[None]) ** 2).mean(0), samples


def metropolis_explicit(x0, mesh):
    # mesh: the same devices and names with every axis Explicit
    mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(
        jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))
    with jax.set_mesh(mesh):
        x0 = jax.sharding.reshard(x0, P(AXIS))
        # -> mean, var: f32[...] (replicated); samples: i32[C@i, ...]
        return jax.jit(metropolis_explicit_program)(x0)
# [end:explicit]


# [start:numpy]
# JAX's default random stream, threefry2x32, in NumPy. For a key (k0, k1):
# fold_in(key, d) is threefry2x32(key, (0, d)); bits(key, shape) (32 bits) is
# y0 ^ y1 of threefry2x32(key, (hi, lo)) with (hi, lo) the 64-bit flat index
# of each element (under jax_threefry_partitionable, the default).
ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(key, x0, x1):
    # The Threefry-2x32 block cipher (20 rounds), elementwise over the uint32
    # words x0, x1; key: uint32 [..., 2], broadcast against them.
    def rotate_left(x, r):
        return (x << np.uint32(r)) | (x >> np.uint32(32 - r))

    key = np.asarray(key, np.uint32)
    x0, x1, k0, k1 = np.broadcast_arrays(
        np.atleast_1d(np.asarray(x0, np.uint32)),
        np.atleast_1d(np.asarray(x1, np.uint32)),
        np.atleast_1d(key[..., 0]), np.atleast_1d(key[..., 1]))
    schedule = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0 = x0 + schedule[0]
    x1 = x1 + schedule[1]
    for block in range(5):
        for r in ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = rotate_left(x1, r) ^ x0
        x0 = x0 + schedule[(block + 1) % 3]
        x1 = x1 + schedule[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def fold_in_numpy(key, data):
    # jax.random.fold_in on raw key data [..., 2], vectorised over data
    # (ints below 2**32): one key [..., 2] per broadcast element
    data = np.asarray(data).astype(np.uint32)
    key = np.asarray(key, np.uint32)
    y0, y1 = threefry2x32(key, np.zeros_like(data), data)
    shape = np.broadcast_shapes(data.shape, key.shape[:-1])
    return np.stack([y0.reshape(shape), y1.reshape(shape)], axis=-1)


def run_chains_numpy(keys, s0):
    # run_chain for a batch: keys [C, 2] raw, s0 [C, ...] (under 2**32 words
    # a chain, so the counter's high word is 0)
    size = math.prod(s0.shape[1:])
    counts = np.arange(N_STEPS * size, dtype=np.uint32)
    y0, y1 = threefry2x32(keys[:, None, :], np.zeros_like(counts), counts)
    bits = (y0 ^ y1).reshape(s0.shape[0], N_STEPS, *s0.shape[1:])
    s = s0.astype(np.int32)
    for t in range(N_STEPS):
        s = step(s, bits[:, t], np)
    return s


def metropolis_numpy(x0, seed=SEED):
    key = np.asarray(jax.random.key_data(jax.random.key(seed)))
    keys = fold_in_numpy(key, np.arange(x0.shape[0]))
    samples = run_chains_numpy(keys, initial_states(np.asarray(x0), np))
    values = samples.astype(np.float64)
    mean = values.mean(0)
    var = ((values - mean) ** 2).mean(0)
    return mean.astype(np.float32), var.astype(np.float32), samples
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    n_chains, coords = N_DEVICES * 256, 4
    x0 = np.zeros((n_chains, coords), np.float32)  # every chain starts at 0

    want_mean, want_var, want_samples = metropolis_numpy(x0)
    results = {"pmap": metropolis_pmap(x0, N_DEVICES),
               "shard_map": metropolis_shard_map(x0, mesh),
               "jit": metropolis_jit(x0, mesh)}
    if jax.__version_info__[:3] >= EXPLICIT_KEYS_SINCE:
        results["explicit"] = metropolis_explicit(x0, mesh)
    else:
        print(f"(the explicit form needs JAX >= 0.10: on {jax.__version__} keys "
              "made inside jit cannot be resharded on Explicit axes)")
    for form, (mean, var, samples) in results.items():
        # Same keys, same integer steps: the samples match NumPy bit for bit.
        np.testing.assert_array_equal(np.asarray(samples), want_samples,
                                      err_msg=f"samples ({form} form)")
        np.testing.assert_allclose(np.asarray(mean), want_mean, atol=1e-5,
                                   err_msg=f"mean ({form} form)")
        np.testing.assert_allclose(np.asarray(var), want_var, rtol=1e-5,
                                   err_msg=f"variance ({form} form)")
    # Split and shard: keys from jax.random.split give the very same chains.
    np.testing.assert_array_equal(split_and_shard_pmap(x0, N_DEVICES), want_samples)

    # The known answers, within Z standard errors of the estimates from
    # m = chains * coords samples: the mean's is sqrt(var / m), the
    # variance's sqrt((mu4 - var**2) / m), mu4 = 46 the fourth central
    # moment of Binomial(16, 1/2).
    m = n_chains * coords
    mean = float(np.mean(results["shard_map"][0]))
    var = float(np.mean(results["shard_map"][1]))
    mean_half = Z * math.sqrt(TARGET_VARIANCE / m)
    var_half = Z * math.sqrt((46.0 - TARGET_VARIANCE ** 2) / m)
    assert abs(mean - TARGET_MEAN) <= mean_half, mean
    assert abs(var - TARGET_VARIANCE) <= var_half, var
    print(f"{n_chains} chains ({n_chains // N_DEVICES} per device) of {coords} "
          f"coordinates, {N_STEPS} Metropolis steps each, from 0")
    print(f"mean {mean:.4f} (target {TARGET_MEAN} +- {mean_half:.4f}), variance "
          f"{var:.4f} (target {TARGET_VARIANCE} +- {var_half:.4f})")
    print("chain 0, by NumPy's threefry:", want_samples[0].tolist(),
          "on the devices:", np.asarray(results["shard_map"][2])[0].tolist())
    print("ok: pmap, shard_map, jit, explicit and split-and-shard draw the NumPy "
          "stream's samples bit for bit; estimates within 6 standard errors")


if __name__ == "__main__":
    main()
