"""vmap batching: named vmap axes in collectives, next to pmap, shard_map and jit."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax import lax

import collectives as cx
from collectives import _compat
from collectives._registry import core_names
from collectives.hlo import collective_stats
from collectives.testing import assert_forms_agree
from collectives.testing.strategies import exact_values
from collectives.testing.strategies import meshes
from collectives.testing.strategies import recipe_cases
from helpers import load_recipe

# A few examples per test in the ci profile (each new shape compiles three
# forms); the deep profile scales up with it.
FEW = settings(max_examples=max(3, settings.default.max_examples // 4))

CORE = core_names()


@given(data=st.data())
def test_vmap_psum_forms_match_oracle_exactly(data):
    recipe = cx.RECIPES["vmap_psum"]
    case = data.draw(recipe_cases(recipe))
    # At most 8 devices x 3 rows of values in [-8, 8]: every sum is an integer
    # below 256 in magnitude, exact even in bfloat16.
    assert_forms_agree(recipe, *case.args, mesh=case.mesh, axis=case.axis,
                       rtol=0, atol=0)


@FEW
@given(data=st.data())
def test_vmap_center_forms_match_oracle(data):
    recipe = cx.RECIPES["vmap_center"]
    case = data.draw(recipe_cases(recipe, dtypes=("float32", "float16", "bfloat16")))
    # The mean divides by n*k, which rounds: the tolerance policy applies.
    assert_forms_agree(recipe, *case.args, mesh=case.mesh, axis=case.axis)


@pytest.mark.parametrize("name", [*CORE, "vmap_psum", "dp_grads"])
@FEW
@given(data=st.data())
def test_vmap_form_on_one_device_matches_the_oracle(name, data):
    # Every mesh axis becomes a named vmap on the default device; the
    # collectives in the body act on the vmapped axes as on mesh axes.
    recipe = cx.RECIPES[name]
    case = data.draw(recipe_cases(recipe, dtypes=("float32", "int32")))
    forms = {
        "vmap": functools.partial(cx.vmap_form, recipe, mesh=case.mesh,
                                  axis=case.axis),
        "reference": functools.partial(recipe.reference, mesh=case.mesh,
                                       axis=case.axis),
    }
    # Exact values: every sum is an integer well inside every dtype.
    assert_forms_agree(forms, *case.args, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["psum", "all_gather", "psum_scatter",
                                  "ppermute_ring", "vmap_psum"])
def test_vmap_form_agrees_with_pmap_and_shard_map(name):
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    axis = ("j", "i")  # a tuple against mesh order: device numbering matters
    args = recipe.example_args(mesh, axis, exact=True, seed=3)
    forms = {**recipe.forms(mesh, axis),
             "vmap": functools.partial(cx.vmap_form, recipe, mesh=mesh, axis=axis)}
    report = assert_forms_agree(forms, *args, rtol=0, atol=0)
    assert report.forms == ("pmap", "shard_map", "jit", "explicit", "vmap",
                            "reference")


def test_vmap_form_runs_on_a_single_device():
    recipe = cx.RECIPES["vmap_psum"]
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    x = np.arange(32.0).reshape(16, 2)
    out = cx.vmap_form(recipe, x, mesh=mesh)
    assert len(out.devices()) == 1
    np.testing.assert_array_equal(out, x.sum(0))


def test_vmap_form_checks_replicated_outputs():
    # An output declared replicated that differs between vmapped copies is
    # reported, as in the pmap form.
    bad = cx.Recipe(
        name="bad_replicated", summary="", body=lambda x, *, axis: x,
        program=lambda x, *, axes: x, oracle=lambda x, *, axes: x,
        in_specs=lambda axes: (jax.P(axes.entry),), out_specs=lambda axes: jax.P(),
        example_shapes=lambda axes, dims: ((axes.size,),))
    with pytest.raises(cx.ReplicationError, match="vmap output 0 of 1"):
        cx.vmap_form(bad, np.arange(8.0), mesh=cx.make_mesh((8,), "i"))


@given(mesh=meshes(ndim=2), data=st.data())
def test_pmap_of_vmap_matches_a_2d_shard_map(mesh, data):
    # The legacy spelling of a 2-D mesh, pmap over "i" of vmap over "j", and
    # a shard_map over the 2-D mesh run the same body.
    n_i, n_j = mesh.shape["i"], mesh.shape["j"]
    rows = data.draw(st.integers(1, 3))
    x = exact_values(data.draw, (n_i * n_j * rows, 2), "float32")

    def body(block):
        # block: [rows, 2] -> the total over both axes, plus this device's
        # index along (i, j) (row-major: i * n_j + j)
        return lax.psum(block, ("i", "j")) + lax.axis_index(("i", "j"))

    stacked = x.reshape(n_i, n_j, rows, 2)
    legacy = jax.pmap(jax.vmap(body, axis_name="j"), axis_name="i",
                      devices=jax.devices()[:n_i])(stacked)
    modern = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=jax.P(("i", "j")),
                                   out_specs=jax.P(("i", "j"))))(x)
    blocks = x.reshape(n_i * n_j, rows, 2)
    want = blocks.sum(0)[None] + np.arange(n_i * n_j)[:, None, None]
    np.testing.assert_array_equal(np.asarray(legacy).reshape(want.shape), want)
    np.testing.assert_array_equal(np.asarray(modern).reshape(want.shape), want)


def _psum_over_j(mesh):
    # per example: v: [n_j * c] sharded over "j" -> the sum of its blocks [c]
    return jax.shard_map(lambda v: lax.psum(v, "j"), mesh=mesh, in_specs=jax.P("j"),
                         out_specs=jax.P())


@pytest.mark.parametrize("spmd", [None, "i"])
def test_vmap_of_shard_map_with_and_without_spmd_axis_name(spmd):
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    z = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)  # 8 examples of [6]
    f = jax.jit(jax.vmap(_psum_over_j(mesh), spmd_axis_name=spmd))
    if _compat.VMAP_OF_SHARD_MAP_PSUM_FAILS:  # jax-ml/jax#34249 (sharp edge 12)
        with pytest.raises(TypeError, match="axis_index_groups"):
            f(z)
        return
    out = f(z)
    np.testing.assert_array_equal(out, z.reshape(8, 2, 3).sum(1))
    # vmap adds a batch dimension to the shard_map: unsharded, every device
    # computes all 8 examples; with spmd_axis_name="i" the batch is split
    # over "i" and each device computes 2.
    spec = out.sharding.spec
    assert (spec[0] if len(spec) else None) == spmd
    rows = {shard.data.shape[0] for shard in out.addressable_shards}
    assert rows == ({8} if spmd is None else {2})
    # Either way the only collective is the psum over "j".
    assert collective_stats(f, z).nonzero() == {"all-reduce": 1}


@pytest.mark.xfail(raises=(ValueError, AssertionError, TypeError), strict=True,
                   reason="JAX 0.8-0.12: shard_map's varying-axes check rejects "
                          "collectives over a vmapped axis (hence check_vma=False "
                          "in vmap_psum; TypeError where jax-ml/jax#34249 bites); "
                          "strict, so a fixed JAX shows up here")
def test_collective_over_a_vmapped_axis_in_a_checked_shard_map():
    mesh = cx.make_mesh((8,), "i")

    def body(block):
        return jax.vmap(lambda row: lax.psum(row, "example"),
                        axis_name="example")(block)

    f = jax.shard_map(body, mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P("i"),
                      check_vma=True)
    x = np.arange(16.0)
    np.testing.assert_array_equal(jax.jit(f)(x), x.reshape(8, 2).sum(1).repeat(2))


def test_vmap_in_a_checked_shard_map_with_device_axis_collectives():
    # Per-example code inside the body may use collectives over mesh axes
    # with check_vma=True: only the vmapped axis is off limits.
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    x = np.arange(32.0, dtype=np.float32).reshape(16, 2)

    def body(block):
        # block: [2, 2]; each row minus the mean of that row position over devices
        return jax.vmap(lambda row: row - lax.pmean(row, ("i", "j")))(block)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=jax.P(("i", "j")),
                              out_specs=jax.P(("i", "j")), check_vma=True))
    if _compat.VMAP_OF_SHARD_MAP_PSUM_FAILS:  # jax-ml/jax#34249 (sharp edge 12)
        with pytest.raises(TypeError, match="axis_index_groups"):
            f(x)
        return
    blocks = x.reshape(8, 2, 2)
    np.testing.assert_allclose(f(x), (blocks - blocks.mean(0)).reshape(16, 2),
                               rtol=1e-6)


@pytest.mark.parametrize("name", ["vmap_psum", "vmap_center"])
@pytest.mark.parametrize("form", ["shard_map", "jit"])
def test_one_all_reduce_over_devices_and_vmapped_axis(name, form):
    # The vmapped part of the reduction is a local reduce; only the device
    # axes need communication: one all-reduce of one block row.
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    axes = recipe.axes(mesh, None)
    args = recipe.place(*recipe.example_args(mesh, dims=(3, 5)), axes=axes)
    stats = collective_stats(recipe.compiled(form, axes), *args)
    assert stats.nonzero() == {"all-reduce": 1}
    assert stats.ops[0].operand_bytes == 5 * 4  # one row of 5 float32


def test_two_named_axes_at_once_under_pmap_equals_nested_reductions():
    # psum over ("i", "example") == psum over "i" of psum over "example"
    x = np.arange(24.0).reshape(4, 3, 2)  # 4 devices x 3 examples

    def per_device(block, names):
        return jax.vmap(lambda row: lax.psum(row, names), axis_name="example",
                        out_axes=None)(block)

    both = jax.pmap(lambda b: per_device(b, ("i", "example")), axis_name="i",
                    devices=jax.devices()[:4])(x)
    nested = jax.pmap(lambda b: lax.psum(per_device(b, "example"), "i"),
                      axis_name="i", devices=jax.devices()[:4])(x)
    np.testing.assert_array_equal(both, nested)
    np.testing.assert_array_equal(both[0], x.sum((0, 1)))


def test_vmap_axes_rejects_bad_names():
    with pytest.raises(ValueError, match="axis_names: expected distinct"):
        cx.vmap_axes(lambda x: x, ("i", "i"))
    with pytest.raises(ValueError, match="axis_names"):
        cx.vmap_axes(lambda x: x, ())


def test_batching_recipes_refuse_a_mesh_axis_named_like_their_vmap_axis():
    mesh = cx.make_mesh((8,), "example")
    with pytest.raises(ValueError, match="already uses"):
        cx.RECIPES["vmap_psum"].shard_map(np.zeros((8, 2)), mesh=mesh)


def test_vmap_form_rejects_bad_input_like_the_other_forms():
    with pytest.raises(ValueError, match="divisible by 8"):
        cx.vmap_form(cx.RECIPES["vmap_psum"], jnp.zeros((12, 2)),
                     mesh=cx.make_mesh((8,), "i"))


def test_recipe_file_matches_the_library_oracles():
    module = load_recipe("vmap_batching")
    mesh = cx.make_mesh((4,), "i")
    x = np.random.default_rng(1).integers(-8, 9, size=(16, 3)).astype(np.float32)
    total, centred = module.batching_shard_map(x, mesh)
    np.testing.assert_array_equal(total, cx.RECIPES["vmap_psum"].reference(x))
    np.testing.assert_array_equal(centred, cx.RECIPES["vmap_center"].reference(x))
