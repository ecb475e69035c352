"""The sharp edges of ``guides/sharp_edges_grads.py`` (the n-times-too-large
gradient of a literal pmap port): the wrong way fails as docs/sharp_edges.md
says (the real exception, or the exact wrong number) and the fix agrees with
NumPy. Where a pitfall behaves differently across JAX versions the test branches
on a named flag in collectives._compat and asserts what this version does.
"""


import numpy as np
import pytest

from helpers import load_recipe

N = 8


@pytest.fixture(scope="module")
def grads():
    return load_recipe("sharp_edges_grads")


def test_pitfall_3_literal_pmap_port_gives_n_times_the_gradient(grads, mesh):
    w, x, y = grads.example(N)
    want = grads.grads_numpy(w, x, y)
    wrong = np.asarray(grads.grads_literal_port(w, x, y, mesh))
    # Small-integer data: both are exact, so the factor is exactly N.
    np.testing.assert_array_equal(wrong, (N * want).astype(np.float32))
    assert not np.allclose(wrong, want)
    for fixed in (grads.grads_pmap(w, x, y, N),
                  grads.grads_of_shard_map(w, x, y, mesh),
                  grads.grads_pvary(w, x, y, mesh),
                  grads.grads_jit(w, x, y, mesh)):
        np.testing.assert_array_equal(np.asarray(fixed), want.astype(np.float32))
