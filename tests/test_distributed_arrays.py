"""guides/distributed_arrays.py: layouts, constraints and committed arrays."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from collectives.hlo import collective_stats
from collectives.testing import assert_replicated
from collectives.testing import assert_sharded_as
from helpers import load_recipe


@pytest.fixture(scope="module")
def rec():
    return load_recipe("distributed_arrays")


@pytest.fixture(scope="module")
def mesh(rec):
    return rec.make_mesh()


@pytest.fixture(scope="module")
def data(rec):
    return rec.example_data(seed=3)


def test_grid_layout_blocks_and_sin_keeps_it(rec, mesh, data):
    x, _, _ = data
    xs = rec.place_grid(x, mesh)
    assert set(rec.block_shapes(xs).values()) == {(16, 16)}
    assert len(rec.block_shapes(xs)) == 8
    y, same = rec.sin_keeps_layout(xs)
    assert same
    assert_sharded_as(y, mesh, P("a", "b"))
    np.testing.assert_allclose(np.asarray(y), rec.sin_numpy(x), rtol=1e-6, atol=1e-6)
    # Elementwise: no collective at all.
    assert collective_stats(jax.jit(jnp.sin), xs).count() == 0


def test_row_times_column_blocks_need_no_communication(rec, mesh, data):
    _, y, z = data
    yp, zp = rec.place_for_dot(y, z, mesh)
    stats = collective_stats(jax.jit(jnp.dot), yp, zp)
    assert stats.count() == 0, stats
    assert rec.collectives_in(jax.jit(jnp.dot), yp, zp) == []
    out = rec.dot_jit(yp, zp)
    assert_sharded_as(out, mesh, P("a", "b"))
    want = rec.dot_numpy(y, z)
    np.testing.assert_array_equal(np.asarray(out), want)
    np.testing.assert_array_equal(np.asarray(rec.dot_shard_map(y, z, mesh)), want)
    np.testing.assert_array_equal(np.asarray(rec.dot_pmap(y, z)), want)


def test_sharding_constraints_force_the_layout(rec, mesh, data):
    x, _, _ = data
    xs = rec.place_grid(x, mesh)
    want = 2 * rec.sin_numpy(x)
    transposed = rec.sin_then_transposed_layout(mesh)(xs)
    assert_sharded_as(transposed, mesh, P("b", "a"))
    np.testing.assert_allclose(np.asarray(transposed), want, rtol=1e-6, atol=1e-6)
    replicate = rec.sin_then_replicated(mesh)
    out = replicate(xs)
    assert_replicated(out)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=1e-6)
    # Getting every block everywhere takes all-gathers, and the recipe's
    # substring check agrees with the HLO accounting.
    stats = collective_stats(replicate, xs)
    assert stats.count("all-gather") >= 1
    assert rec.collectives_in(replicate, xs) == sorted(
        stats.nonzero(), key=rec.COLLECTIVE_OPS.index)


def test_committed_arrays_on_different_devices_raise(rec, data):
    x, _, _ = data
    devices = jax.devices()
    error = rec.mix_committed(x[:4, :4], devices)
    assert isinstance(error, ValueError)
    assert "incompatible devices" in str(error)
    error = rec.mix_device_orders(x[:8, :4], devices[:8])
    assert isinstance(error, ValueError)
    assert "incompatible devices" in str(error)


def test_uncommitted_arrays_follow_the_committed_one(rec, data):
    x, _, _ = data
    devices = jax.devices()
    out, committed, zeros_committed = rec.mix_uncommitted(x[:4, :4], devices)
    assert committed and not zeros_committed
    assert out.devices() == {devices[1]}
    np.testing.assert_array_equal(np.asarray(out), x[:4, :4])
