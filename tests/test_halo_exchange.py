"""``recipes/halo_exchange.py``: a stencil on halos equals the stencil on
the padded global array and the NumPy oracle; the compiled program holds
exactly two ppermutes."""


import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import collectives as cx
from collectives.hlo import collective_stats
from helpers import assert_exact_on_a_drawn_case
from helpers import blocked_cases
from helpers import examples
from helpers import load_recipe
from helpers import per_device

HALO = ("halo_exchange", "halo_exchange_open")


@settings(max_examples=examples(6))
@given(blocked_cases(), st.integers(1, 3), st.booleans())
def test_halo_exchange_matches_padding_the_global_array(case, width, periodic):
    mesh, axes, x = case
    rows = x.shape[0] // axes.size
    width = min(width, rows)

    def body(block, *, axis):
        return cx.halo_exchange(block, axis, width, periodic=periodic)

    got = per_device(body, mesh, axes, x).reshape(axes.size, rows + 2 * width, -1)
    mode = "wrap" if periodic else "constant"
    padded = np.pad(x, [(width, width), (0, 0)], mode=mode)
    for d in range(axes.size):
        # device d sees global rows d*rows - width .. (d+1)*rows + width
        np.testing.assert_array_equal(got[d], padded[d * rows:(d + 1) * rows
                                                     + 2 * width])

def test_a_five_point_stencil_on_halos_matches_numpy():
    mesh = cx.make_mesh((4,), "i")
    x = np.arange(16.0) ** 2

    def stencil(block):  # block: [4] -> [4], radius 2
        p = cx.halo_exchange(block, "i", 2, periodic=True)
        return -p[:-4] + 16 * p[1:-3] - 30 * p[2:-2] + 16 * p[3:-1] - p[4:]

    f = jax.jit(jax.shard_map(stencil, mesh=mesh, in_specs=jax.P("i"),
                              out_specs=jax.P("i")))
    want = sum(c * np.roll(x, -s) for c, s in
               zip((-1, 16, -30, 16, -1), (-2, -1, 0, 1, 2), strict=True))
    np.testing.assert_array_equal(np.asarray(f(x)), want)

def test_halo_width_beyond_the_block_is_a_clear_error():
    mesh = cx.make_mesh((4,), "i")
    f = jax.shard_map(lambda b: cx.halo_exchange(b, "i", 3), mesh=mesh,
                      in_specs=jax.P("i"), out_specs=jax.P("i"))
    with pytest.raises(ValueError,
                       match=r"width=3 is more than the 2 rows.*width <= 2"):
        f(np.arange(8.0))
    g = jax.shard_map(lambda b: cx.halo_exchange(b, "i", 0), mesh=mesh,
                      in_specs=jax.P("i"), out_specs=jax.P("i"))
    with pytest.raises(ValueError, match="width: expected an int >= 1, got 0"):
        g(np.arange(8.0))

@pytest.mark.parametrize("form", ["shard_map", "jit", "explicit"])
@pytest.mark.parametrize("name", HALO)
def test_halo_exchange_is_two_permutes(name, form):
    # explicit: the halo in an Auto island compiles as in the jit form
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((8,), "i")
    axes = recipe.axes(mesh)
    args = recipe.example_args(mesh, dims=(2, 3))
    stats = collective_stats(recipe.compiled(form, axes),
                             *recipe.place(*args, axes=axes, form=form))
    # one row of 3 float32 each way
    assert stats.nonzero() == {"collective-permute": 2}
    assert stats.bytes() == 2 * 3 * 4


@pytest.mark.parametrize("name", HALO)
@settings(max_examples=examples(4))
@given(data=st.data())
def test_forms_match_oracle_exactly(name, data):
    # the stencil's |y| <= 32 is exact
    assert_exact_on_a_drawn_case(name, data)


def test_the_recipe_file_agrees_with_the_library():
    mesh = cx.make_mesh((8,), "i")
    x = np.random.default_rng(5).integers(-8, 9, size=(64, 3)).astype(np.float32)
    halo = load_recipe("halo_exchange")
    for name, periodic in (("halo_exchange", True), ("halo_exchange_open", False)):
        want = cx.RECIPES[name].reference(x, mesh=mesh)
        np.testing.assert_array_equal(halo.stencil_shard_map(x, mesh, periodic), want)
        np.testing.assert_array_equal(halo.stencil_explicit(
            x, halo.make_mesh(8, jax.sharding.AxisType.Explicit), periodic), want)
