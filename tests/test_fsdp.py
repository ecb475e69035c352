"""FSDP (ZeRO-3) and FSDP x TP: loss and gradients equal one device's
``jax.value_and_grad`` and the NumPy oracle, come back sharded like the
parameters, and compile to per-layer all-gathers and reduce-scatters."""

import functools
import re

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import collectives as cx
from collectives import _compat
from collectives._facts.fsdp import N_LAYERS
from collectives._facts.fsdp import fsdp_term_norms
from collectives.hlo import collective_stats
from collectives.recipes import fsdp as file
from collectives.testing import assert_forms_agree
from collectives.testing import tolerance
from collectives.testing.strategies import recipe_cases
from helpers import assert_loss_and_grads_match
from helpers import documented_deferred_bytes
from helpers import examples
from helpers import jit_form_replaced

NAMES = ("fsdp_mlp", "fsdp_tp_mlp")
RTOL, ATOL = 1e-5, 1e-5  # float32 through eight chained matmuls of width <= 16

# A case the deep profile drew (mesh 2x4, float32): integers up to 8 through
# four layers of width 8 reach 10**6, and gradient w1[5, 1] = -24571.5 cancels
# from such terms, so float32 rounds it by 3.5: more than an atol scaled by
# the largest input (8) allows, well within one scaled by the root-sum-square
# of its terms.
CANCELLING = {
    "b1": "0 -1 -1 -6 0 -8 -6 0",
    "b2": "0 0 8 0 3 0 0 1",
    "b3": "0 -8 1 6 0 8 -5 0",
    "b4": "0 0 0 0 0 0 0 -8",
    "w1": """
         0  4  5  0  0 -7 -8  7
         0 -4 -1  5  0  3  2  0
         0 -6  0  8  0 -4  7  0
         0  0 -4 -8  0  3 -6  0
         0 -8 -5 -7  0 -1  6  0
         0 -5  4  8  0 -3  4 -6
         0  3 -4 -5  0 -6 -6  0
         0 -5  0 -1  0  0  0 -5
    """,
    "w2": """
         0  0  0  0  0  0  0  0
         0  0  0  0  7  2  0 -8
         0  0  0  0 -2  0  0 -7
         0  0 -3  0  4  0  0  8
         0  0  0  0  0  0  0  0
         0  0 -4  0  3  4  0  0
         0  0  0  0 -3  0  0  8
         0  5  0  0  7  5  0  0
    """,
    "w3": """
         0  0  0  0  0  0  0  0
         0  7  7 -4  0 -7 -4  4
         0  0 -7  0  0  0 -6  0
         0  0  0  0  3 -5  6 -6
        -8 -5  5  8 -6  4  2  0
         0  8 -8 -5  0 -8  7 -1
         0  0  0  0  0  0  0  0
         0  3  2 -5  2  1  3 -3
    """,
    "w4": """
         0  0  0  0  0  0  0  0
         0  0  0 -4  0  0  0  0
         0  5 -8  7  2  3  8  5
        -1  7  2  1 -5  0  4 -7
        -2  4 -4  5  6 -6  7  7
         6  2 -4  8 -8 -2 -3 -7
        -7 -8  8 -7  3 -8  2  4
         1  0  7 -5  5  8 -1  2
    """,
    "x": """
         7 -1  1  8 -6 -2  7 -1
         0  0  1 -2  3  4 -5  8
        -3  4 -2 -3 -8  3 -4 -7
        -4 -7  6 -2 -5  1  3  0
         0 -7  0 -4 -2  6 -1 -7
         0  0  0  0  0  0  0  0
         0  0  0  0  0  0  0  7
         0  0  0  0  0 -7  0  0
    """,
}



def _gaussian(args, seed):
    # Weights scaled by 1/sqrt(fan_in), as init_mlp does, keep activations O(1).
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda a: (rng.standard_normal(a.shape)
                   / np.sqrt(a.shape[0] if a.ndim == 2 else 4)).astype(a.dtype), args)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=examples(2))
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_forms_equal_one_device_value_and_grad(name, data, seed):
    recipe = cx.RECIPES[name]
    case = data.draw(recipe_cases(recipe, dtypes=("float32",), ndim=(1,)))
    args = _gaussian(case.args, seed)
    report = assert_forms_agree(recipe, *args, mesh=case.mesh, axis=case.axis)
    want_loss, want = jax.jit(jax.value_and_grad(cx.mlp_loss))(*args)
    assert_loss_and_grads_match(report, want_loss, want, rtol=RTOL, atol=ATOL)


def _cancelling_case():
    def parse(text):
        rows = [[float(v) for v in row.split()] for row in text.strip().splitlines()]
        return np.array(rows if len(rows) > 1 else rows[0], np.float32)

    values = {name: parse(text) for name, text in CANCELLING.items()}
    x = values.pop("x")
    return values, x, np.zeros_like(x)


