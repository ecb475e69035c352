"""GPipe over a stage axis: loss and gradients equal the layers run in
sequence on one device and the NumPy oracle; the bubble shrinks with M; the
compiled step holds only collective-permutes (and the loss's all-reduce)."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives._compare import forms_agree
from collectives._facts.pipeline import permute_count
from collectives.hlo import collective_stats
from collectives.recipes.pipeline import stage_layer
from collectives.testing import assert_forms_agree
from collectives.testing import compare_arrays
from collectives.testing.strategies import recipe_cases
from helpers import examples
from helpers import load_recipe

RECIPE = cx.RECIPES["pipeline_mlp"]
RTOL, ATOL = 1e-5, 1e-6  # float32 through <= 8 tanh layers of width <= 3



def sequential_loss(stage_params, x, y):
    """The same model on one device: the layers in sequence, no pipeline."""
    a = x
    for s in range(stage_params["w"].shape[0]):
        a = stage_layer({"w": stage_params["w"][s], "b": stage_params["b"][s]}, a)
    return jnp.sum((a - y) ** 2) / x.shape[0]


@settings(max_examples=examples(3))
@given(data=st.data())
def test_forms_equal_the_layers_in_sequence(data):
    case = data.draw(recipe_cases(RECIPE, dtypes=("float32",), ndim=(2,)))
    stage_params, x, y = case.args
    stage_params = {k: v / 4 for k, v in stage_params.items()}  # tanh unsaturated
    report = assert_forms_agree(RECIPE, stage_params, x, y, mesh=case.mesh,
                                axis=case.axis)
    # the single-device program as the reference, under the recipe's own
    # tolerance facts (n_terms, magnitudes)
    sequential = jax.jit(jax.value_and_grad(sequential_loss))(stage_params, x, y)
    forms = {form: functools.partial(_returning, report.results[form])
             for form in cx.FORMS}
    args = (stage_params, x, y)
    forms_agree({**forms, "reference": lambda *args: sequential}, args,
                recipe=RECIPE, axes=RECIPE.validated_axes(args, case.mesh, case.axis))


def _returning(result, *args):
    """A form that already ran: its result, whatever the arguments."""
    return result


def _idle_fraction(stages, microbatches):
    # Stage s works on microbatch t - s at tick t, when 0 <= t - s < M.
    ticks = microbatches + stages - 1
    busy = sum(0 <= t - s < microbatches for t in range(ticks) for s in range(stages))
    return 1 - busy / (ticks * stages)


@pytest.mark.parametrize("stages", [2, 4, 8])
def test_bubble_fraction_is_the_idle_share_and_shrinks_with_m(stages):
    fractions = [cx.bubble_fraction(stages, m) for m in (1, 2, 4, 8, 32)]
    for m, fraction in zip((1, 2, 4, 8, 32), fractions, strict=True):
        assert fraction == pytest.approx(_idle_fraction(stages, m))
    assert all(a > b for a, b in itertools.pairwise(fractions))
    assert fractions[0] == pytest.approx((stages - 1) / stages)


def test_bubble_fraction_rejects_a_bad_count():
    with pytest.raises(ValueError,
                       match=r"microbatches: expected a positive int, got 0"):
        cx.bubble_fraction(4, 0)


@pytest.mark.parametrize("stages,microbatches", [(2, 2), (4, 2), (4, 8)])
def test_only_permutes_a_count_set_by_s_and_m(stages, microbatches):
    mesh = cx.make_mesh((stages, 8 // stages), ("stage", "replica"))
    body = functools.partial(cx.pipeline_value_and_grad, stage_axis="stage",
                             microbatches=microbatches)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("stage"), P(), P()),
                              out_specs=(P(), P("stage"))))
    d = 3
    params = {"w": np.ones((stages, d, d), np.float32),
              "b": np.ones((stages, d), np.float32)}
    x = np.ones((2 * microbatches, d), np.float32)
    stats = collective_stats(f, params, x, x)
    assert stats.nonzero() == {
        "collective-permute": permute_count(stages, microbatches), "all-reduce": 1}
    (loss_op,) = [op for op in stats.ops if op.kind == "all-reduce"]
    assert loss_op.operand_bytes == 4  # the loss, one float32
    assert {op.operand_bytes for op in stats.ops
            if op.kind == "collective-permute"} == {2 * d * 4}  # one microbatch


@pytest.mark.parametrize("form", ["shard_map", "jit"])
def test_recipe_meets_its_cost_model(form):
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    axes = RECIPE.axes(mesh, "i")
    args = RECIPE.example_args(mesh, "i")
    stats = collective_stats(RECIPE.compiled(form, axes),
                             *RECIPE.place(*args, axes=axes))
    (expected,) = RECIPE.expected_costs(form, axes, args)
    assert expected.mismatch(stats) is None


def test_batch_must_split_into_microbatches():
    mesh = cx.make_mesh((8,), "i")
    params, x, y = RECIPE.example_args(mesh)
    with pytest.raises(ValueError, match=r"x has 7 rows.*4 microbatches"):
        RECIPE.shard_map(params, x[:7], y[:7], mesh=mesh)


def test_stages_form_one_axis():
    mesh = cx.make_mesh((4, 2), ("i", "j"))
    args = RECIPE.example_args(mesh, "i")
    with pytest.raises(ValueError, match=r"needs one stage axis"):
        RECIPE.jit(*args, mesh=mesh)


def test_recipe_file_agrees_with_the_library():
    module = load_recipe("pipeline")
    mesh = cx.make_mesh((4,), ("stage",))
    rng = np.random.default_rng(2)
    params = {"w": (rng.standard_normal((4, 3, 3)) / 2).astype(np.float32),
              "b": rng.standard_normal((4, 3)).astype(np.float32)}
    x = rng.standard_normal((8, 3)).astype(np.float32)
    y = rng.standard_normal((8, 3)).astype(np.float32)
    loss, grads = module.pipeline_shard_map(params, x, y, mesh)
    want_loss, want = cx.pipeline_reference(params, x, y)
    assert compare_arrays(loss, want_loss, rtol=RTOL, atol=ATOL)[1] is None
    assert compare_arrays(grads["w"], want["w"], rtol=RTOL, atol=ATOL)[1] is None
    assert compare_arrays(grads["b"], want["b"], rtol=RTOL, atol=ATOL)[1] is None
