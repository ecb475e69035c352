"""guides/migrate_removed_apis.py: each removed or deprecated API that old
tutorials teach is gone (or fails) as the guide says, and its replacement
agrees with NumPy."""

import inspect

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives.hlo import collective_stats
from helpers import load_recipe

N = 8
old_api = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def mig():
    return load_recipe("migrate_removed_apis")


@pytest.fixture(scope="module")
def mesh():
    return cx.make_mesh((N,), "i")


@pytest.fixture(scope="module")
def grid(mig):
    return cx.make_mesh(mig.GRID, ("a", "b"))


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(3).integers(1, 9, (4 * N, 3)).astype(np.float32)


def test_xmap_and_positional_sharding_are_gone(mig):
    assert mig.legacy("xmap") is None
    assert mig.legacy("PositionalSharding") is None
    with pytest.raises(ValueError, match="unknown name"):
        mig.legacy("nope")


def test_xmap_becomes_shard_map_or_named_vmap(mig, mesh, x):
    want = mig.normalise_numpy(x)
    got = mig.normalise_shard_map(x, mesh)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    assert got.sharding.spec == P("i")
    np.testing.assert_allclose(np.asarray(mig.normalise_vmap(x)), want, rtol=1e-6)


def test_positional_sharding_becomes_named_sharding(mig, grid):
    square = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    placed = mig.place_grid(square, grid)
    assert placed.sharding == NamedSharding(grid, P("a", "b"))
    out = mig.sin_keeps_layout(square, grid)
    assert out.sharding.spec == P("a", "b")
    np.testing.assert_allclose(np.asarray(out), np.sin(square), rtol=1e-6)
    prod = mig.dot_rows_by_cols(square, square.T, grid)
    np.testing.assert_allclose(np.asarray(prod), square @ square.T, rtol=1e-6)
    assert prod.sharding.spec == P("a", "b")
    y = jax.device_put(square, NamedSharding(grid, P("a", None)))
    z = jax.device_put(square.T, NamedSharding(grid, P(None, "b")))
    assert collective_stats(jax.jit(jax.numpy.dot), y, z).nonzero() == {}


@old_api
def test_pjit_becomes_jit(mig, mesh, x):
    after = mig.scale_jit(x, mesh)
    np.testing.assert_array_equal(np.asarray(after), 2 * x)
    assert after.sharding.spec == P("i")
    if mig.legacy("pjit") is not None:
        before = mig.scale_pjit(x, mesh)
        np.testing.assert_array_equal(np.asarray(before), 2 * x)
        assert before.sharding == after.sharding


@old_api
def test_experimental_shard_map_and_check_rep_become_jax_shard_map(mig, mesh, x):
    want = mig.send_numpy(x, N, mig.ring(N))
    after = mig.ring_shift_shard_map(x, mesh, check_vma=False)
    np.testing.assert_array_equal(np.asarray(after), want)
    assert "check_rep" not in inspect.signature(jax.shard_map).parameters
    with pytest.raises(TypeError, match="check_rep"):
        mig.ring_shift_shard_map(x, mesh, check_rep=False)
    if mig.legacy("experimental_shard_map") is not None:
        np.testing.assert_array_equal(
            np.asarray(mig.ring_shift_experimental(x, mesh)), want)


@old_api
def test_psend_precv_become_ppermute(mig, mesh, x):
    pairs = [(0, 1), (5, 2)]
    np.testing.assert_array_equal(np.asarray(mig.send_ppermute(x, mesh, pairs)),
                                  mig.send_numpy(x, N, pairs))
    if mig.legacy("psend") is not None and jax.default_backend() == "cpu":
        with pytest.raises(NotImplementedError, match="only implemented on GPU"):
            mig.send_psend(x, mesh, pairs)
