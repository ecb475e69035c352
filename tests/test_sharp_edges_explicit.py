"""The sharp edges of ``guides/sharp_edges_explicit.py`` (Explicit mesh axes:
rolls, ambiguous dots, with_sharding_constraint, unreduced values, shard_maps
manual over part of a mesh or over another mesh than the context's): the wrong
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
from collectives.hlo import collective_stats
from helpers import load_recipe

N = 8
X = np.arange(2.0 * N, dtype=np.float32)  # [16]
A = np.arange(4.0 * N, dtype=np.float32).reshape(2, -1)  # [2, 16]
B = np.ones((2 * N, 3), dtype=np.float32)  # [16, 3]
Y = np.arange(8.0 * N, dtype=np.float32).reshape(8, 8)  # [8@X, 8@Y] on mesh_2d


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
        # NotImplementedError (0.10.1 to 0.11.2), JaxRuntimeError (0.12.0.1),
        # RuntimeError (0.12.1): each names the unreduced state
        with pytest.raises((NotImplementedError, RuntimeError), match=r"[Uu]nreduced"):
            np.asarray(out)
    np.testing.assert_array_equal(
        np.asarray(edges.partial_products_reduced(A, B, mesh)), want)


@pytest.fixture(scope="module")
def mesh_2d(edges):
    return edges.make_explicit_mesh((4, 2), ("X", "Y"))


def test_pitfall_19_partial_manual_shard_map_gathers_the_free_axis(edges, mesh_2d):
    want = edges.sum_over_x_numpy(Y, 4)
    assert want[:, 0].tolist() == [96.0, 128.0]
    partial = edges.sum_over_x_partial_manual(mesh_2d)
    placed = jax.device_put(Y, jax.sharding.NamedSharding(mesh_2d, P("X", "Y")))
    stats = collective_stats(partial, placed)
    (reduce,) = [op for op in stats.ops if op.kind == "all-reduce"]
    assert reduce.mesh_axes(mesh_2d) == ("X",)
    if _compat.PARTIAL_MANUAL_GATHERS_FREE_AXES:  # JAX 0.10.1 to 0.11.1
        assert stats.nonzero() == {"all-gather": 1, "all-reduce": 1}
        (gather,) = [op for op in stats.ops if op.kind == "all-gather"]
        assert gather.mesh_axes(mesh_2d) == ("Y",)
        assert stats.ops.index(gather) < stats.ops.index(reduce)
        assert reduce.operand_bytes == 2 * 8 * 4  # f32[2, 8]: "Y" gathered
        assert edges.collectives_in(partial, Y, mesh_2d) == [
            ("all-gather", "f32[2,8]"), ("all-reduce", "f32[2,8]")]
    else:
        assert stats.nonzero() == {"all-reduce": 1}
        assert reduce.operand_bytes == 2 * 4 * 4  # f32[2, 4]: "Y" kept sharded
        assert edges.collectives_in(partial, Y, mesh_2d) == [
            ("all-reduce", "f32[2,4]")]
    for fix in (edges.sum_over_x_fully_manual, edges.sum_over_x_jit):
        fixed = collective_stats(fix(mesh_2d), placed)
        assert fixed.nonzero() == {"all-reduce": 1}, fix.__name__
        assert fixed.ops[0].mesh_axes(mesh_2d) == ("X",)
        assert fixed.ops[0].operand_bytes == 2 * 4 * 4, fix.__name__
        assert edges.collectives_in(fix(mesh_2d), Y, mesh_2d) == [
            ("all-reduce", "f32[2,4]")]
    for program in (partial, edges.sum_over_x_fully_manual(mesh_2d),
                    edges.sum_over_x_jit(mesh_2d)):
        got = edges.on_both_axes(program, Y, mesh_2d)
        np.testing.assert_array_equal(np.asarray(got), want)
        assert got.sharding.spec == P(None, "Y")


@pytest.fixture
def global_mesh(mesh):
    # What a program that begins with jax.set_mesh(mesh) runs under; undone
    # after the test.
    setting = jax.set_mesh(mesh)
    yield mesh
    setting.__exit__(None, None, None)


def test_pitfall_20_shard_map_over_another_mesh_than_the_global_one(
        edges, mesh_2d, global_mesh):
    with pytest.raises(ValueError, match="should match the mesh passed to shard_map"
                       ) as info:
        edges.total_shard_map(X, mesh_2d)
    message = str(info.value)
    assert "The context mesh AbstractMesh('i': 8" in message
    assert "Mesh('X': 4, 'Y': 2" in message
    for fix in (edges.total_shard_map_scoped, edges.total_shard_map_context_mesh):
        got = fix(X, mesh_2d)
        np.testing.assert_array_equal(np.asarray(got), [X.sum()])
        assert got.sharding.mesh.shape == mesh_2d.shape
        # the global mesh is the context again after the with
        assert jax.sharding.get_abstract_mesh() == global_mesh.abstract_mesh
    # over the global mesh itself there is nothing to match
    np.testing.assert_array_equal(np.asarray(edges.total_shard_map(X, global_mesh)),
                                  [X.sum()])


def test_pitfall_20_needs_a_context_mesh(edges, mesh_2d):
    # No mesh set: the same call runs (the pitfall is the mismatch).
    assert jax.sharding.get_abstract_mesh().empty
    np.testing.assert_array_equal(np.asarray(edges.total_shard_map(X, mesh_2d)),
                                  [X.sum()])


@pytest.mark.skipif(not _compat.UNREDUCED_GRADIENTS_CHECKED,
                    reason="a reduce_sum of an unreduced value is refused before "
                           "JAX 0.9.1: no deferred gradient to sum")
def test_pitfall_21_a_sum_deferred_over_two_axes_is_one_all_reduce_per_axis(
        edges, mesh_2d):
    w = np.ones((5, 3), np.float32)
    x = np.arange(40.0, dtype=np.float32).reshape(8, 5)  # [8@(X,Y), 5]
    want = np.repeat(x.sum(0)[:, None], 3, axis=1)  # d/dw sum(x @ w)
    assert want[:, 0].tolist() == [140.0, 148.0, 156.0, 164.0, 172.0]
    with jax.set_mesh(mesh_2d):
        inputs = edges.deferred_inputs(w, x, mesh_2d)
        found = {}
        for program in (edges.grad_summed_by_reshard, edges.grad_summed_by_psum):
            f = program(mesh_2d)
            got = f(*inputs)
            np.testing.assert_array_equal(np.asarray(got), want, program.__name__)
            assert got.sharding.spec == P(None, None)
            found[program.__name__] = [
                (op.kind, op.mesh_axes(mesh_2d), op.operand_bytes)
                for op in collective_stats(f, *inputs).ops]
    one = [("all-reduce", ("X", "Y"), 5 * 3 * 4)]
    assert found["grad_summed_by_psum"] == one
    if _compat.UNREDUCED_SUM_PER_AXIS:  # JAX 0.12.1 and later
        assert found["grad_summed_by_reshard"] == [
            ("all-reduce", ("Y",), 5 * 3 * 4), ("all-reduce", ("X",), 5 * 3 * 4)]
    else:
        assert found["grad_summed_by_reshard"] == one


def test_error_line_names_the_exception(edges, mesh):
    assert edges.error_line(edges.roll_auto_axes, X, mesh) is None
    line = edges.error_line(edges.constrain_plain, X, mesh)
    assert line is not None and line.startswith("AssertionError")
