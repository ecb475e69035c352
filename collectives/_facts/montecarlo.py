"""Monte Carlo chains: many independent chains per device, keys from one key.

Key derivation: chain ``c`` (its index in the global batch of chains) uses
``fold_in(key, c)``. Inside a body a device computes its chains' indices from
``axis_index`` (:func:`chain_keys`); the jit form and a single-device
``vmap`` compute the same keys from ``arange(C)``. So every form draws the
same numbers for the same chain, on any mesh: samples are bitwise identical
across pmap, shard_map, jit and one device. Under the default
``jax_threefry_partitionable`` these keys also equal
``jax.random.split(key, C)``, so splitting on the host and sharding the keys
("split and shard") gives the same chains again.

The ``metropolis`` recipe runs a random-walk Metropolis sampler whose target
has a known mean and variance, with integer arithmetic only, so a NumPy
re-implementation of JAX's random stream (``_threefry``) reproduces every
sample exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from collectives._costs import fixed
from collectives._facts import threefry as _threefry
from collectives._layout import Axes
from collectives._layout import make_spec
from collectives._recipe import Recipe
from collectives._registry import register

SEED = 0
"""The global key of the ``metropolis`` recipe is ``jax.random.key(SEED)``."""

HALF_WIDTH = 8
"""The target lives on ``{-8, ..., 8}``: ``Binomial(16, 1/2) - 8``."""

TARGET_MEAN = 0.0
TARGET_VARIANCE = HALF_WIDTH / 2
"""``Binomial(2h, 1/2)`` has variance ``2h / 4``."""

N_STEPS = 128
"""Metropolis steps per chain; the chain's second eigenvalue is about 0.90,
so 128 steps from any start leave the variance within 1e-4 of the target."""

_U_BITS = 24  # bits of each random word used for the acceptance test


def device_key(key, axis):
    """A different key on every device, derived from one key; call inside a body.

    ``fold_in(key, axis_index(axis))``: device ``d`` gets ``fold_in(key, d)``,
    which equals ``jax.random.split(key, n)[d]`` under the default
    ``jax_threefry_partitionable``, so the jit form can compute the same keys
    with ``jax.random.split`` and no ``axis_index``.

    Args:
      key: a PRNG key (``jax.random.key``; raw ``uint32[2]`` keys work too),
        the same on every device.
      axis: the mesh axis name, or a tuple of them (devices then count in
        ``axis_index(axis)`` order, the first axis major).

    Returns:
      This device's key.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((8,), "i")
      >>> key = jax.random.key(0)
      >>> f = jax.shard_map(
      ...     lambda: jax.random.key_data(cx.device_key(key, "i"))[None],
      ...     mesh=mesh, in_specs=(), out_specs=jax.P("i"))
      >>> per_device = np.asarray(f())  # [8, 2]: one key per device
      >>> bool((per_device == jax.random.key_data(jax.random.split(key, 8))).all())
      True
    """
    return jax.random.fold_in(key, lax.axis_index(axis))


def chain_keys(key, axis, n_local: int):
    """Keys of this device's ``n_local`` chains; call inside a body.

    Chains are numbered globally, device ``d`` holding chains
    ``d * n_local ... (d + 1) * n_local - 1``, and chain ``c`` gets
    ``fold_in(key, c)``. The keys of a chain do not depend on the mesh, so a
    single device running ``jax.vmap`` over ``fold_in(key, arange(C))`` (or,
    under the default ``jax_threefry_partitionable``, over
    ``jax.random.split(key, C)``) draws the very same numbers.

    Args:
      key: a PRNG key, the same on every device.
      axis: the mesh axis name, or a tuple of them, that the chains are
        sharded over.
      n_local: chains per device (a Python int).

    Returns:
      ``n_local`` keys, a key array of shape ``[n_local]``.

    Raises:
      ValueError: ``n_local`` is not a positive int.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "i")
      >>> key = jax.random.key(7)
      >>> f = jax.shard_map(
      ...     lambda: jax.random.key_data(cx.chain_keys(key, "i", 3)),
      ...     mesh=mesh, in_specs=(), out_specs=jax.P("i"))
      >>> got = np.asarray(f())  # [12, 2]: 3 chains on each of 4 devices
      >>> bool((got == jax.random.key_data(jax.random.split(key, 12))).all())
      True
    """
    if isinstance(n_local, bool) or not isinstance(n_local, (int, np.integer)) \
            or n_local < 1:
        raise ValueError(
            f"n_local: expected the number of chains per device (a positive int), "
            f"got {n_local!r}. Fix: pass e.g. x_block.shape[0].")
    first = lax.axis_index(axis) * n_local
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
        key, first + jnp.arange(n_local, dtype=jnp.int32))


def global_chain_keys(key, n_chains: int):
    """The keys :func:`chain_keys` gives all chains, computed without devices."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
        key, jnp.arange(n_chains, dtype=jnp.int32))


