"""Collective matmuls: all-gather matmul and matmul reduce-scatter, plain and
overlapped on a ring (one way and both ways), equal to ``x @ w`` exactly on
integer-valued data, in every form; the compiled programs hold the expected
collectives."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import collectives as cx
from collectives.hlo import collective_stats
from collectives.testing import assert_forms_agree
from collectives.testing.strategies import meshes
from collectives.testing.strategies import recipe_cases
from helpers import load_recipe

ALLGATHER = ("allgather_matmul", "allgather_matmul_overlapped",
             "allgather_matmul_bidirectional")
SCATTER = ("matmul_reduce_scatter", "matmul_reduce_scatter_overlapped",
           "matmul_reduce_scatter_bidirectional")
NAMES = ALLGATHER + SCATTER
OVERLAP = {"": None, "overlapped": "unidirectional", "bidirectional": "bidirectional"}

# Values in [-8, 8] and contractions of at most 3 * 8 terms: every partial sum
# is an integer below 2048 in magnitude, exact in float16, float32 and int32.
# bfloat16 holds integers exactly only up to 256, so it is left out here and
# checked within the tolerance policy below.
EXACT_DTYPES = ("float32", "int32", "float16")


def _examples(ci: int) -> int:
    """``ci`` examples per test by default; the deep profile's count under it."""
    if settings.get_current_profile_name() == "deep":
        return settings().max_examples
    return min(ci, settings().max_examples)


def _overlap(name: str):
    return OVERLAP[name.split("matmul")[-1].split("scatter")[-1].strip("_")]


def test_overlap_is_read_from_the_name():
    assert [_overlap(n) for n in NAMES] == [None, "unidirectional", "bidirectional"] * 2


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=_examples(3))
@given(data=st.data())
def test_forms_equal_x_at_w_exactly(name, data):
    recipe = cx.RECIPES[name]
    case = data.draw(recipe_cases(recipe, dtypes=EXACT_DTYPES))
    x, w = case.args
    report = assert_forms_agree(recipe, x, w, mesh=case.mesh, axis=case.axis,
                                rtol=0, atol=0)
    np.testing.assert_array_equal(report.results["reference"], x @ w)


@settings(max_examples=_examples(2))
@given(mesh=meshes(ndim=1), seed=st.integers(0, 2**16),
       dtype=st.sampled_from(["float32", "bfloat16"]), scatter=st.booleans())
def test_ring_versions_agree_with_the_collective_within_policy(mesh, seed, dtype,
                                                                scatter):
    # Gaussian data rounds: each ring version adds its partial products in
    # its own order, so all three must agree with the oracle within the
    # tolerance policy, not bit for bit.
    names = SCATTER if scatter else ALLGATHER
    args = cx.RECIPES[names[2]].example_args(mesh, dtype=dtype, seed=seed)
    for name in names:
        assert_forms_agree(cx.RECIPES[name], *args, mesh=mesh)


