"""The sharp edges of ``guides/sharp_edges_nan.py`` (a cross-device max drops
NaN): the wrong way fails as docs/sharp_edges.md says (the real exception, or
the exact wrong number) and the fix agrees with NumPy. Where a pitfall behaves
differently across JAX versions the test branches on a named flag in
collectives._compat and asserts what this version does.
"""


import jax.numpy as jnp
import numpy as np
import pytest

import collectives as cx
from helpers import load_recipe

N = 8


@pytest.fixture(scope="module")
def nan_edges():
    return load_recipe("sharp_edges_nan")


def test_pitfall_11_cross_device_max_drops_nan(nan_edges, mesh):
    x = np.arange(3.0 * N, dtype=np.float32).reshape(N, 3)
    x[2, 0] = np.nan  # one device
    x[:, 2] = np.nan  # every device
    want = nan_edges.pmax_numpy(x, N)
    assert np.isnan(want[0, 0]) and np.isnan(want[0, 2])
    wrong = [21.0, 22.0, -np.inf]  # NaN lost; all-NaN gives -inf
    for got in (nan_edges.pmax_pmap(x, N), nan_edges.pmax_shard_map(x, mesh),
                nan_edges.pmax_jit(x, mesh), cx.RECIPES["pmax"].jit(x)):
        assert np.asarray(got).ravel().tolist() == wrong
    # Unsharded jnp.max keeps NaN: the result depends on the sharding.
    assert np.isnan(np.asarray(jnp.max(x.reshape(N, 1, 3), axis=0))[0, 0])
    for fixed in (nan_edges.pmax_shard_map(x, mesh, keep_nan=True),
                  nan_edges.pmax_jit(x, mesh, keep_nan=True)):
        np.testing.assert_array_equal(np.asarray(fixed), want)
