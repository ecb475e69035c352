"""Monte Carlo chains: many independent chains per device, keys from one key.

What it shows: C = n * k independent chains, k on each of n devices, all
seeded from ONE global key, with statistics combined across devices by
``pmean``:
  * a random-walk Metropolis sampler for N(3, 2²) (known mean and variance);
  * a plain estimator: pi from points thrown into the unit square.

Keys: chain ``c`` uses ``fold_in(key, c)``. A device finds its chains'
indices from ``axis_index`` (``device * k + arange(k)``); the jit form and a
single-device ``vmap`` use ``arange(C)``. Under ``jax_threefry_partitionable``
(the default since JAX 0.5), ``split(key, C)[c] == fold_in(key, c)``, so
splitting on the host and sharding the keys ("split and shard", the classic
``pmap(vmap(...))`` idiom with keys of shape ``(n_devices, n_chains)``) gives
the same chains. Every form therefore draws the same numbers for the same
chain: the samples are BITWISE identical across pmap, shard_map, jit and one
device, whatever the device count.

Oracle: the known answers. Each estimate must land within 6 standard
errors of the truth (a two-sided normal tail of 2e-9: a correct sampler
fails it for about one seed in 500 million; the seed is fixed, so the check
is deterministic). Standard errors, for C independent chains and N points:
  * mean of the final states: sigma / sqrt(C);
  * their variance: sigma² * sqrt(2 / (C - 1)) (Gaussian samples);
  * pi: 4 * sqrt(p (1 - p) / N) with p = pi / 4.
The chains start at 0, 1.5 sigma from the mean, and run 200 steps with
uniform proposals of half-width 3 sigma; the mean's distance from 3 shrinks
about tenfold every 5 steps (measured on 4e5 chains), so after 200 steps the
start leaves no bias worth counting against the interval.

Bitwise identity needs every element computed the same way whatever the
batch size: it holds for + - * / and exp, and the chains use only those.
XLA:CPU evaluates some functions differently in long vectorised loops and
short remainders (erf_inv on JAX 0.8, behind ``jax.random.normal``; log on
JAX 0.10), so a sampler built on them can differ in the last bit between one
device holding C chains and n devices holding C / n.

Which form when: shard_map or jit for new code (jit needs no axis_index:
the keys come from arange); pmap(vmap) is the legacy idiom.

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
MEAN, SIGMA = 3.0, 2.0  # the target N(MEAN, SIGMA**2)
N_STEPS = 200
STEP = 3.0 * SIGMA  # proposals uniform on x +- STEP
N_POINTS = 512  # points per chain for pi
Z = 6.0  # half-width of the confidence intervals, in standard errors


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), ("i",),
                         axis_types=(jax.sharding.AxisType.Auto,))


def log_target(x):
    return -0.5 * ((x - MEAN) / SIGMA) ** 2


def chain(key, x0):
    # One chain: a scalar state, N_STEPS Metropolis steps, and N_POINTS points
    # for pi. Returns (final state, points inside the quarter circle). One
    # draw of uniforms per chain: rows [:N_STEPS] drive the walk (move,
    # accept), the other N_POINTS rows are the points.
    u = jax.random.uniform(key, (N_STEPS + N_POINTS, 2))

    def step(x, u):
        proposal = x + STEP * (2.0 * u[0] - 1.0)  # uniform on x +- STEP
        accept = u[1] < jnp.exp(log_target(proposal) - log_target(x))
        return jnp.where(accept, proposal, x), None

    final, _ = lax.scan(step, x0, u[:N_STEPS])
    hits = jnp.sum(jnp.sum(u[N_STEPS:] ** 2, axis=1) < 1.0)
    return final, hits


def statistics(final, hits, axis=None):
    # Mean and variance of the final states, and pi; with an axis name, the
    # per-device means are combined across devices by pmean.
    def mean(v):
        return v.mean() if axis is None else lax.pmean(v.mean(), axis)

    m = mean(final)
    return m, mean((final - m) ** 2), 4.0 * mean(hits / N_POINTS)


# [start:keys]
def chain_keys(key, axis_name, k):
    # This device's k chains: global indices device * k + arange(k)
    first = lax.axis_index(axis_name) * k
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, first + jnp.arange(k))


def all_chain_keys(key, n_chains):
    # The same keys without devices: chain c -> fold_in(key, c)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(n_chains))
# [end:keys]


# [start:pmap]
def monte_carlo_pmap(key, x0, n_devices):
    # Split and shard: C keys made on the host, stacked (n_devices, k) like x0
    keys = jax.random.split(key, x0.shape[0]).reshape(n_devices, -1)
    x0s = x0.reshape(n_devices, -1)

    def per_device(keys, x0):
        # keys, x0: [k] on each device
        final, hits = jax.vmap(chain)(keys, x0)
        return final, statistics(final, hits, "i")

    final, stats = jax.pmap(per_device, axis_name="i")(keys, x0s)
    # The statistics went through pmean: every device holds the same value.
    for s in stats:
        copies = np.asarray(s)
        assert (copies == copies[0]).all(), "device copies differ"
    return np.asarray(final).reshape(-1), tuple(np.asarray(s)[0] for s in stats)
# [end:pmap]


# [start:shard_map]
def monte_carlo_shard_map(key, x0, mesh):
    def per_device(x0):
        # x0: [k] on each device; keys from fold_in(key, axis_index * k + j)
        keys = chain_keys(key, "i", x0.shape[0])
        final, hits = jax.vmap(chain)(keys, x0)
        return final, statistics(final, hits, "i")

    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"),
                      out_specs=(P("i"), (P(), P(), P())))
    return jax.jit(f)(x0)
# [end:shard_map]


# [start:jit]
def monte_carlo_jit(key, x0, mesh):
    def program(x0):
        # x0: [C] global, sharded over "i"; no axis_index: keys from arange(C)
        final, hits = jax.vmap(chain)(all_chain_keys(key, x0.shape[0]), x0)
        return final, statistics(final, hits)

    f = jax.jit(program, in_shardings=NamedSharding(mesh, P("i")),
                out_shardings=(NamedSharding(mesh, P("i")), NamedSharding(mesh, P())))
    return f(x0)


def monte_carlo_one_device(key, x0):
    # The same chains, vmapped on a single device: the reference for the samples
    final, hits = jax.jit(jax.vmap(chain))(jax.random.split(key, x0.shape[0]), x0)
    return final, statistics(final, hits)
# [end:jit]


# [start:numpy]
def confidence_intervals(n_chains):
    # (truth, half-width) for the mean, the variance and pi
    p = math.pi / 4
    return {
        "mean": (MEAN, Z * SIGMA / math.sqrt(n_chains)),
        "variance": (SIGMA ** 2, Z * SIGMA ** 2 * math.sqrt(2 / (n_chains - 1))),
        "pi": (math.pi, Z * 4 * math.sqrt(p * (1 - p) / (n_chains * N_POINTS))),
    }


def check_estimates(stats, n_chains):
    for name, got in zip(("mean", "variance", "pi"), stats, strict=True):
        truth, half = confidence_intervals(n_chains)[name]
        assert abs(float(got) - truth) <= half, (
            f"{name}: {float(got):.5f} outside {truth:.5f} +- {half:.5f}")
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    key = jax.random.key(2024)
    n_chains = N_DEVICES * 1024
    x0 = np.zeros(n_chains, np.float32)

    one_final, one_stats = monte_carlo_one_device(key, x0)
    results = {
        "pmap": monte_carlo_pmap(key, x0, N_DEVICES),
        "shard_map": monte_carlo_shard_map(key, x0, mesh),
        "jit": monte_carlo_jit(key, x0, mesh),
    }
    for form, (final, stats) in results.items():
        # Same keys, same chains: the samples match bit for bit.
        np.testing.assert_array_equal(np.asarray(final), np.asarray(one_final),
                                      err_msg=f"samples ({form} form)")
        check_estimates(stats, n_chains)
    check_estimates(one_stats, n_chains)

    mean, var, pi = (float(s) for s in results["shard_map"][1])
    bands = confidence_intervals(n_chains)
    print(f"{n_chains} chains ({n_chains // N_DEVICES} per device), {N_STEPS} "
          f"Metropolis steps, {N_POINTS} points each for pi")
    print(f"mean {mean:.4f} (3 +- {bands['mean'][1]:.4f}), variance {var:.4f} "
          f"(4 +- {bands['variance'][1]:.4f}), pi {pi:.5f} "
          f"(+- {bands['pi'][1]:.5f})")
    print("ok: pmap, shard_map, jit and one device draw bitwise-identical samples; "
          "estimates within 6 standard errors")


if __name__ == "__main__":
    main()