def _shard_map(fn, mesh, in_specs, out_specs, **kwargs):
    return jax.jit(jax.shard_map(functools.partial(fn, axis="i", **kwargs),
                                 mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def test_bidirectional_needs_even_blocks():
    mesh = cx.make_mesh((4,), "i")
    f = _shard_map(cx.allgather_matmul, mesh, (jax.P("i"), jax.P(None, "i")),
                   jax.P(None, "i"), overlap="bidirectional")
    with pytest.raises(ValueError, match=r"even number of rows, got 3.*unidirectional"):
        f(np.ones((12, 2)), np.ones((2, 4)))


def test_bad_overlap_and_mismatched_blocks_are_clear_errors():
    mesh = cx.make_mesh((4,), "i")
    f = _shard_map(cx.allgather_matmul, mesh, (jax.P("i"), jax.P(None, "i")),
                   jax.P(None, "i"), overlap="ring")
    with pytest.raises(ValueError, match=r"overlap: expected one of .* got 'ring'"):
        f(np.ones((8, 2)), np.ones((2, 4)))
    g = _shard_map(cx.matmul_reduce_scatter, mesh, (jax.P(None, "i"), jax.P("i")),
                   jax.P("i"))
    with pytest.raises(ValueError, match=r"x \(8, 1\) and w \(2, 3\)"):
        g(np.ones((8, 4)), np.ones((8, 3)))
    with pytest.raises(ValueError, match="6 rows, which must split into 4"):
        g(np.ones((6, 4)), np.ones((4, 3)))


def test_recipe_rejects_shapes_that_do_not_shard():
    recipe = cx.RECIPES["allgather_matmul"]
    with pytest.raises(ValueError, match=r"argument x.*dimension 0 has size 6"):
        recipe.shard_map(np.ones((6, 2)), np.ones((2, 8)))


def test_recipes_reject_blocks_their_bodies_cannot_take():
    # The recipes run the file's bodies, which do not check; the recipes'
    # validate facts refuse what the public utilities refuse, in every form.
    mesh = cx.make_mesh((4,), "i")
    bidirectional = cx.RECIPES["allgather_matmul_bidirectional"]
    for form in ("pmap", "shard_map", "jit", "reference"):
        with pytest.raises(ValueError, match=r"even number of rows, got 3"):
            getattr(bidirectional, form)(np.ones((12, 2)), np.ones((2, 4)), mesh=mesh)
    scatter = cx.RECIPES["matmul_reduce_scatter_bidirectional"]
    with pytest.raises(ValueError, match=r"even number of rows, got 1"):
        scatter.shard_map(np.ones((4, 4)), np.ones((4, 3)), mesh=mesh)
    with pytest.raises(ValueError, match="6 rows, which must split into 4"):
        cx.RECIPES["matmul_reduce_scatter"].shard_map(np.ones((6, 4)), np.ones((4, 3)),
                                                      mesh=mesh)
    with pytest.raises(ValueError, match=r"x \(8, 4\) and w \(8, 3\)"):
        cx.RECIPES["matmul_reduce_scatter_overlapped"].shard_map(
            np.ones((8, 4)), np.ones((8, 3)), mesh=mesh)


# -- HLO ------------------------------------------------------------------------

@pytest.mark.parametrize(("shape", "names", "axis"),
                         [((8,), ("i",), None), ((4, 2), ("i", "j"), "i")])
@pytest.mark.parametrize("name", NAMES)
def test_shard_map_collectives(name, shape, names, axis):
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh(shape, names)
    axes = recipe.axes(mesh, axis)
    args = recipe.example_args(mesh, axis, dims=(1, 2, 3))
    stats = collective_stats(recipe.compiled("shard_map", axes),
                             *recipe.place(*args, axes=axes))
    n = axes.size
    overlap = _overlap(name)
    if overlap is None:
        kind = "all-gather" if name in ALLGATHER else "reduce-scatter"
        assert stats.nonzero() == {kind: 1}
        return
    steps = (n - 1) * (2 if overlap == "bidirectional" else 1)
    assert stats.nonzero() == {"collective-permute": steps}
    # Each step moves one x block (all-gather) or one partial sum (scatter),
    # halved when both directions share the work.
    (x, w) = args
    if name in ALLGATHER:
        block = x.nbytes // n
    else:
        block = x.shape[0] // n * w.shape[1] * x.itemsize
    per_step = block // 2 if overlap == "bidirectional" else block
    assert stats.bytes() == steps * per_step


@pytest.mark.parametrize("name", ["allgather_matmul", "matmul_reduce_scatter"])
def test_jit_form_uses_the_plain_collective(name):
    # The jit form is the global x @ w; XLA:CPU does not decompose it into
    # permutes. The sharded sum is an all-reduce on CPU (see tests/test_hlo.py).
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((8,), "i")
    axes = recipe.axes(mesh)
    args = recipe.example_args(mesh)
    stats = collective_stats(recipe.compiled("jit", axes),
                             *recipe.place(*args, axes=axes))
    if name == "allgather_matmul":
        assert stats.nonzero() == {"all-gather": 1}
    else:
        assert sum(stats.counts().values()) == 1
        assert stats.count("reduce-scatter") + stats.count("all-reduce") == 1


@pytest.mark.parametrize("name", NAMES)
def test_explicit_form_uses_the_plain_collective_whatever_the_overlap(name):
    # The explicit program says the collective in the types (a reshard, an
    # out_sharding); a ring schedule has no spelling there. Over the minor
    # axis of a 2-D mesh the reshard's all-gather lands in the output's
    # layout, with no permute after it (the jit form needs one).
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    axes = recipe.axes(mesh, "j")
    args = recipe.example_args(mesh, "j", dims=(1, 2, 3))
    stats = collective_stats(recipe.compiled("explicit", axes),
                             *recipe.place(*args, axes=axes, form="explicit"))
    if name in ALLGATHER:
        assert stats.nonzero() == {"all-gather": 1}
    else:  # an all-reduce on CPU, then a permute into the output layout
        assert stats.count("collective-permute") <= 1
        assert stats.count("reduce-scatter") + stats.count("all-reduce") == 1
        assert sum(stats.counts().values()) - stats.count("collective-permute") == 1


def test_recipe_file_agrees_with_the_library():
    module = load_recipe("collective_matmul")
    mesh = cx.make_mesh((8,), "i")
    rng = np.random.default_rng(6)
    x = rng.integers(-8, 9, size=(16, 24)).astype(np.float32)
    w = rng.integers(-8, 9, size=(24, 16)).astype(np.float32)
    outs = module.matmuls_shard_map(x, w, mesh)
    outs_explicit = module.matmuls_explicit(
        x, w, module.make_mesh(8, jax.sharding.AxisType.Explicit))
    for name, got, got_explicit in zip(NAMES, outs, outs_explicit, strict=True):
        want = cx.RECIPES[name].reference(x, w, mesh=mesh)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_explicit, want)


@pytest.mark.parametrize("name,dims", [("allgather_matmul", (16, 4096, 64)),
                                       ("matmul_reduce_scatter", (32, 2048, 128))])
def test_the_tolerance_follows_the_contraction_length(name, dims):
    # Each output element sums K products: the count of roundings grows with
    # K, not with the example shapes' K <= 3 (check --dims 256 1024 failed).
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((8,), "i")
    axes = recipe.axes(mesh)
    args = recipe.example_args(mesh, dims=dims)
    assert recipe.n_terms(axes) == recipe.n_terms(axes, recipe.example_args(mesh))
    assert recipe.n_terms(axes, args) >= np.shape(args[0])[1]
    (row,) = cx.check([name], configs=[((8,), ("i",), None)], dims=dims)
    assert row.ok, row.detail
