"""The sharp edges of ``guides/sharp_edges_ppermute.py`` (ppermute: zeros where
nothing arrives, bad permutations, axis order): the wrong way fails as
docs/sharp_edges.md says (the real exception, or the exact wrong number) and the
fix agrees with NumPy. Where a pitfall behaves differently across JAX versions
the test branches on a named flag in collectives._compat and asserts what this
version does.
"""


import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives import _compat
from helpers import load_recipe

N = 8


@pytest.fixture(scope="module")
def ppermute():
    return load_recipe("sharp_edges_ppermute")


X = np.arange(2.0 * N, dtype=np.float32)


def test_pitfall_5_non_destinations_receive_zeros(ppermute, mesh):
    x = np.arange(1.0, N + 1, dtype=np.float32)
    half = [(s, s + 1) for s in range(0, N, 2)]
    got = np.asarray(ppermute.send_shard_map(x, mesh, half))
    np.testing.assert_array_equal(got, [0, 1, 0, 3, 0, 5, 0, 7])
    np.testing.assert_array_equal(got, ppermute.send_numpy(x, N, half))
    np.testing.assert_array_equal(ppermute.send_pmap(x, N, half), got)


@pytest.mark.parametrize(("perm", "error", "words"), [
    ([(0, 1), (2, 1)], ValueError, "sources and destinations must be unique"),
    ([(0, 1), (0, 2)], ValueError, "sources and destinations must be unique"),
    ([(0, N)], IndexError, "index out of range"),
])


def test_pitfall_5_bad_permutations_raise_in_jax(ppermute, mesh, perm, error, words):
    with pytest.raises(error, match=words):
        ppermute.send_shard_map(X, mesh, perm)
    # The recipe's check and the package's say which pair is wrong.
    with pytest.raises(ValueError, match=r"appears twice|out of range"):
        ppermute.check_pairs(perm, N)
    with pytest.raises(ValueError, match=r"appears twice|out of range"):
        cx.check_permutation(perm, N)


def test_pitfall_5_full_permutation_agrees_in_every_form(ppermute, mesh):
    ring = ppermute.ring(N)
    want = ppermute.send_numpy(X, N, ring)
    np.testing.assert_array_equal(ppermute.send_pmap(X, N, ring), want)
    np.testing.assert_array_equal(ppermute.send_shard_map(X, mesh, ring), want)
    np.testing.assert_array_equal(ppermute.ring_shift_jit(X, mesh), want)


def test_pitfall_10_ppermute_tuple_out_of_mesh_order(ppermute):
    mesh2 = cx.make_mesh((4, 2), ("i", "j"))
    want = [7, 0, 1, 2, 3, 4, 5, 6]  # device d receives d - 1
    mesh_order_numbering = [7, 4, 5, 6, 0, 1, 2, 3]
    if _compat.PPERMUTE_CHECKS_AXIS_ORDER:
        with pytest.raises(RuntimeError, match="same order as the axis_names"):
            ppermute.ring_shift_tuple(mesh2, ("j", "i"))
        # With the check off, 0.12 numbers devices in the tuple's order.
        with _compat.ppermute_axis_order_unchecked():
            got = ppermute.ring_shift_tuple(mesh2, ("j", "i"))
        assert jax.config.jax_raise_on_ppermute_sort_diff
        assert got.tolist() == want
    else:  # silently in mesh order
        got = ppermute.ring_shift_tuple(mesh2, ("j", "i"))
        assert got.tolist() == mesh_order_numbering
    assert ppermute.ring_shift_tuple(mesh2, ("j", "i"), True).tolist() == want
    assert ppermute.ring_shift_tuple(mesh2, ("i", "j")).tolist() == want


def test_pitfall_10_the_package_renumbers(mesh):
    mesh2 = cx.make_mesh((4, 2), ("i", "j"))
    spec = P(("j", "i"))

    def body(block):
        index = lax.axis_index(("j", "i")).reshape(1, 1)
        return (cx.ring_shift(index, ("j", "i"), 1),
                cx.permute(index, ("j", "i"), [(s, (s - 1) % N) for s in range(N)]))

    f = jax.jit(jax.shard_map(body, mesh=mesh2, in_specs=spec,
                              out_specs=(spec, spec)))
    forward, backward = f(np.zeros((N, 1), np.int32))
    assert np.asarray(forward).ravel().tolist() == [7, 0, 1, 2, 3, 4, 5, 6]
    assert np.asarray(backward).ravel().tolist() == [1, 2, 3, 4, 5, 6, 7, 0]
