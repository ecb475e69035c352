"""``recipes/ppermute.py`` and the body utilities built on it: a shift there
and back is the identity, checked per device inside shard_map. (Every form
against the NumPy oracle: the registry-driven suites; bad permutations:
tests/test_sharp_edges_ppermute.py.)"""

import jax
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import collectives as cx
from helpers import law_cases
from helpers import load_recipe
from helpers import run_body


@given(law_cases(), st.integers(-9, 9))
def test_ring_shift_there_and_back_is_identity(case, k):
    mesh, axes, x = case

    def body(block, *, axis):
        return cx.ring_shift(cx.ring_shift(block, axis, k), axis, -k)

    np.testing.assert_array_equal(run_body(body, mesh, axes, x), x)


def test_the_recipe_files_explicit_ring_shift_agrees_with_the_library():
    # the roll in an Auto island: shift by +3 then -3 restores x, and +1 is
    # the library's ring shift
    module = load_recipe("ppermute")
    mesh = module.make_mesh((8,), ("i",), jax.sharding.AxisType.Explicit)
    x = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    np.testing.assert_array_equal(
        module.ring_shift_explicit(x, mesh, 1),
        cx.RECIPES["ppermute_ring"].reference(x, mesh=cx.make_mesh((8,), "i")))
    there = module.ring_shift_explicit(x, mesh, 3)
    np.testing.assert_array_equal(module.ring_shift_explicit(there, mesh, -3), x)
