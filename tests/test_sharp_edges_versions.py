"""guides/sharp_edges_versions.py: each single-release bug bites exactly where
collectives._compat says, and its workaround agrees with NumPy on every JAX."""

import jax
import numpy as np
import pytest

from collectives import _compat
from helpers import load_recipe

N = 8


@pytest.fixture(scope="module")
def edges():
    return load_recipe("sharp_edges_versions")


@pytest.fixture(scope="module")
def rows():
    return np.random.default_rng(0).integers(-9, 10, (3, 4 * N)).astype(np.float32)


@pytest.fixture(scope="module")
def blocks():
    return np.random.default_rng(1).integers(-9, 10, (2 * N, N)).astype(np.float32)


def test_pitfall_12_vmap_of_shard_map_psum(edges, mesh, rows):
    want = edges.batched_total_numpy(rows)
    if _compat.VMAP_OF_SHARD_MAP_PSUM_FAILS:  # JAX 0.8.1, jax-ml/jax#34249
        with pytest.raises(TypeError, match="axis_index_groups"):
            edges.batched_total_shard_map(rows, mesh)
    else:
        np.testing.assert_array_equal(
            np.asarray(edges.batched_total_shard_map(rows, mesh)), want)
    for got in (edges.batched_total_fixed(rows, mesh),
                edges.batched_total_jit(rows, mesh)):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_pitfall_13_psum_scatter_negative_dimension(edges, mesh, blocks):
    want = edges.scatter_last_numpy(blocks, N)
    if _compat.PSUM_SCATTER_ACCEPTS_NEGATIVE_DIMENSION:
        np.testing.assert_array_equal(
            np.asarray(edges.scatter_last_shard_map(blocks, mesh, dim=-1)), want)
        np.testing.assert_array_equal(edges.scatter_last_pmap(blocks, N, dim=-1),
                                      want)
    else:  # before JAX 0.11, jax-ml/jax#20125
        with pytest.raises(ValueError, match="scatter_dimension"):
            edges.scatter_last_shard_map(blocks, mesh, dim=-1)
        with pytest.raises(ValueError, match="scatter_dimension"):
            edges.scatter_last_pmap(blocks, N, dim=-1)
    fixed = edges.scatter_last_fixed(blocks, mesh, dim=-1)
    np.testing.assert_array_equal(np.asarray(fixed), want)
    assert fixed.sharding.spec == jax.sharding.PartitionSpec(None, "i")
    np.testing.assert_array_equal(edges.scatter_last_pmap(blocks, N, dim=1), want)
    np.testing.assert_array_equal(np.asarray(edges.scatter_last_jit(blocks, mesh)),
                                  want)


def test_error_line_names_the_exception(edges, mesh, rows):
    assert edges.error_line(edges.batched_total_fixed, rows, mesh) is None
    line = edges.error_line(edges.scatter_last_shard_map, rows, mesh, dim=5)
    assert line is not None and line.startswith(("ValueError", "TypeError"))
