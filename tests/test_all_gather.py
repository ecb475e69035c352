"""``recipes/all_gather.py``: the stacked (untiled) gather is the tiled one
with the device axis kept apart, and a gather of every block returns the
array in device order. (Every form against the NumPy oracle: the
registry-driven suites.)"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import collectives as cx
from collectives.testing.strategies import collective_axes
from collectives.testing.strategies import meshes

TILED, STACKED = cx.RECIPES["all_gather"], cx.RECIPES["all_gather_stacked"]


@given(meshes(), st.data(), st.integers(0, 2**16))
def test_the_stacked_gather_reshaped_is_the_tiled_gather(mesh, data, seed):
    axis = data.draw(collective_axes(mesh))
    n = TILED.axes(mesh, axis).size
    (x,) = TILED.example_args(mesh, axis, seed=seed, exact=True)
    tiled = np.asarray(TILED.shard_map(x, mesh=mesh, axis=axis))
    stacked = np.asarray(STACKED.shard_map(x, mesh=mesh, axis=axis))
    assert stacked.shape == (n, x.shape[0] // n, *x.shape[1:])
    np.testing.assert_array_equal(stacked.reshape(x.shape), tiled)
    np.testing.assert_array_equal(tiled, x)  # every block, in device order
