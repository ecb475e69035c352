"""The registry is the one list: its order (by family), its refusals, and a
recipe built in a test reaching the hypothesis strategies. (A recipe added to
a copy of the repository as CONTRIBUTING.md says: tests/test_contributing.py.)"""

import dataclasses

import pytest

import collectives as cx
from collectives._registry import register


def test_a_new_recipe_reaches_the_hypothesis_strategies():
    from hypothesis import given
    from hypothesis import settings

    from collectives.testing import assert_forms_agree
    from collectives.testing.strategies import recipe_cases

    recipe = cx.Recipe(
        name="throwaway_identity", summary="x as it is",
        body=lambda x, *, axis: x, program=lambda x, *, axes: x,
        oracle=lambda x, *, axes: x, in_specs=lambda axes: (cx.RECIPES[
            "axis_index"].in_specs(axes)[0],),
        out_specs=lambda axes: cx.RECIPES["axis_index"].out_specs(axes),
        example_shapes=lambda axes, dims: cx.RECIPES["axis_index"].example_shapes(
            axes, dims))
    seen = []

    @settings(max_examples=3, database=None)
    @given(case=recipe_cases(recipe))
    def run(case):
        seen.append(case)
        assert_forms_agree(recipe, *case.args, mesh=case.mesh,
                           axis=case.axis, rtol=0, atol=0)

    run()
    assert seen


def test_exact_dtypes_limit_the_drawn_dtypes_and_are_checked():
    from hypothesis import given
    from hypothesis import settings

    from collectives.testing.strategies import recipe_cases

    grads = cx.RECIPES["dp_grads"]
    assert grads.draws_exact("float32") and not grads.draws_exact("bfloat16")
    assert not grads.draws_exact("int32")  # not a kind it accepts
    assert cx.RECIPES["psum"].draws_exact("bfloat16")  # None: every dtype
    drawn = set()

    def draw(dtypes):
        @settings(max_examples=20, database=None)
        @given(case=recipe_cases(grads, max_dim=1, dtypes=dtypes))
        def run(case):
            drawn.add(case.dtype)
        run()

    draw(("float32", "int32", "float16", "bfloat16"))
    assert drawn == {"float32"}
    with pytest.raises(ValueError, match=r"dtypes=\('bfloat16',\) holds none.*"
                                         r"exact_dtypes=\['float32', 'float64'\]"):
        draw(("bfloat16",))
    with pytest.raises(ValueError, match=r"exact_dtypes=\['int32'\] names .*"
                                         "dtype_kinds=\\['float'\\]"):
        dataclasses.replace(grads, exact_dtypes=frozenset({"int32"}))


def test_registering_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="'psum' is already registered"):
        register(cx.RECIPES["psum"])


def test_the_registry_lists_core_recipes_first_then_by_family():
    families = [recipe.family for recipe in cx.RECIPES.values()]
    order = {family: index for index, family in enumerate(cx.FAMILIES)}
    assert families == sorted(families, key=order.__getitem__)


def test_the_registry_lists_recipes_by_family_whatever_the_import_order():
    from collectives._registry import RECIPES

    before = list(RECIPES)
    late_core = dataclasses.replace(cx.RECIPES["psum"], name="throwaway_late_core")
    register(late_core)
    try:
        names = list(RECIPES)
        core = [n for n in names if RECIPES[n].family == "core"]
        assert names[:len(core)] == core and core[-1] == "throwaway_late_core"
    finally:
        RECIPES._recipes.pop("throwaway_late_core")
    assert list(RECIPES) == before
