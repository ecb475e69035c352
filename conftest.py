"""Test configuration for the suite and the doctests: 8 simulated CPU devices,
strict numerics, hypothesis profiles."""

import jax

import collectives as cx
from collectives.testing._profiles import register_profiles

cx.use_cpu_devices(8)
# Implicit rank promotion hides shape bugs in global programs: make it an error.
jax.config.update("jax_numpy_rank_promotion", "raise")
register_profiles()
