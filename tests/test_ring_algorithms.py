"""``recipes/ring_algorithms.py``: all-reduce, all-gather and reduce-scatter
from ppermute, equal to the native collectives and to the NumPy oracle; the
compiled programs hold exactly the ppermutes the algorithms call for."""


import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax import lax

import collectives as cx
from collectives import _compat
from collectives._facts.ring_algorithms import RING_OF
from collectives.hlo import bytes_moved
from collectives.hlo import collective_stats
from helpers import assert_exact_on_a_drawn_case
from helpers import blocked_cases
from helpers import examples
from helpers import load_recipe
from helpers import per_device

RING = ("ring_all_reduce", "ring_all_gather", "ring_reduce_scatter")
MIRRORS = {ring: native for native, ring in RING_OF.items()}


@pytest.mark.parametrize("name", RING)
@settings(max_examples=examples(4))
@given(data=st.data())
def test_forms_match_oracle_exactly(name, data):
    assert_exact_on_a_drawn_case(name, data)


def test_every_ring_recipe_names_its_native_collective():
    assert set(MIRRORS) == set(RING)


@pytest.mark.parametrize("name", RING)
def test_ring_recipes_take_the_native_layouts(name):
    ring, native = cx.RECIPES[name], cx.RECIPES[MIRRORS[name]]
    axes = ring.axes(cx.make_mesh((4, 2), ("i", "j")), "i")
    assert ring.in_specs(axes) == native.in_specs(axes)
    assert ring.out_specs(axes) == native.out_specs(axes)
    assert ring.example_shapes(axes, (2, 3)) == native.example_shapes(axes, (2, 3))
    assert MIRRORS[name] in ring.summary


@settings(max_examples=examples(6))
@given(blocked_cases(rows_split_n_ways=True))
def test_ring_collectives_equal_the_native_ones_on_every_device(case):
    mesh, axes, x = case

    def body(block, *, axis):
        return (cx.ring_all_reduce(block, axis) - lax.psum(block, axis),
                cx.ring_all_gather(block, axis)
                - _compat.all_gather_invariant(block, axis, tiled=True),
                cx.ring_reduce_scatter(block, axis)
                - lax.psum_scatter(block, axis, tiled=True))

    # Differences on every device, not only on the copy an out_spec of P()
    # would return: the ring results are replicated in value on every device.
    for diff in per_device(body, mesh, axes, x):
        np.testing.assert_array_equal(diff, 0)


def test_ring_reduce_scatter_needs_rows_that_split():
    mesh = cx.make_mesh((4,), "i")
    f = jax.shard_map(lambda b: cx.ring_reduce_scatter(b, "i"), mesh=mesh,
                      in_specs=jax.P("i"), out_specs=jax.P("i"))
    with pytest.raises(ValueError, match=r"shape \(3, 1\).*4 equal chunks"):
        f(np.ones((12, 1)))


def test_ring_all_reduce_pads_blocks_that_do_not_split():
    # 3 elements per device over 8 devices: padded to 8, same sum.
    mesh = cx.make_mesh((8,), "i")
    x = np.arange(24).reshape(8, 3)
    f = jax.jit(jax.shard_map(lambda b: cx.ring_all_reduce(b, "i"), mesh=mesh,
                              in_specs=jax.P("i"), out_specs=jax.P("i"),
                              check_vma=False))
    np.testing.assert_array_equal(np.asarray(f(x)), np.tile(x.sum(0), (8, 1)))


# -- HLO: the ring is made of permutes, and only of permutes -------------------

HLO_CONFIGS = [((8,), ("i",), None), ((4, 2), ("i", "j"), "i"),
               ((4, 2), ("i", "j"), ("j", "i"))]


def _shard_map_stats(name, shape, names, axis):
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh(shape, names)
    axes = recipe.axes(mesh, axis)
    args = recipe.example_args(mesh, axis, dims=(2, 3))
    block = args[0].nbytes // (axes.size * axes.others_size)
    stats = collective_stats(recipe.compiled("shard_map", axes),
                             *recipe.place(*args, axes=axes))
    return stats, axes.size, block


@pytest.mark.parametrize(("shape", "names", "axis"), HLO_CONFIGS)
def test_ring_all_reduce_is_2_n_minus_1_permutes_and_no_all_reduce(shape, names,
                                                                  axis):
    stats, n, block = _shard_map_stats("ring_all_reduce", shape, names, axis)
    assert stats.nonzero() == {"collective-permute": 2 * (n - 1)}
    # 6 floats per device split into n chunks (padded): the bytes of the
    # bandwidth-optimal all-reduce when n divides the block, just over otherwise
    chunk = -(-block // 4 // n) * 4
    assert stats.bytes() == 2 * (n - 1) * chunk
    assert stats.bytes() >= bytes_moved("all-reduce", block, n)


@pytest.mark.parametrize(("shape", "names", "axis"), HLO_CONFIGS)
@pytest.mark.parametrize("name", ["ring_all_gather", "ring_reduce_scatter"])
def test_ring_gather_and_scatter_are_n_minus_1_permutes(name, shape, names, axis):
    stats, n, block = _shard_map_stats(name, shape, names, axis)
    assert stats.nonzero() == {"collective-permute": n - 1}
    # the same bytes as the native collective's cost model
    if name == "ring_all_gather":
        assert stats.bytes() == pytest.approx(bytes_moved("all-gather", n * block, n))
    else:
        assert stats.bytes() == pytest.approx(bytes_moved("reduce-scatter", block, n))


def test_recipe_files_agree_with_the_library():
    mesh = cx.make_mesh((8,), "i")
    x = np.random.default_rng(5).integers(-8, 9, size=(64, 3)).astype(np.float32)
    rings = load_recipe("ring_algorithms")
    reduced, gathered, scattered = rings.rings_shard_map(x, mesh)
    for name, got in (("ring_all_reduce", reduced), ("ring_all_gather", gathered),
                      ("ring_reduce_scatter", scattered)):
        np.testing.assert_array_equal(got, cx.RECIPES[name].reference(x, mesh=mesh))
