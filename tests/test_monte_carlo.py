"""Monte Carlo chains: keys from one key, bitwise-identical samples in every
form, estimates inside their confidence intervals, and sharded RNG in HLO."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import collectives as cx
from collectives.hlo import collective_stats
from collectives.recipes import monte_carlo as mc
from collectives.testing import assert_forms_agree
from collectives.testing.strategies import collective_axes
from collectives.testing.strategies import meshes
from collectives.testing.strategies import recipe_cases

# Each new shape compiles a sampler in three forms: a few examples in ci.
FEW = settings(max_examples=max(3, settings.default.max_examples // 4))
Z = 6.0  # confidence intervals: +- 6 standard errors (two-sided tail 2e-9)


def _key_data(keys):
    return np.asarray(jax.random.key_data(keys))


def _random_bits(key, size, *, partitionable=True):
    """``jax.random.bits(key, (size,), uint32)`` in NumPy, from the recipe
    file's threefry2x32. Partitionable: hash the 64-bit counter ``(hi, lo)`` of
    each element. Not: hash the counters ``iota(size)`` (padded to even) cut
    in halves, and concatenate the two output words."""
    if partitionable:
        counts = np.arange(size, dtype=np.uint64)
        y0, y1 = mc.threefry2x32(key, (counts >> np.uint64(32)).astype(np.uint32),
                                 counts.astype(np.uint32))
        return y0 ^ y1
    counts = np.arange(size + size % 2, dtype=np.uint32)
    counts[size:] = 0  # an odd count is padded with one zero
    half = counts.shape[0] // 2
    y0, y1 = mc.threefry2x32(key, counts[:half], counts[half:])
    return np.concatenate([y0, y1])[:size]


def _uniform(key, size, *, partitionable=True):
    """``jax.random.uniform(key, (size,))`` (float32 in ``[0, 1)``) in NumPy."""
    bits = _random_bits(key, size, partitionable=partitionable)
    one = np.uint32(np.float32(1.0).view(np.uint32))
    return ((bits >> np.uint32(9)) | one).view(np.float32) - np.float32(1.0)


def _old_split(key, n):
    """``jax.random.split(key, n)`` without ``jax_threefry_partitionable``:
    the counters ``iota(2 n)`` cut in halves."""
    counts = np.arange(2 * n, dtype=np.uint32)
    y0, y1 = mc.threefry2x32(key, counts[:n], counts[n:])
    return np.concatenate([y0, y1]).reshape(n, 2)


@FEW
@given(data=st.data())
def test_metropolis_forms_match_the_numpy_stream(data):
    recipe = cx.RECIPES["metropolis"]
    case = data.draw(recipe_cases(recipe, dtypes=("float32", "int32", "bfloat16")))
    report = assert_forms_agree(recipe, *case.args, mesh=case.mesh, axis=case.axis)
    # The samples are integers computed from the same random bits: every form
    # equals the NumPy re-implementation of JAX's stream bit for bit.
    want = report.results["reference"][2]
    for form in cx.FORMS:
        np.testing.assert_array_equal(report.results[form][2], want, err_msg=form)


def test_samples_do_not_depend_on_the_mesh():
    recipe = cx.RECIPES["metropolis"]
    x0 = np.random.default_rng(0).integers(-8, 9, size=(24, 3)).astype(np.float32)
    # One device, no mesh: vmap over jax.random.split(key, C), which equals
    # fold_in(key, c) under the default jax_threefry_partitionable.
    keys = jax.random.split(jax.random.key(mc.SEED), 24)
    one_device = np.asarray(jax.jit(jax.vmap(mc.run_chain))(
        keys, mc.initial_states(jnp.asarray(x0))))
    for shape, names, axis in (((8,), ("i",), None), ((4, 2), ("i", "j"), ("j", "i"))):
        mesh = cx.make_mesh(shape, names)
        samples = recipe.shard_map(x0, mesh=mesh, axis=axis)[2]
        np.testing.assert_array_equal(samples, one_device, err_msg=str(shape))
    # Split and shard: the keys made on the host, passed in sharded like x0.
    mesh = cx.make_mesh((8,), "i")
    sharded = jax.jit(jax.shard_map(
        lambda k, x: jax.vmap(mc.run_chain)(k, mc.initial_states(x)), mesh=mesh,
        in_specs=(jax.P("i"), jax.P("i")), out_specs=jax.P("i")))
    np.testing.assert_array_equal(sharded(keys, x0), one_device)


@FEW
@given(mesh=meshes(), data=st.data())
def test_chain_and_device_keys_equal_split_and_the_numpy_stream(mesh, data):
    axes = cx.RECIPES["psum"].axes(mesh, data.draw(collective_axes(mesh)))
    k = data.draw(st.integers(1, 3))
    key = jax.random.key(data.draw(st.integers(0, 2**31 - 1)))

    def body():
        chains = jax.random.key_data(cx.chain_keys(key, axes.axis, k))  # [k, 2]
        device = jax.random.key_data(cx.device_key(key, axes.axis))[None]
        return chains, device

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(),
                              out_specs=(jax.P(axes.entry), jax.P(axes.entry))))
    chains, devices = (np.asarray(a) for a in f())
    n = axes.size
    np.testing.assert_array_equal(chains, _key_data(jax.random.split(key, n * k)))
    np.testing.assert_array_equal(chains, _key_data(mc.all_chain_keys(key, n * k)))
    np.testing.assert_array_equal(chains, mc.fold_in_numpy(_key_data(key),
                                                           np.arange(n * k)))
    np.testing.assert_array_equal(devices, _key_data(jax.random.split(key, n)))


def test_chain_keys_under_pmap_match_shard_map():
    key = jax.random.key(11)
    legacy = jax.pmap(lambda _: jax.random.key_data(cx.chain_keys(key, "i", 3)),
                      axis_name="i")(np.zeros(8))
    np.testing.assert_array_equal(np.asarray(legacy).reshape(24, 2),
                                  _key_data(jax.random.split(key, 24)))


def _law_after_steps(n_steps):
    """Exact distribution of a chain started at 0 after n_steps (transition matrix
    of the integer test in the recipe file's step: accept iff u * den < num * 2**24)."""
    h, scale = mc.HALF_WIDTH, 2 ** 24
    n = 2 * h
    moves = np.zeros((n + 1, n + 1))
    for j in range(n + 1):
        for up, num, den in ((True, n - j, j + 1), (False, j, n - j + 1)):
            accept = min(scale, -(-num * scale // den)) / scale  # count of u / 2**24
            if accept:
                moves[j, j + 1 if up else j - 1] += 0.5 * accept
            moves[j, j] += 0.5 * (1 - accept)
    law = np.zeros(n + 1)
    law[h] = 1.0
    return law @ np.linalg.matrix_power(moves, n_steps), np.arange(n + 1) - h


def test_metropolis_estimates_land_in_their_confidence_intervals():
    recipe = cx.RECIPES["metropolis"]
    chains, coords = 8 * 512, 8
    x0 = np.zeros((chains, coords), np.float32)
    mean, var, samples = (np.asarray(a) for a in
                          recipe.shard_map(x0, mesh=cx.make_mesh((8,), "i")))
    # The exact law after N_STEPS steps from 0: symmetric (mean 0), variance
    # within 1e-3 of the target's h / 2 = 4 (the chain mixes in ~10 steps).
    law, support = _law_after_steps(mc.N_STEPS)
    law_var = law @ support ** 2
    law_m4 = law @ support ** 4
    assert abs(law @ support) < 1e-12
    assert abs(law_var - mc.TARGET_VARIANCE) < 1e-3
    # chains * coords independent samples (one per chain and coordinate).
    m = chains * coords
    mean_half = Z * math.sqrt(law_var / m)
    # var is per coordinate over `chains` samples; their average over coords
    # is a variance estimate from m samples: standard error sqrt((m4 - v**2) / m).
    var_half = Z * math.sqrt((law_m4 - law_var ** 2) / m)
    assert abs(float(np.mean(mean)) - mc.TARGET_MEAN) <= mean_half
    assert abs(float(np.mean(var)) - law_var) <= var_half
    # The same intervals hold straight from the samples.
    assert abs(float(samples.mean())) <= mean_half
    assert abs(float(samples.astype(np.float64).var()) - law_var) <= var_half


@pytest.mark.parametrize("form", ["shard_map", "jit"])
def test_metropolis_communicates_only_its_two_statistics(form):
    recipe = cx.RECIPES["metropolis"]
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    axes = recipe.axes(mesh, None)
    args = recipe.place(*recipe.example_args(mesh, dims=(2, 3)), axes=axes)
    stats = collective_stats(recipe.compiled(form, axes), *args)
    # Sampling is per chain, no communication; the mean, then the variance
    # (which needs the mean), are each one all-reduce of a [3] float32 row.
    assert stats.nonzero() == {"all-reduce": 2}
    assert [op.operand_bytes for op in stats.ops] == [12, 12]


def test_sharded_rng_compiles_without_collective_permute():
    # The seed document's example: a sharded x plus uniform noise of its shape.
    mesh = cx.make_mesh((8,), "i")
    x = jax.device_put(np.arange(24.0, dtype=np.float32),
                       jax.NamedSharding(mesh, jax.P("i")))
    key = jax.random.key(0)
    raw = _key_data(key)
    results = {}
    for partitionable in (True, False):
        # The flag changes only inside this block (restored on exit).
        with jax.threefry_partitionable(partitionable):
            f = jax.jit(lambda key, x: x + jax.random.uniform(key, x.shape))
            stats = collective_stats(f, key, x)
            results[partitionable] = np.asarray(f(key, x))
        want = np.arange(24.0, dtype=np.float32) + _uniform(
            raw, 24, partitionable=partitionable)
        np.testing.assert_array_equal(results[partitionable], want)
        if partitionable:
            # Each device hashes its own counters: no communication at all.
            assert stats.nonzero() == {}
        else:
            # The old stream hashes counter pairs that live on different
            # devices, so the partitioner moves them around.
            assert stats.count("collective-permute") > 0
    assert jax.config.jax_threefry_partitionable is True
    # The two streams are different numbers for the same key.
    assert not np.any(results[True] == results[False])


def test_split_equals_fold_in_only_under_the_partitionable_stream():
    key = jax.random.key(5)
    folded = _key_data(mc.all_chain_keys(key, 6))
    np.testing.assert_array_equal(_key_data(jax.random.split(key, 6)), folded)
    with jax.threefry_partitionable(False):
        old = _key_data(jax.random.split(key, 6))
    np.testing.assert_array_equal(old, _old_split(_key_data(key), 6))
    assert not np.array_equal(old, folded)


def test_chain_keys_rejects_a_bad_chain_count():
    key = jax.random.key(0)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="n_local: expected the number of chains"):
            cx.chain_keys(key, "i", bad)


def test_the_recipe_files_version_switch_is_compats():
    from collectives import _compat
    from collectives.recipes import monte_carlo as file

    assert file.EXPLICIT_KEYS_SINCE == _compat.EXPLICIT_KEYS_RESHARD_SINCE
