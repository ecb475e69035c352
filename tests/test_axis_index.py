"""``recipes/axis_index.py``: the indices along the axis are 0 .. n-1, each
once, checked per device inside shard_map. (Every form against the NumPy
oracle: the registry-driven suites.)"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import collectives as cx
from collectives.testing.strategies import collective_axes
from collectives.testing.strategies import meshes
from helpers import run_body


@given(meshes(), st.data())
def test_psum_of_axis_index_is_triangular(mesh, data):
    axes = cx.RECIPES["psum"].axes(mesh, data.draw(collective_axes(mesh)))
    n = axes.size

    def body(block, *, axis):
        return block + lax.psum(lax.axis_index(axis), axis)

    out = run_body(body, mesh, axes, np.zeros(n, np.int32))
    assert (out == n * (n - 1) // 2).all()
