"""Gradient averaging: dp_grads in every form, the n-times trap and its fixes,
tree_pmean, and data-parallel SGD that keeps every device's params identical."""


import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax import lax

import collectives as cx
from collectives import _compat
from collectives._facts import dp_grads as _grads
from collectives.hlo import collective_stats
from collectives.testing import assert_forms_agree
from collectives.testing.strategies import recipe_cases
from helpers import load_recipe

FEW = settings(max_examples=max(3, settings.default.max_examples // 4))
RECIPE = cx.RECIPES["dp_grads"]


def _ints(rng, *shape):
    return rng.integers(-8, 9, size=shape).astype(np.float32)


def _problem(n, rows_per_device=4, d=3, o=2, seed=0):
    # Integer values and batch * o a power of two: every form is exact.
    rng = np.random.default_rng(seed)
    batch = n * rows_per_device
    return {"w": _ints(rng, d, o), "b": _ints(rng, o)}, _ints(rng, batch, d), \
        _ints(rng, batch, o)


def _assert_grads_equal(got, want, factor=1.0):
    assert set(got) == {"w", "b"}
    for name in ("w", "b"):
        np.testing.assert_array_equal(np.asarray(got[name]), factor * want[name],
                                      err_msg=name)


@given(data=st.data())
def test_dp_grads_is_exact_on_integer_data(data):
    case = data.draw(recipe_cases(RECIPE, dtypes=("float32",)))
    # Values in [-8, 8]: residuals below 2**8, gradient sums below 2**16, and
    # batch * outputs a power of two, so every form and the oracle are exact.
    assert_forms_agree(RECIPE, *case.args, mesh=case.mesh, axis=case.axis,
                       rtol=0, atol=0)


@FEW
@given(data=st.data(), dtype=st.sampled_from(["float32", "float16", "bfloat16"]))
def test_dp_grads_within_the_tolerance_policy(data, dtype):
    case = data.draw(recipe_cases(RECIPE, dtypes=("float32",)))
    args = RECIPE.example_args(case.mesh, case.axis, dtype=dtype,
                               seed=data.draw(st.integers(0, 2**16)), dims=(2, 3))
    assert_forms_agree(RECIPE, *args, mesh=case.mesh, axis=case.axis)


def test_dp_grads_is_bitwise_the_same_however_the_batch_is_split():
    params, x, y = _problem(8)
    want = RECIPE.reference(params, x, y)
    layouts = (((8,), ("i",), None), ((4, 2), ("i", "j"), None),
               ((2, 4), ("i", "j"), ("j", "i")), ((2,), ("i",), None))
    for shape, names, axis in layouts:
        mesh = cx.make_mesh(shape, names)
        for form in cx.FORMS:
            got = getattr(RECIPE, form)(params, x, y, mesh=mesh, axis=axis)
            _assert_grads_equal(got, want)


def _literal_port(mesh, check_vma=True):
    # The pmap body as is: grad inside, then pmean.
    def body(params, xb, yb):
        return cx.tree_pmean(jax.grad(_grads.mse)(params, xb, yb), "i")

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(jax.P(), jax.P("i"),
                                                            jax.P("i")),
                                 out_specs=jax.P(), check_vma=check_vma))


def _grad_of_shard_map(mesh):
    # Fix 1: differentiate the data-parallel program.
    loss = jax.shard_map(lambda p, xb, yb: lax.pmean(_grads.mse(p, xb, yb), "i"),
                         mesh=mesh, in_specs=(jax.P(), jax.P("i"), jax.P("i")),
                         out_specs=jax.P())
    return jax.jit(jax.grad(loss))


def _pvary_first(mesh):
    # Fix 2: cast the replicated params to varying, then grad is local.
    def body(params, xb, yb):
        local = jax.tree_util.tree_map(lambda p: _compat.pvary(p, "i"), params)
        return cx.tree_pmean(jax.grad(_grads.mse)(local, xb, yb), "i")

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(jax.P(), jax.P("i"),
                                                            jax.P("i")),
                                 out_specs=jax.P()))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_literal_pmap_port_is_n_times_too_large_and_both_fixes_are_right(n):
    mesh = cx.make_mesh((n,), "i")
    params, x, y = _problem(n)
    want = RECIPE.reference(params, x, y)  # the closed-form NumPy gradient
    # Inside shard_map the P() params are invariant; using them with varying
    # data casts them to varying, and that cast transposes to a psum: grad
    # returns the SUM over devices, which pmean leaves unchanged.
    _assert_grads_equal(_literal_port(mesh)(params, x, y), want, factor=n)
    _assert_grads_equal(_grad_of_shard_map(mesh)(params, x, y), want)
    _assert_grads_equal(_pvary_first(mesh)(params, x, y), want)
    # Without the type system (check_vma=False) the literal port means what it
    # meant under pmap.
    _assert_grads_equal(_literal_port(mesh, check_vma=False)(params, x, y), want)


def test_the_trap_sums_the_gradients_twice():
    mesh = cx.make_mesh((8,), "i")
    params, x, y = _problem(8)
    grad_bytes = 4 * (params["w"].size + params["b"].size)

    def all_reduced_bytes(fn):
        stats = collective_stats(fn, params, x, y)
        assert set(stats.nonzero()) == {"all-reduce"}
        return sum(op.operand_bytes for op in stats.ops)

    # The fixes all-reduce the gradients once (XLA may merge dw and db into
    # one op; in grad-of-shard_map the forward pmean of the loss is dead).
    assert all_reduced_bytes(_grad_of_shard_map(mesh)) == grad_bytes
    assert all_reduced_bytes(_pvary_first(mesh)) == grad_bytes
    # The literal port all-reduces them twice: the psum that transposes the
    # implicit cast (the sum over devices), then pmean's psum of that
    # invariant sum (n copies of it, divided by n).
    assert all_reduced_bytes(_literal_port(mesh)) == 2 * grad_bytes


