"""Algebraic laws of the collectives, checked per device inside shard_map."""

import functools

import jax
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import collectives as cx
from collectives import _compat
from collectives.testing.strategies import collective_axes
from collectives.testing.strategies import exact_values
from collectives.testing.strategies import meshes


def _run(body, mesh, axes, x, out_spec=None):
    in_spec = jax.P(axes.entry)
    f = jax.jit(jax.shard_map(functools.partial(body, axis=axes.axis), mesh=mesh,
                              in_specs=in_spec,
                              out_specs=in_spec if out_spec is None else out_spec))
    return np.asarray(f(x))


@st.composite
def cases(draw):
    mesh = draw(meshes())
    axes = cx.RECIPES["psum"].axes(mesh, draw(collective_axes(mesh)))
    n = axes.size
    rows = n * n * draw(st.integers(1, 2))  # blocks split again into n chunks
    x = exact_values(draw, (rows, draw(st.integers(1, 3))), "float32")
    return mesh, axes, x


@given(cases())
def test_all_gather_of_psum_scatter_is_psum(case):
    mesh, axes, x = case

    def body(block, *, axis):
        scattered = lax.psum_scatter(block, axis, tiled=True)
        return _compat.all_gather_invariant(scattered, axis, tiled=True) - lax.psum(
            block, axis)

    np.testing.assert_array_equal(_run(body, mesh, axes, x, jax.P()), 0)


@given(cases(), st.integers(-9, 9))
def test_ring_shift_there_and_back_is_identity(case, k):
    mesh, axes, x = case

    def body(block, *, axis):
        return cx.ring_shift(cx.ring_shift(block, axis, k), axis, -k)

    np.testing.assert_array_equal(_run(body, mesh, axes, x), x)


@given(cases())
def test_pmean_is_psum_over_n(case):
    mesh, axes, x = case

    def body(block, *, axis):
        # n is a power of two, so the division is exact
        return lax.pmean(block, axis) - lax.psum(block, axis) / lax.axis_size(axis)

    np.testing.assert_array_equal(_run(body, mesh, axes, x, jax.P()), 0)


@given(cases())
def test_all_to_all_twice_is_identity(case):
    mesh, axes, x = case
    wide = np.tile(x, (1, axes.size))  # columns must split into n chunks

    def body(block, *, axis):
        there = lax.all_to_all(block, axis, split_axis=1, concat_axis=0, tiled=True)
        return lax.all_to_all(there, axis, split_axis=0, concat_axis=1, tiled=True)

    np.testing.assert_array_equal(_run(body, mesh, axes, wide), wide)


@given(meshes(), st.data())
def test_psum_of_axis_index_is_triangular(mesh, data):
    axes = cx.RECIPES["psum"].axes(mesh, data.draw(collective_axes(mesh)))
    n = axes.size

    def body(block, *, axis):
        return block + lax.psum(lax.axis_index(axis), axis)

    out = _run(body, mesh, axes, np.zeros(n, np.int32))
    assert (out == n * (n - 1) // 2).all()