def test_atol_scales_with_the_terms_a_gradient_cancels_from():
    recipe = cx.RECIPES["fsdp_mlp"]
    mesh = cx.make_mesh((2, 4), ("i", "j"))
    args = _cancelling_case()
    report = assert_forms_agree(recipe, *args, mesh=mesh)
    got = np.asarray(report.results["jit"][1]["w1"])[5, 1]
    want = report.results["reference"][1]["w1"][5, 1]
    rtol, unit = tolerance("float32", recipe.n_terms(recipe.axes(mesh)))
    assert want == -24571.5 and abs(got - want) > rtol * abs(want) + unit * 8
    with pytest.raises(AssertionError, match=r"w1'\]: 1 of 64 elements differ"):
        assert_forms_agree({"jit": recipe.forms(mesh)["jit"],
                            "reference": recipe.reference}, *args,
                           n_terms=recipe.n_terms(recipe.axes(mesh)))


@settings(max_examples=examples(10))
@given(data=st.data())
def test_the_term_norms_bound_the_oracle_and_each_other(data):
    # |sum of terms| <= sum of |terms| >= root-sum-square of the terms (the
    # magnitudes), element by element, on drawn integers.
    recipe = cx.RECIPES["fsdp_mlp"]
    case = data.draw(recipe_cases(recipe, dtypes=("float32",)))
    want = recipe.reference(*case.args, mesh=case.mesh, axis=case.axis)
    magnitudes = recipe.term_magnitudes(*case.args, mesh=case.mesh, axis=case.axis)
    sums = fsdp_term_norms(*case.args, power=1)

    def below(small, big):
        np.testing.assert_array_less(np.abs(small), big * (1 + 1e-6) + 1e-9)

    jax.tree_util.tree_map(below, want, sums)
    jax.tree_util.tree_map(below, magnitudes, sums)


def test_one_path_through_the_network_is_one_term():
    # With one nonzero path from x to the output, every loss and gradient
    # element is a single term: its |value|, the sum of |terms| and their
    # root-sum-square agree (the constants 2 and 1/batch squared, then rooted).
    recipe = cx.RECIPES["fsdp_mlp"]
    mesh = cx.make_mesh((8,), ("i",))
    params, x, y = jax.tree_util.tree_map(np.zeros_like, recipe.example_args(mesh))
    x[1, 2] = 3.0
    for layer, (row, col, weight) in enumerate(
            [(2, 0, 2.0), (0, 5, 0.5), (5, 1, 4.0), (1, 3, -1.5)], start=1):
        params[f"w{layer}"][row, col] = weight
    want = recipe.reference(params, x, y, mesh=mesh)
    path = 3.0 * 2.0 * 0.5 * 4.0 * -1.5  # the output (and error), batch of 16
    assert want[1]["w1"][2, 0] == 2 * path / 16 * (path / 2.0)  # != 0: a live path
    for power in (1, 2):
        jax.tree_util.tree_map(
            lambda w, g: np.testing.assert_allclose(g, np.abs(w), rtol=1e-12),
            want, fsdp_term_norms(params, x, y, power=power))


