"""guides/migrate_pmap.py: each pmap idiom equals its replacement and NumPy."""


import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives import _compat
from collectives.testing import assert_replicated
from collectives.testing import assert_sharded_as
from helpers import load_recipe


@pytest.fixture(scope="module")
def mig():
    return load_recipe("migrate_pmap")


@pytest.fixture(scope="module")
def mesh():
    return cx.make_mesh((8,), "i")


@pytest.fixture(scope="module", params=[0, 1])
def data(request, mig):
    return mig.example_data(seed=request.param)


def test_in_axes_none_is_an_in_spec_p(mig, mesh, data):
    x, w, *_ = data
    want = mig.scale_numpy(w, x)
    before = mig.scale_pmap(w, x)
    after = mig.scale_shard_map(w, x, mesh)
    np.testing.assert_array_equal(np.asarray(before), want)
    np.testing.assert_array_equal(np.asarray(after), want)
    np.testing.assert_array_equal(np.asarray(mig.scale_jit(w, x, mesh)), want)
    assert_sharded_as(after, mesh, P("i"))


def test_out_axes_none_is_an_out_spec_p(mig, mesh, data):
    x, *_ = data
    want = mig.total_numpy(x)
    np.testing.assert_array_equal(np.asarray(mig.total_pmap(x)), want)
    after = mig.total_shard_map(x, mesh)
    np.testing.assert_array_equal(np.asarray(after), want)
    np.testing.assert_array_equal(np.asarray(mig.total_jit(x, mesh)), want)
    assert_replicated(after)  # every device holds the sum, bit for bit


def test_nested_pmap_raises_and_the_2d_mesh_replaces_it(mig, data):
    x, *_ = data
    error = mig.nested_pmap_error(x)
    assert (error is None) == _compat.NESTED_PMAP_SUPPORTED
    assert "should match the mesh passed to shard_map" in str(error)
    mesh2d = cx.make_mesh(mig.GRID, ("i", "j"))
    rows_want, total_want = mig.grid_sums_numpy(x)
    for rows, total in (mig.grid_sums_pmap(x), mig.grid_sums_shard_map(x, mesh2d)):
        np.testing.assert_array_equal(np.asarray(rows), rows_want)
        np.testing.assert_array_equal(np.asarray(total), total_want)


def test_legacy_device_put_stacks_one_entry_per_device(mig):
    devices = jax.devices()[:8]
    shards = [np.full((2, 3), d, np.float32) for d in range(8)]
    stacked = mig.legacy_device_put_sharded(shards, devices)
    assert stacked.shape == (8, 2, 3)
    for shard in stacked.addressable_shards:
        d = devices.index(shard.device)
        np.testing.assert_array_equal(np.asarray(shard.data)[0], shards[d])
    copies = mig.legacy_device_put_replicated(np.arange(3.0, dtype=np.float32),
                                              devices)
    assert copies.shape == (8, 3)  # stacked copies, not a replicated [3]
    np.testing.assert_array_equal(np.asarray(mig.unreplicate(copies)),
                                  np.arange(3.0))


# jax.device_put_sharded warns from 0.8.1 until it is gone (0.10).
@pytest.mark.filterwarnings("ignore:jax.device_put_sharded is deprecated")
def test_legacy_device_put_matches_jax_where_it_still_exists(mig):
    try:
        device_put_sharded = jax.device_put_sharded
    except AttributeError:
        pytest.skip("jax.device_put_sharded was removed in this JAX version")
    devices = jax.devices()[:8]
    shards = [np.full((2,), d, np.float32) for d in range(8)]
    ours = mig.legacy_device_put_sharded(shards, devices)
    theirs = device_put_sharded(shards, devices)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert ({s.device: np.asarray(s.data).tolist() for s in ours.addressable_shards}
            == {s.device: np.asarray(s.data).tolist()
                for s in theirs.addressable_shards})


def test_device_put_replaces_the_stacking_functions(mig, mesh, data):
    _, _, features, targets, params = data
    placed, x, y = mig.place(params, features, targets, mesh)
    assert_replicated(placed["w"])
    assert placed["w"].shape == (3,)  # no device axis
    assert_sharded_as(x, mesh, P("i"))
    assert_sharded_as(y, mesh, P("i"))


def test_training_pairs_agree_with_numpy_and_unreplicate_is_not_needed(
        mig, mesh, data):
    _, _, features, targets, params = data
    want = mig.train_numpy(params, features, targets, 5)
    before = mig.train_pmap(params, features, targets, 5)
    after = mig.train_shard_map(params, features, targets, mesh, 5)
    jitted = mig.train_jit(params, features, targets, mesh, 5)
    for got in (before, after, jitted):
        for leaf in ("w", "b"):
            # float32 sums in different orders: a few roundings per step
            np.testing.assert_allclose(np.asarray(got[leaf]), want[leaf],
                                       rtol=2e-5, atol=2e-6)
    # unreplicate gave pmap's [3]; the shard_map result already is one [3],
    # the same on every device.
    assert before["w"].shape == after["w"].shape == (3,)
    assert_replicated(after["w"])


def test_donate_argnums_consumes_the_parameters_in_every_form(mig, mesh, data):
    _, _, features, targets, params = data
    devices = jax.devices()[:8]
    stacked = mig.legacy_device_put_replicated(params, devices)
    xs = mig.legacy_device_put_sharded(np.split(features, 8), devices)
    ys = mig.legacy_device_put_sharded(np.split(targets, 8), devices)
    new_stacked = mig.make_step_pmap()(stacked, xs, ys)
    assert stacked["w"].is_deleted()

    placed, x, y = mig.place(params, features, targets, mesh)
    new_placed = mig.make_step_shard_map(mesh)(placed, x, y)
    assert placed["w"].is_deleted()

    again, x, y = mig.place(params, features, targets, mesh)
    new_jit = mig.make_step_jit()(again, x, y)
    assert again["w"].is_deleted()

    one = mig.unreplicate(new_stacked)
    for leaf in ("w", "b"):
        np.testing.assert_allclose(np.asarray(one[leaf]),
                                   np.asarray(new_placed[leaf]), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(new_jit[leaf]),
                                   np.asarray(new_placed[leaf]), rtol=1e-6, atol=1e-7)
