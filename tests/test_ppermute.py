"""``recipes/ppermute.py`` and the body utilities built on it: a shift there
and back is the identity, checked per device inside shard_map. (Every form
against the NumPy oracle: the registry-driven suites; bad permutations:
tests/test_sharp_edges_ppermute.py.)"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import collectives as cx
from helpers import law_cases
from helpers import run_body


@given(law_cases(), st.integers(-9, 9))
def test_ring_shift_there_and_back_is_identity(case, k):
    mesh, axes, x = case

    def body(block, *, axis):
        return cx.ring_shift(cx.ring_shift(block, axis, k), axis, -k)

    np.testing.assert_array_equal(run_body(body, mesh, axes, x), x)
