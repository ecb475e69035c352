"""Test configuration for the suite and the doctests: strict numerics.

The 8 simulated CPU devices and the hypothesis profile come from the
collectives pytest plugin (``cpu_devices`` and ``hypothesis_profile`` in
pyproject.toml)."""

import jax
import pytest

from collectives._recipe import clear_caches

# Implicit rank promotion hides shape bugs in global programs: make it an error.
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(autouse=True, scope="module")
def _bounded_compile_caches():
    """Compiled programs of every drawn shape would otherwise stay for the
    whole run (gigabytes under the deep profile): drop them after each module."""
    yield
    clear_caches()
