"""``recipes/reductions.py`` (psum, pmean, pmax, pmin): the laws that tie
them together, checked per device inside shard_map. (Every form against the
NumPy oracle: the registry-driven suites, tests/test_conformance.py and
tests/test_core_properties.py.)"""

import jax
import numpy as np
from hypothesis import given
from jax import lax

from helpers import law_cases
from helpers import run_body


@given(law_cases())
def test_pmean_is_psum_over_n(case):
    mesh, axes, x = case

    def body(block, *, axis):
        # n is a power of two, so the division is exact
        return lax.pmean(block, axis) - lax.psum(block, axis) / lax.axis_size(axis)

    np.testing.assert_array_equal(run_body(body, mesh, axes, x, jax.P()), 0)


@given(law_cases())
def test_pmin_is_minus_pmax_of_minus(case):
    mesh, axes, x = case

    def body(block, *, axis):
        return lax.pmin(block, axis) + lax.pmax(-block, axis)

    np.testing.assert_array_equal(run_body(body, mesh, axes, x, jax.P()), 0)