def test_a_ten_percent_error_where_a_gradient_cancels_is_caught():
    # Gaussian data: most gradient elements cancel from far larger terms. A
    # 10 % error in the median element of each gradient still fails, as the
    # per-element atol follows the root-sum-square of its terms (with the sum
    # of |terms|, it passed in 86 % of the elements).
    recipe = cx.RECIPES["fsdp_mlp"]
    config = ((2, 4), ("i", "j"), None)
    mesh = cx.make_mesh(*config[:2])
    grads = recipe.reference(*recipe.example_args(mesh), mesh=mesh)[1]
    for name, grad in grads.items():
        flat = np.abs(grad).ravel()
        index = np.unravel_index(np.argsort(flat)[flat.size // 2], grad.shape)

        def one_off(recipe, axes, name=name, index=index):
            forms = dict(recipe.bound_forms(axes))
            jit = forms["jit"]

            def off(*args):
                loss, got = jit(*args)
                got = {key: np.array(value) for key, value in got.items()}
                got[name][index] *= 1.1
                return loss, got
            forms["jit"] = off
            return forms

        (row,) = cx.check(["fsdp_mlp"], configs=[config], forms=one_off)
        assert not row.ok, name
        assert "jit disagrees with the reference" in row.detail
        assert f"['{name}']: 1 of {grad.size} elements differ" in row.detail


@pytest.mark.parametrize("name", [name for name, recipe in cx.RECIPES.items()
                                  if recipe.magnitudes is not None])
def test_a_bfloat16_check_of_the_mlp_recipes_can_fail(name):
    # The per-element atol carries the terms' sizes, so n_terms counts one
    # path's roundings (16): rtol 0.25 in bfloat16, where a count of every
    # sum's width gave up to 6 and let a form returning zeros pass.
    recipe = cx.RECIPES[name]
    axes = recipe.axes(cx.make_mesh((4, 2), ("i", "j")))
    if recipe.unsupported_reason(axes) is not None:
        pytest.skip(f"{name} does not run over both axes of a 4x2 mesh")
    config = [((4, 2), ("i", "j"), None)]
    (row,) = cx.check([name], dtypes=("bfloat16",), configs=config)
    assert row.ok and not row.skipped
    (row,) = cx.check([name], dtypes=("bfloat16",), configs=config,
                      forms=jit_form_replaced(np.zeros_like))
    assert not row.ok and "jit disagrees with the reference" in row.detail


@pytest.mark.parametrize("name,axis", [("fsdp_mlp", None), ("fsdp_mlp", "j"),
                                       ("fsdp_tp_mlp", None),
                                       ("fsdp_tp_mlp", ("j", "i"))])
def test_gradients_come_back_sharded_like_the_parameters(name, axis):
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    axes = recipe.axes(mesh, axis)
    args = recipe.example_args(mesh, axis)
    specs = recipe.in_specs(axes)[0]
    for form in ("shard_map", "jit"):
        _, grads = recipe.compiled(form, axes)(*recipe.place(*args, axes=axes))
        for key, grad in grads.items():
            want = jax.sharding.NamedSharding(mesh, specs[key])
            assert grad.sharding.is_equivalent_to(want, grad.ndim), (form, key)
            block = grad.addressable_shards[0].data
            assert block.shape == want.shard_shape(grad.shape), (form, key)
            assert block.size < grad.size, (form, key)  # a block, not a copy


def test_fsdp_tp_needs_a_data_and_a_model_axis():
    recipe = cx.RECIPES["fsdp_tp_mlp"]
    mesh = cx.make_mesh((8,), "i")
    args = cx.RECIPES["fsdp_mlp"].example_args(mesh)
    with pytest.raises(ValueError,
                       match=r"needs two collective axes .*\(data, model\)"):
        recipe.shard_map(*args, mesh=mesh)


def test_a_parameter_that_does_not_split_is_named():
    mesh = cx.make_mesh((8,), "i")
    params = cx.init_mlp((8, 12, 16, 16, 8))
    x, y = np.ones((16, 8), np.float32), np.ones((16, 8), np.float32)
    with pytest.raises(ValueError, match=r"params\['b1'\]: dimension 0 has size 12"):
        cx.RECIPES["fsdp_mlp"].jit(params, x, y, mesh=mesh)


# -- HLO --------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_the_program_gathers_each_layer_twice_and_scatters_once(name):
    # The shard_map form as written (StableHLO, before XLA's passes): per
    # layer one all-gather forward and one backward (no gradient flows into
    # x, so layer 1 has none backward), one reduce-scatter per layer; with
    # TP, three all-reduces over the model axis besides the loss's: after W2
    # and W4 forward, out of W3 backward (none out of W1: x has no gradient).
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    axes = recipe.axes(mesh)
    args = recipe.place(*recipe.example_args(mesh), axes=axes)
    text = recipe.compiled("shard_map", axes).lower(*args).as_text()
    assert len(re.findall(r"stablehlo\.all_gather", text)) == 2 * N_LAYERS - 1
    assert len(re.findall(r"stablehlo\.reduce_scatter", text)) == N_LAYERS
    assert len(re.findall(r"stablehlo\.all_reduce", text)) == (
        1 if name == "fsdp_mlp" else 4)


@pytest.mark.parametrize("form", ["shard_map", "jit"])
@pytest.mark.parametrize("name,shape,axis", [
    ("fsdp_mlp", (8,), None), ("fsdp_mlp", (4, 2), "j"),
    ("fsdp_tp_mlp", (4, 2), None)])
def test_compiled_collectives_meet_the_cost_model(form, name, shape, axis):
    recipe = cx.RECIPES[name]
    mesh = cx.make_mesh(shape, ("i", "j")[:len(shape)])
    axes = recipe.axes(mesh, axis)
    args = recipe.example_args(mesh, axis)
    stats = collective_stats(recipe.compiled(form, axes),
                             *recipe.place(*args, axes=axes))
    problems = [e.mismatch(stats) for e in recipe.expected_costs(form, axes, args)]
    assert None in problems, problems
    if form == "shard_map":
        # No full parameter is all-reduced: the only all-reduces are the
        # loss (one scalar) and, with TP, the three activations
        # ([rows, h2] twice, [rows, d_out]).
        biggest = max(v.nbytes for v in args[0].values())
        assert all(op.operand_bytes < biggest for op in stats.ops
                   if op.kind == "all-reduce"), stats


# -- the explicit form: the reduce-scatter deferred across microbatches -----------

_DEFERRED = pytest.mark.skipif(
    not _compat.UNREDUCED_GRADIENTS_CHECKED,
    reason=f"JAX {jax.__version__}: reduced/unreduced gradient types are not "
           "checked on this release (checked from "
           f"{'.'.join(map(str, _compat.UNREDUCED_GRADIENTS_CHECKED_SINCE))})")


def _sums_over(stats, mesh, axes):
    # operand bytes of the sums (all-reduce, reduce-scatter) and of the
    # gathers over `axes`: XLA:CPU writes a reduce-scatter as an all-reduce
    # and a slice, other backends keep it
    ops = [op for op in stats.ops if op.mesh_axes(mesh) == axes]
    return (sum(op.operand_bytes for op in ops
                if op.kind in ("all-reduce", "reduce-scatter")),
            sum(op.operand_bytes for op in ops if op.kind == "all-gather"))


@_DEFERRED
@pytest.mark.parametrize("shape", [(8,), (4, 2)])
def test_deferred_scatter_sums_half_the_bytes_of_two_microbatches(shape):
    # Two microbatches the FSDP way gather every weight and reduce-scatter
    # every gradient per microbatch; deferred, each weight is gathered once
    # (typed reduced over "data") and the summed unreduced shares are
    # scattered once: half the gradient bytes, one gather of each block.
    names = ("data", "model")[:len(shape)]
    model_axis = "model" if len(shape) == 2 else None
    mesh = jax.make_mesh(shape, names,
                         axis_types=_compat.explicit_axis_types(len(shape)))
    params = file.init_params((8, 16, 16, 16, 8), seed=2)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = rng.standard_normal((32, 8)).astype(np.float32)
    want_loss, want = file.value_and_grad_numpy(params, x, y)
    stored = file.fsdp_specs("data", model_axis)
    with jax.set_mesh(mesh):
        placed = (jax.sharding.reshard(params, stored),
                  *jax.sharding.reshard((x, y), jax.P("data")))
        blocks = sum(v.addressable_shards[0].data.nbytes for v in placed[0].values())
        over = {}
        for name, program in (
                ("each", file.value_and_grad_microbatches_explicit_program),
                ("deferred", file.value_and_grad_deferred_explicit_program)):
            fn = jax.jit(functools.partial(program, model_axis=model_axis, n_micro=2))
            loss, grads = fn(*placed)
            np.testing.assert_allclose(float(loss), want_loss, rtol=RTOL)
            for k in want:
                np.testing.assert_allclose(np.asarray(grads[k]), want[k], rtol=RTOL,
                                           atol=ATOL, err_msg=f"{name} {k}")
                assert grads[k].sharding.is_equivalent_to(
                    jax.NamedSharding(mesh, stored[k]), 2), (name, k)
            stats = collective_stats(fn, *placed)
            over[name] = {axes: _sums_over(stats, mesh, axes)
                          for axes in (("data",), ("model",))}
    n = shape[0]
    (summed, gathered), (summed_each, gathered_each) = (
        over["deferred"][("data",)], over["each"][("data",)])
    assert gathered == blocks, over  # each parameter's block, once
    assert gathered_each >= 2 * gathered, over  # per microbatch, or more
    assert summed in (blocks + 4, n * blocks + 4), over  # scattered; the loss
    assert summed_each == 2 * summed, over
    assert over["each"][("model",)] == over["deferred"][("model",)], over
    name, layout = (("`fsdp_mlp`", "8-way data") if len(shape) == 1
                    else ("`fsdp_tp_mlp`", "4 data x 2 model"))
    assert documented_deferred_bytes(f"{name}, gradients", layout) == (
        summed_each, summed), over
    assert documented_deferred_bytes(f"{name}, gathers", layout) == (
        gathered_each, gathered), over


@pytest.mark.parametrize("name", NAMES)
def test_the_library_explicit_form_is_the_deferred_program(name):
    recipe = cx.RECIPES[name]
    assert (recipe.explicit_program.__wrapped__.__code__
            is file.value_and_grad_deferred_explicit_program.__code__)
    assert file.DEFERRED_SUM_SINCE == _compat.UNREDUCED_GRADIENTS_CHECKED_SINCE
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    args = recipe.example_args(mesh)
    if _compat.UNREDUCED_GRADIENTS_CHECKED:
        assert_forms_agree(recipe, *args, mesh=mesh)
    else:
        with pytest.raises(NotImplementedError, match=r"deferred gradient sum .*"
                           r"needs JAX >= 0\.9\.1"):
            recipe.explicit(*args, mesh=mesh)
