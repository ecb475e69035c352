"""The sharp edges of ``guides/sharp_edges_sharding.py`` (explicit-axis meshes,
the invariant all-gather, psum of an invariant value, axis_index_groups): the
wrong way fails as docs/sharp_edges.md says (the real exception, or the exact
wrong number) and the fix agrees with NumPy. Where a pitfall behaves differently
across JAX versions the test branches on a named flag in collectives._compat and
asserts what this version does.
"""


import jax
import numpy as np
import pytest

import collectives as cx
from collectives import _compat
from helpers import load_recipe

N = 8


@pytest.fixture(scope="module")
def sharding():
    return load_recipe("sharp_edges_sharding")


X = np.arange(2.0 * N, dtype=np.float32)


def test_pitfall_1_explicit_mesh_rejects_unplaced_inputs(sharding):
    explicit = sharding.make_explicit_mesh((N,), ("i",))
    want = X.reshape(N, -1).sum(0)
    if _compat.SHARD_MAP_CHECKS_EXPLICIT_INPUT_SPECS:
        with pytest.raises(ValueError) as info:
            sharding.psum_rows(X, explicit)
        message = str(info.value)
        assert "in_specs passed to shard_map" in message
        assert "does not match the specs of the input" in message
    else:  # JAX 0.8 reshards the input as on an Auto mesh
        np.testing.assert_array_equal(sharding.psum_rows(X, explicit), want)
    # jax.make_mesh's own default follows the same version boundary (and
    # 0.8.1 to 0.8.3 warn that it will change).
    if _compat.MAKE_MESH_WARNS_ABOUT_DEFAULT:
        with pytest.warns(DeprecationWarning, match="axis_types will change"):
            default = jax.make_mesh((N,), ("i",))
    else:
        default = jax.make_mesh((N,), ("i",))
    assert (default.axis_types == _compat.explicit_axis_types(1)) == (
        _compat.MAKE_MESH_DEFAULTS_TO_EXPLICIT)
    # Fixes: place the input as in_specs says, or use an Auto mesh.
    np.testing.assert_array_equal(sharding.psum_rows_placed(X, explicit), want)
    np.testing.assert_array_equal(
        sharding.psum_rows(X, sharding.make_mesh((N,), ("i",))), want)
    np.testing.assert_array_equal(
        cx.RECIPES["psum"].shard_map(X.reshape(N, -1)), want[None])


def test_pitfall_2_plain_all_gather_fails_the_vma_check(sharding, mesh):
    with pytest.raises(ValueError) as info:
        sharding.gather_plain(X, mesh)
    message = str(info.value)
    assert "out_specs which require replication" in message
    assert "check_vma=False" in message
    np.testing.assert_array_equal(sharding.gather_invariant(X, mesh), X)


def test_pitfall_4_psum_of_an_invariant_value_scales_it(sharding, mesh):
    offset = np.float32(100.0)
    want = sharding.total_numpy(X, offset)  # 120 + 100
    assert want == 220.0
    assert float(sharding.total_wrong(X, offset, mesh)) == 120.0 + N * 100.0
    assert float(sharding.total_right(X, offset, mesh)) == want
    assert float(sharding.total_jit(X, offset, mesh)) == want


def test_pitfall_9_axis_index_groups_need_check_vma_off(sharding, mesh):
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(NotImplementedError) as info:
        sharding.psum_groups_shard_map(X, mesh, groups)
    assert str(info.value) == ""  # no message at all
    want = sharding.group_sums_numpy(X, 2)
    assert want[0] == 0 + 2 + 4 + 6 and want[-1] == 9 + 11 + 13 + 15
    np.testing.assert_array_equal(sharding.psum_groups_as_mesh_axis(X, 2), want)
    np.testing.assert_array_equal(
        sharding.psum_groups_shard_map(X, mesh, groups, check_vma=False), want)
    np.testing.assert_array_equal(
        np.asarray(sharding.psum_with_groups_pmap(X.reshape(N, -1), groups)
                   ).reshape(X.shape), want)
