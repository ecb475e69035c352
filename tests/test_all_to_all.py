"""``recipes/all_to_all.py``: rows to columns and back is the identity,
checked per device inside shard_map. (Every form against the NumPy oracle:
the registry-driven suites.)"""

import numpy as np
from hypothesis import given
from jax import lax

from helpers import law_cases
from helpers import run_body


@given(law_cases())
def test_all_to_all_twice_is_identity(case):
    mesh, axes, x = case
    wide = np.tile(x, (1, axes.size))  # columns must split into n chunks

    def body(block, *, axis):
        there = lax.all_to_all(block, axis, split_axis=1, concat_axis=0, tiled=True)
        return lax.all_to_all(there, axis, split_axis=0, concat_axis=1, tiled=True)

    np.testing.assert_array_equal(run_body(body, mesh, axes, wide), wide)
