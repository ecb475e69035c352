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
re-implementation of JAX's random stream reproduces every sample exactly.

The key derivation, the sampler, the body, the global program and the NumPy
oracle (threefry2x32 included) are ``recipes/monte_carlo.py``'s; this module
adds the facts the library needs about them, and the public key functions
validate their arguments before calling the file's.
"""

from __future__ import annotations

import jax
import numpy as np

from collectives import _compat
from collectives._costs import fixed
from collectives._layout import Axes
from collectives._layout import make_spec
from collectives._layout import on_axes
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.recipes import monte_carlo as file

SEED = file.SEED
"""The global key of the ``metropolis`` recipe is ``jax.random.key(SEED)``."""

HALF_WIDTH = file.HALF_WIDTH
"""The target lives on ``{-8, ..., 8}``: ``Binomial(16, 1/2) - 8``."""

TARGET_MEAN = file.TARGET_MEAN
TARGET_VARIANCE = file.TARGET_VARIANCE
"""``Binomial(2h, 1/2)`` has variance ``2h / 4``."""

N_STEPS = file.N_STEPS
"""Metropolis steps per chain; the chain's second eigenvalue is about 0.90,
so 128 steps from any start leave the variance within 1e-4 of the target."""


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
    return file.device_key(key, axis)


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
    return file.chain_keys(key, axis, int(n_local))


def _n_terms(axes: Axes) -> int:
    # The samples are integers and compare exactly. The variance is a mean of
    # squares (no cancellation, and the mean's error enters only to second
    # order): relative error within k + n + 4 roundings, k <= 3 chains a
    # device in the example shapes. The mean can cancel to zero: its error
    # is up to n + 1 roundings of values up to HALF_WIDTH = 8, while the
    # policy's atol counts 2 roundings per unit of input (at least 1): 4(n + 1).
    return 4 * (axes.size + 8)


def _explicit_reason(axes: Axes) -> str | None:
    if _compat.EXPLICIT_KEYS_RESHARD:
        return None
    return (f"JAX {jax.__version__} cannot reshard keys made inside jit on "
            "Explicit axes (from 0.10 it can)")


metropolis = register(Recipe(
    name="metropolis", recipe_file="monte_carlo.py",
    cost_model=fixed({"all-reduce": 2}),
    summary="Metropolis chains, keys by fold_in(axis_index); mean/var by pmean",
    # x0: [k, ...] chain starts on each device -> mean [...], var [...] over all
    # chains (replicated) and the final states [k, ...]
    body=file.metropolis_body, program=on_axes(file.metropolis_program),
    explicit_program=on_axes(file.metropolis_explicit_program),
    explicit_reason=_explicit_reason,
    oracle=on_axes(file.metropolis_numpy),
    in_specs=lambda axes: (make_spec(axes.entry),),
    out_specs=lambda axes: (make_spec(), make_spec(), make_spec(axes.entry)),
    example_shapes=lambda axes, dims: ((axes.size * dims[0], *dims[1:]),),
    arg_names=("x0",), n_terms=_n_terms,
    dtype_kinds=frozenset({"float", "int"})))
