"""Test configuration for the suite and the doctests: strict numerics.

The 8 simulated CPU devices and the hypothesis profile come from the
collectives pytest plugin (``cpu_devices`` and ``hypothesis_profile`` in
pyproject.toml)."""

import contextlib
import ctypes
import os

import jax
import pytest
from hypothesis import settings

from collectives._recipe import clear_caches

# Implicit rank promotion hides shape bugs in global programs: make it an error.
jax.config.update("jax_numpy_rank_promotion", "raise")

# The suite compiles with LLVM's optimisations off (the processes the tests
# start get it too: tests/helpers.py rank_env). XLA:CPU then
# compiles about a quarter faster (check: 19.3 s -> 14.1 s; the conformance
# and property files: 239 s -> 183 s on 2 cores) and computes the same values:
# no LLVM pass reorders floating-point arithmetic without fast-math, which
# XLA leaves off, and XLA's own passes (buffers, collectives) are the same. A
# flag set in XLA_FLAGS already wins; timings are never taken here (the
# bench runs outside the suite).
FAST_COMPILE = "--xla_backend_optimization_level=0"
_flags = os.environ.get("XLA_FLAGS", "")
if "--xla_backend_optimization_level" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} {FAST_COMPILE}".strip()


def pytest_xdist_auto_num_workers(config):
    """Workers for ``-n auto`` (pyproject's addopts): one per core, at most 4.

    One JAX process with 8 simulated devices already keeps more than one
    core busy, yet on 2 cores 2 workers finish the suite in about 70 % of one
    process's time (waits on subprocesses and compiles overlap). Each worker
    holds its own compiled programs, hence the cap."""
    return max(1, min(os.cpu_count() or 1, 4))


# Tests that start processes (JAX ranks, pytest runs, recipe files in a
# fresh interpreter): seconds each, mostly spent waiting on their children.
STARTS_PROCESSES = ("tests/test_recipe_files.py::test_recipe_runs_standalone",
                    "tests/test_testing_plugin.py", "tests/test_install_lines.py")


def pytest_collection_modifyitems(items):
    """The tests that start processes first, the rest in their order.

    pytest-xdist hands tests out in collection order; the long ones, left to
    the end of the alphabet (test_recipe_files, test_testing_plugin), kept
    one worker busy after the others had finished. First, they overlap with
    the short compute-bound tests instead (longest first is the classic
    remedy for such a tail)."""
    def first(item):
        return not (item.get_closest_marker("multiprocess")
                    or item.nodeid.startswith(STARTS_PROCESSES))
    items.sort(key=first)  # stable: each group keeps its order


def _release_memory():
    """Drop the compiled programs, then hand freed heap back to the system
    (glibc keeps it otherwise, and the process's resident size never falls)."""
    clear_caches()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@pytest.fixture(autouse=True, scope="module")
def _bounded_compile_caches():
    """Compiled programs of every drawn shape would otherwise stay for the
    whole run (gigabytes under the deep profile): drop them after each module."""
    yield
    _release_memory()


@pytest.fixture(autouse=True)
def _bounded_compile_caches_deep():
    """Under the deep profile (200 drawn shapes a property), after each test
    too: one module's programs reached 4.8 GB in one worker."""
    yield
    if settings.get_current_profile_name() == "deep":
        _release_memory()
