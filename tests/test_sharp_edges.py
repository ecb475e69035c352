"""Every sharp edge in docs/sharp_edges.md: the wrong way fails as documented
(the real exception, or the exact wrong number) and the fix agrees with NumPy.

The code under test is the standalone recipes/sharp_edges_*.py files; where a
pitfall behaves differently across JAX versions the test branches on a named
flag in collectives._compat and asserts what this version does.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives import _compat
from helpers import load_recipe

N = 8


@pytest.fixture(scope="module")
def sharding():
    return load_recipe("sharp_edges_sharding")


@pytest.fixture(scope="module")
def grads():
    return load_recipe("sharp_edges_grads")


@pytest.fixture(scope="module")
def ppermute():
    return load_recipe("sharp_edges_ppermute")


@pytest.fixture(scope="module")
def pmap_edges():
    return load_recipe("sharp_edges_pmap")


@pytest.fixture(scope="module")
def rng():
    return load_recipe("sharp_edges_rng")


@pytest.fixture(scope="module")
def nan_edges():
    return load_recipe("sharp_edges_nan")


@pytest.fixture(scope="module")
def mesh():
    return cx.make_mesh((N,), "i")


X = np.arange(2.0 * N, dtype=np.float32)


# -- 1. explicit-axis meshes --------------------------------------------------

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


# -- 2. all_gather then out_specs=P() -------------------------------------------

def test_pitfall_2_plain_all_gather_fails_the_vma_check(sharding, mesh):
    with pytest.raises(ValueError) as info:
        sharding.gather_plain(X, mesh)
    message = str(info.value)
    assert "out_specs which require replication" in message
    assert "check_vma=False" in message
    np.testing.assert_array_equal(sharding.gather_invariant(X, mesh), X)


# -- 3. data-parallel gradients n times too large ----------------------------

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


# -- 4. psum of an invariant value -------------------------------------------

def test_pitfall_4_psum_of_an_invariant_value_scales_it(sharding, mesh):
    offset = np.float32(100.0)
    want = sharding.total_numpy(X, offset)  # 120 + 100
    assert want == 220.0
    assert float(sharding.total_wrong(X, offset, mesh)) == 120.0 + N * 100.0
    assert float(sharding.total_right(X, offset, mesh)) == want
    assert float(sharding.total_jit(X, offset, mesh)) == want


# -- 5. ppermute: zeros for non-destinations, repeated pairs -------------------

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


# -- 6. pmap(out_axes=None) does not check replication ------------------------

def test_pitfall_6_out_axes_none_returns_device_0_unchecked(pmap_edges, mesh):
    sums = pmap_edges.block_sums_numpy(X, N)
    assert len(set(sums.tolist())) == N  # every device holds another value
    assert float(pmap_edges.block_sums_out_axes_none(X, N)) == sums[0] == 1.0
    with pytest.raises(ValueError, match="out_specs which require replication"):
        pmap_edges.block_sums_replicated(X, mesh)
    # The package's pmap form checks declared replication copy by copy.
    bad = cx.Recipe(
        name="block_sum_claimed_replicated", summary="", body=lambda b, *, axis: b,
        program=lambda x, *, axes: x, oracle=lambda x, *, axes: x,
        in_specs=lambda axes: (P(axes.entry),), out_specs=lambda axes: P(),
        example_shapes=lambda axes, dims: ((axes.size,),), check_vma=False)
    with pytest.raises(cx.ReplicationError, match="copy 1 along 'i'"):
        bad.pmap(X.reshape(N, -1)[:, 0], mesh=mesh)


# -- 7. reducing a stacked pmap output outside jit ----------------------------

def test_pitfall_7_sum_of_stacked_pmap_copies(pmap_edges, mesh):
    stacked = pmap_edges.total_pmap_stacked(X, N)
    want = pmap_edges.total_numpy(X)
    assert stacked.shape == (N,)
    assert stacked.sharding.spec == P("i")
    assert float(jnp.sum(stacked)) == N * want == 960.0
    # The migration guide's per-shard reduction does not reproduce here: jnp.sum
    # of the sharded output equals NumPy's sum of the materialised array.
    block_sums = jax.pmap(lambda b: b.sum(), axis_name="i")(X.reshape(N, -1))
    assert float(jnp.sum(block_sums)) == float(np.sum(np.asarray(block_sums))) == want
    mask = np.asarray(block_sums) > 10
    assert float(jnp.mean(block_sums, where=mask)) == float(
        np.mean(np.asarray(block_sums), where=mask))
    assert float(pmap_edges.total_pmap_checked(X, N)) == want
    assert float(pmap_edges.total_shard_map(X, mesh)) == want
    assert float(pmap_edges.total_jit(X, mesh)) == want


# -- 8. partitionable vs non-partitionable threefry ----------------------------

def _noise_program(mesh):
    rows = jax.sharding.NamedSharding(mesh, P("i"))
    x = jax.device_put(np.arange(24, dtype=np.float32), rows)
    fn = jax.jit(lambda key, x: x + jax.random.uniform(key, x.shape),
                 out_shardings=rows)
    return fn, x


def test_pitfall_8_only_the_old_threefry_communicates(mesh):
    hlo = pytest.importorskip("collectives.hlo")
    fn, x = _noise_program(mesh)
    key = jax.random.key(0)
    counts = {}
    for flag in (True, False):
        with jax.threefry_partitionable(flag):
            counts[flag] = hlo.collective_stats(fn, key, x).count(
                "collective-permute")
    assert counts[True] == 0
    assert counts[False] > 0
    assert jax.config.jax_threefry_partitionable  # the context restored it


def test_pitfall_8_the_two_streams_differ(rng, mesh):
    key = jax.random.key(0)
    x = np.arange(24, dtype=np.float32)
    new, new_permutes = rng.noise_jit(key, x, mesh, partitionable=True)
    old, old_permutes = rng.noise_jit(key, x, mesh, partitionable=False)
    assert new_permutes == 0 < old_permutes
    np.testing.assert_array_equal(new, rng.noise_numpy(key, x, True))
    np.testing.assert_array_equal(old, rng.noise_numpy(key, x, False))
    assert not np.isclose(new, old).any()
    np.testing.assert_allclose(new[:3] - x[:3], [0.9477, 0.9786, 0.3323], atol=1e-4)
    np.testing.assert_allclose(old[:3] - x[:3], [0.6434, 0.1819, 0.0224], atol=1e-4)
    assert jax.config.jax_threefry_partitionable


# -- 9. axis_index_groups under check_vma=True ---------------------------------

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


# -- 10. ppermute over a tuple of axes out of mesh order -----------------------

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


# -- 11. a cross-device max or min drops NaN -----------------------------------

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