@pytest.mark.parametrize("form", ["shard_map", "jit", "explicit"])
def test_dp_grads_all_reduces_the_gradients_once(form):
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    axes = RECIPE.axes(mesh, None)
    params, x, y = _problem(8, d=5, o=4)
    stats = collective_stats(RECIPE.compiled(form, axes),
                             *RECIPE.place(params, x, y, axes=axes, form=form))
    # dw [5, 4] and db [4] travel together in one all-reduce; nothing else.
    # From JAX 0.12.1 the explicit form's deferred sum over ("i", "j") is one
    # all-reduce per axis (pitfall 21 of sharp_edges_explicit.py).
    if form == "explicit" and _compat.UNREDUCED_SUM_PER_AXIS:
        assert [(op.kind, op.group_size) for op in stats.ops] == [
            ("all-reduce", 2), ("all-reduce", 4)]
    else:
        assert stats.nonzero() == {"all-reduce": 1}
    assert {op.operand_bytes for op in stats.ops} == {4 * (5 * 4 + 4)}


def test_tree_pmean_averages_any_pytree():
    tree = {"a": np.arange(16.0).reshape(8, 2), "n": [np.arange(8, dtype=np.int32),
                                                       np.ones((8, 1, 3))]}
    want = jax.tree_util.tree_map(lambda v: v.reshape(8, 1, *v.shape[1:]).mean(0),
                                  tree)
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    f = jax.jit(jax.shard_map(lambda t: cx.tree_pmean(t, ("i", "j")), mesh=mesh,
                              in_specs=jax.P(("i", "j")), out_specs=jax.P()))
    legacy = jax.pmap(lambda t: cx.tree_pmean(t, "i"), axis_name="i")(
        jax.tree_util.tree_map(lambda v: v.reshape(8, 1, *v.shape[1:]), tree))
    for got in (f(tree), jax.tree_util.tree_map(lambda v: v[0], legacy)):
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        for g, w in zip(jax.tree_util.tree_leaves(got),
                        jax.tree_util.tree_leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(g), w)  # exact: 8 divides
    # Integer leaves become floats, as with lax.pmean.
    assert np.asarray(f(tree)["n"][0]).dtype == np.float32


def test_dp_grads_rejects_parameters_that_do_not_fit():
    params, x, y = _problem(8)
    mesh = cx.make_mesh((8,), "i")
    with pytest.raises(TypeError, match="params must be a dict with keys 'w' and 'b'"):
        RECIPE.shard_map({"w": params["w"]}, x, y, mesh=mesh)
    with pytest.raises(ValueError, match=r"disagree; expected w: \[d, o\]"):
        RECIPE.jit({"w": params["w"], "b": np.zeros(3, np.float32)}, x, y, mesh=mesh)
    with pytest.raises(ValueError, match="do not fit the linear model"):
        RECIPE.pmap(params, x[:, 0], y, mesh=mesh)


def test_recipe_file_matches_the_library_oracle():
    module = load_recipe("dp_grads")
    params, x, y = module.example(4)
    want = RECIPE.reference(params, x, y)
    mesh = cx.make_mesh((4,), "i")
    _assert_grads_equal(module.dp_grads_shard_map(params, x, y, mesh), want)
    _assert_grads_equal(module.dp_grads_of_shard_map(params, x, y, mesh), want)


@pytest.mark.skipif(
    not _compat.UNREDUCED_GRADIENTS_CHECKED,
    reason=f"JAX {jax.__version__}: reduced/unreduced gradient types are not "
           "checked on this release (checked from "
           f"{'.'.join(map(str, _compat.UNREDUCED_GRADIENTS_CHECKED_SINCE))})")
def test_deferred_gradient_sum_all_reduces_half_the_bytes_of_two_microbatches():
    module = load_recipe("dp_grads")
    mesh = jax.make_mesh((8,), ("i",), axis_types=_compat.explicit_axis_types(1))
    params, x, y = _problem(8, d=5, o=4)
    xs, ys = (a.reshape(2, -1, a.shape[-1]) for a in (x, y))  # 2 microbatches
    want = RECIPE.reference(params, x, y)
    grad_bytes = 4 * (5 * 4 + 4)  # dw [5, 4] and db [4], float32
    with jax.set_mesh(mesh):
        placed = (jax.sharding.reshard(params, jax.P()),
                  *jax.sharding.reshard((xs, ys), jax.P(None, "i")))
        sent = {}
        for name, program in (("each", module.dp_grads_microbatches_program),
                              ("deferred", module.dp_grads_deferred_program)):
            fn = jax.jit(program)
            _assert_grads_equal(fn(*placed), want)
            stats = collective_stats(fn, *placed)
            assert set(stats.nonzero()) == {"all-reduce"}, (name, stats.nonzero())
            assert sum(op.operand_bytes for op in stats.ops) == grad_bytes * (
                2 if name == "each" else 1), name
            sent[name] = stats.bytes("all-reduce")
    assert sent["deferred"] == sent["each"] / 2, sent
    _assert_grads_equal(
        module.dp_grads_microbatches_explicit(params, xs, ys, mesh), want)


def test_the_recipe_files_version_switch_is_compats():
    from collectives import _compat
    from collectives.recipes import dp_grads as file

    assert file.DEFERRED_SUM_SINCE == _compat.UNREDUCED_GRADIENTS_CHECKED_SINCE
