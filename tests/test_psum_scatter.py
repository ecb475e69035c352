"""``recipes/psum_scatter.py``: a psum_scatter gathered again is the psum,
checked per device inside shard_map. (Every form against the NumPy oracle: the
registry-driven suites.)"""

import jax
import numpy as np
from hypothesis import given
from jax import lax

from collectives import _compat
from helpers import law_cases
from helpers import run_body


@given(law_cases())
def test_all_gather_of_psum_scatter_is_psum(case):
    mesh, axes, x = case

    def body(block, *, axis):
        scattered = lax.psum_scatter(block, axis, tiled=True)
        return _compat.all_gather_invariant(scattered, axis, tiled=True) - lax.psum(
            block, axis)

    np.testing.assert_array_equal(run_body(body, mesh, axes, x, jax.P()), 0)
