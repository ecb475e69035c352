"""Test configuration for the suite and the doctests: strict numerics.

The 8 simulated CPU devices and the hypothesis profile come from the
collectives pytest plugin (``cpu_devices`` and ``hypothesis_profile`` in
pyproject.toml)."""

import jax

# Implicit rank promotion hides shape bugs in global programs: make it an error.
jax.config.update("jax_numpy_rank_promotion", "raise")
