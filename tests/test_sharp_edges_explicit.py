"""The sharp edges of ``recipes/sharp_edges_explicit.py`` (Explicit mesh axes:
rolls, ambiguous dots, with_sharding_constraint, unreduced values): the wrong
way fails as docs/sharp_edges.md says (the real exception, or the exact wrong
number) and the fix agrees with NumPy. Where a pitfall behaves differently
across JAX versions the test branches on a named flag in collectives._compat.
"""

import jax
import numpy as np
import pytest
from jax._src.core import ShardingTypeError  # no public name in any release
from jax.sharding import PartitionSpec as P

from collectives import _compat
from helpers import load_recipe

N = 8
X = np.arange(2.0 * N, dtype=np.float32)  # [16]
A = np.arange(4.0 * N, dtype=np.float32).reshape(2, -1)  # [2, 16]
B = np.ones((2 * N, 3), dtype=np.float32)  # [16, 3]


@pytest.fixture(scope="module")
def edges():
    return load_recipe("sharp_edges_explicit")


@pytest.fixture(scope="module")
def mesh(edges):
    return edges.make_explicit_mesh((N,), ("i",))


def test_pitfall_14_roll_along_a_sharded_dimension(edges, mesh):
    with pytest.raises(ShardingTypeError) as info:
        edges.roll_plain(X, mesh)
    message = str(info.value)
    if _compat.JAX_VERSION >= (0, 11, 0):  # measured: 0.10.2 the old, 0.11.0 the new
        assert "cannot be sharded on the axis being rolled over" in message
    else:
        assert "slicing on sharded dims where out dim (1)" in message
    want = edges.roll_numpy(X)
    assert want[0] == 15.0 and want[1] == 0.0
    for got in (edges.roll_auto_axes(X, mesh), edges.roll_shard_map(X, mesh)):
        np.testing.assert_array_equal(np.asarray(got), want)
        assert got.sharding.spec == P("i")


def test_pitfall_15_dot_over_sharded_contracting_dimensions(edges, mesh):
    with pytest.raises(ShardingTypeError, match="Contracting dimensions are sharded "
                       "and it is ambiguous") as info:
        edges.matmul_plain(A, B, mesh)
    assert "out_sharding" in str(info.value)
    want = edges.matmul_numpy(A, B)
    got = edges.matmul_out_sharding(A, B, mesh)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert got.sharding.is_fully_replicated
    np.testing.assert_array_equal(edges.matmul_pmap(A, B, N), want)


def test_pitfall_16_with_sharding_constraint_is_an_assertion(edges, mesh):
    with pytest.raises(AssertionError, match="acts as an assert") as info:
        edges.constrain_plain(X, mesh)
    assert "jax.sharding.reshard" in str(info.value)
    got = edges.constrain_reshard(X, mesh)
    np.testing.assert_array_equal(np.asarray(got), 2 * X)
    assert got.sharding.is_fully_replicated


def test_pitfall_17_unreduced_round_trip(edges, mesh):
    got = np.asarray(edges.unreduced_round_trip(X, mesh))
    if _compat.UNREDUCED_RESHARD_SCALES_BY_N:  # JAX 0.8.0 and 0.8.1
        np.testing.assert_array_equal(got, N * X)  # [0, 8, 16, ..., 120]
    else:
        np.testing.assert_array_equal(got, X)
    np.testing.assert_array_equal(np.asarray(edges.replicate_directly(X, mesh)), X)
    np.testing.assert_array_equal(
        np.asarray(edges.partial_products_reduced(A, B, mesh)),
        edges.matmul_numpy(A, B))


def test_pitfall_18_unreduced_array_out_of_jit(edges, mesh):
    want = edges.matmul_numpy(A, B)
    assert want[:, 0].tolist() == [120.0, 376.0]
    out = edges.partial_products_returned(A, B, mesh)
    assert out.sharding.spec.unreduced == {"i"}
    if _compat.UNREDUCED_OUTPUT_READS_ONE_DEVICE:  # up to JAX 0.10.0
        # device 0's partial product: columns 0 and 1 of A times ones
        np.testing.assert_array_equal(np.asarray(out), A[:, :2] @ B[:2])
        assert np.asarray(out)[:, 0].tolist() == [1.0, 33.0]
    else:
        with pytest.raises((NotImplementedError, jax.errors.JaxRuntimeError),
                           match=r"[Uu]nreduced"):
            np.asarray(out)
    np.testing.assert_array_equal(
        np.asarray(edges.partial_products_reduced(A, B, mesh)), want)


def test_error_line_names_the_exception(edges, mesh):
    assert edges.error_line(edges.roll_auto_axes, X, mesh) is None
    line = edges.error_line(edges.constrain_plain, X, mesh)
    assert line is not None and line.startswith("AssertionError")
