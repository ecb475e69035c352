"""Test configuration for the suite and the doctests: strict numerics.

The 8 simulated CPU devices and the hypothesis profile come from the
collectives pytest plugin (``cpu_devices`` and ``hypothesis_profile`` in
pyproject.toml)."""

import os

import jax
import pytest

from collectives._recipe import clear_caches

# Implicit rank promotion hides shape bugs in global programs: make it an error.
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_xdist_auto_num_workers(config):
    """Workers for ``-n auto`` (pyproject's addopts): one per core, at most 4.

    One JAX process with 8 simulated devices already keeps more than one
    core busy, yet on 2 cores 2 workers finish the suite in about 70 % of one
    process's time (waits on subprocesses and compiles overlap). Each worker
    holds its own compiled programs, hence the cap."""
    return max(1, min(os.cpu_count() or 1, 4))


@pytest.fixture(autouse=True, scope="module")
def _bounded_compile_caches():
    """Compiled programs of every drawn shape would otherwise stay for the
    whole run (gigabytes under the deep profile): drop them after each module."""
    yield
    clear_caches()