# -- the sampler ---------------------------------------------------------------

def _step(s, bits, xp):
    """One Metropolis step for ``Binomial(2h, 1/2) - h``, integers only.

    Propose ``s + 1`` or ``s - 1`` (bit 0 of ``bits``); accept with
    probability ``min(1, target(new) / target(s))``, testing a 24-bit
    uniform ``u`` as ``u * den < num * 2**24`` so that NumPy and XLA agree
    exactly.
    """
    n = 2 * HALF_WIDTH
    up = (bits & 1) == 1
    u = (bits >> (32 - _U_BITS)).astype(xp.int32)
    j = s + HALF_WIDTH  # in [0, 2h]
    num = xp.where(up, n - j, j)
    den = xp.where(up, j + 1, n - j + 1)
    accept = u * den < num * (1 << _U_BITS)
    return s + xp.where(accept, xp.where(up, 1, -1), 0).astype(xp.int32)


def initial_states(x0, xp=jnp):
    """Chain starts: ``x0`` rounded and clipped into the support, as int32."""
    return xp.clip(xp.round(x0), -HALF_WIDTH, HALF_WIDTH).astype(xp.int32)


def run_chain(key, s0):
    """``N_STEPS`` Metropolis steps from ``s0`` (int32, any shape) with ``key``."""
    bits = jax.random.bits(key, (N_STEPS, *s0.shape), jnp.uint32)
    final, _ = lax.scan(lambda s, b: (_step(s, b, jnp), None), s0, bits)
    return final


def run_chain_numpy(keys: np.ndarray, s0: np.ndarray) -> np.ndarray:
    """:func:`run_chain` in NumPy for a batch: ``keys[C, 2]`` raw, ``s0[C, ...]``."""
    size = int(np.prod(s0.shape[1:], dtype=np.int64))
    counts = np.arange(N_STEPS * size, dtype=np.uint32)
    y0, y1 = _threefry.threefry2x32(keys[:, None, :], np.zeros_like(counts), counts)
    bits = (y0 ^ y1).reshape(s0.shape[0], N_STEPS, *s0.shape[1:])
    s = s0.astype(np.int32)
    for t in range(N_STEPS):
        s = _step(s, bits[:, t], np)
    return s


# -- the metropolis recipe -------------------------------------------------------

def metropolis_body(x0, *, axis):
    # x0: [k, ...] chain starts on each device -> per-chain final states
    # [k, ...] and the mean and variance over all chains, on every device
    keys = chain_keys(jax.random.key(SEED), axis, x0.shape[0])
    samples = jax.vmap(run_chain)(keys, initial_states(x0))
    values = samples.astype(jnp.float32)
    mean = lax.pmean(values.mean(0), axis)
    var = lax.pmean(((values - mean[None]) ** 2).mean(0), axis)
    return mean, var, samples


def metropolis_program(x0, *, axes: Axes):
    # x0: [C, ...] global; the same keys from arange(C), no axis_index
    keys = global_chain_keys(jax.random.key(SEED), x0.shape[0])
    samples = jax.vmap(run_chain)(keys, initial_states(x0))
    values = samples.astype(jnp.float32)
    mean = values.mean(0)
    return mean, ((values - mean[None]) ** 2).mean(0), samples


def metropolis_oracle(x0, *, axes: Axes):
    key = np.asarray(jax.random.key_data(jax.random.key(SEED)))
    keys = _threefry.fold_in(key, np.arange(x0.shape[0]))
    samples = run_chain_numpy(keys, initial_states(x0, np))
    values = samples.astype(np.float64)
    mean = values.mean(0)
    var = ((values - mean) ** 2).mean(0)
    return mean.astype(np.float32), var.astype(np.float32), samples


def _n_terms(axes: Axes) -> int:
    # The samples are integers and compare exactly. The variance is a mean of
    # squares (no cancellation, and the mean's error enters only to second
    # order): relative error within k + n + 4 roundings, k <= 3 chains a
    # device in the example shapes. The mean can cancel to zero: its error
    # is up to n + 1 roundings of values up to HALF_WIDTH = 8, while the
    # policy's atol counts 2 roundings per unit of input (at least 1): 4(n + 1).
    return 4 * (axes.size + 8)


metropolis = register(Recipe(
    name="metropolis", source="monte_carlo.py", hlo=fixed({"all-reduce": 2}),
    summary="Metropolis chains, keys by fold_in(axis_index); mean/var by pmean",
    body=metropolis_body, program=metropolis_program, oracle=metropolis_oracle,
    in_specs=lambda axes: (make_spec(axes.entry),),
    out_specs=lambda axes: (make_spec(), make_spec(), make_spec(axes.entry)),
    example_shapes=lambda axes, dims: ((axes.size * dims[0], *dims[1:]),),
    arg_names=("x0",), count_terms=_n_terms,
    dtype_kinds=frozenset({"float", "int"})))
