"""``python -m collectives``: list, show, run, check."""

import dataclasses
import warnings

import jax.numpy as jnp
import pytest

import collectives as cx
from helpers import jit_form_replaced
from helpers import run_python

ONE_ULP_UP = jit_form_replaced(lambda out: jnp.nextafter(out, jnp.inf))
ZEROS = jit_form_replaced(jnp.zeros_like)


def test_list_names_every_recipe_with_a_summary():
    out = run_python("-m", "collectives", "list").stdout
    lines = out.strip().splitlines()
    assert len(lines) == len(cx.RECIPES)
    for name, recipe in cx.RECIPES.items():
        assert any(line.startswith(name + " ") and recipe.summary in line
                   for line in lines), name


def test_check_prints_a_table_and_passes():
    out = run_python("-m", "collectives", "check", "psum", "all_gather",
                     "--dtype", "float32", "int32").stdout
    assert "recipe" in out and "max error" in out
    rows = [line for line in out.splitlines() if line.startswith(("psum", "all_g"))]
    # 2 recipes x 4 mesh configurations x 2 dtypes
    assert len(rows) == 16 and all(line.endswith(" ok") for line in rows)
    assert "pmap+shard_map+jit" in rows[0]
    assert "16 agree, 0 disagree" in out


def test_check_with_one_mesh():
    out = run_python("-m", "collectives", "check", "ppermute_ring", "--mesh", "2x4",
                     "--axis", "j,i").stdout
    assert "ppermute_ring" in out and "2x4" in out and "j,i" in out
    assert "1 agree, 0 disagree" in out


def test_check_unknown_recipe_fails_clearly():
    result = run_python("-m", "collectives", "check", "nope", check=False)
    assert result.returncode != 0
    assert "no recipe named 'nope'" in result.stderr


def test_exact_check_holds_exact_recipes_to_the_bit():
    # One ulp off in one form: the tolerance policy allows it, --exact does
    # not for a recipe declared exact, and still does for one whose own
    # arithmetic rounds (dp_mlp: exact=False).
    one = [((8,), ("i",), None)]
    rows = {(name, exact): row
            for name in ("psum", "dp_mlp") for exact in (False, True)
            for row in cx.check([name], configs=one, exact=exact,
                                forms=ONE_ULP_UP)}
    assert rows["psum", False].ok and rows["dp_mlp", False].ok
    assert rows["dp_mlp", True].ok
    strict = rows["psum", True]
    assert not strict.ok
    assert "jit disagrees with the reference" in strict.detail
    assert "shard_map" not in strict.detail.split("disagrees")[0]


def test_exact_check_skips_dtypes_a_recipe_does_not_keep_exact():
    # dp_grads multiplies its inputs: small integers leave float16's exact
    # range, so --exact skips it with the reason (and the fix), not a failure.
    (row,) = cx.check(["dp_grads"], dtypes=("float16",),
                      configs=[((8,), ("i",), None)], exact=True)
    assert row.ok and row.skipped
    assert "exact_dtypes: float32, float64" in row.detail
    assert "check float16 without --exact" in row.detail
    (row,) = cx.check(["dp_grads"], dtypes=("float16",),
                      configs=[((8,), ("i",), None)])
    assert row.ok and not row.skipped


def test_check_skips_a_comparison_that_cannot_fail():
    # ring_attention counts 128 rounded operations on 8 devices: in bfloat16
    # the policy's rtol is 2, and a form returning zeros would pass. check
    # says so instead of reporting agreement; in float32 zeros are caught.
    one = [((8,), ("i",), None)]
    (row,) = cx.check(["ring_attention"], dtypes=("bfloat16",), configs=one,
                      forms=ZEROS)
    assert row.ok and row.skipped
    assert "allows rtol=2" in row.detail and "cannot fail" in row.detail
    (row,) = cx.check(["ring_attention"], configs=one, forms=ZEROS)
    assert not row.ok and "jit disagrees with the reference" in row.detail


def test_show_prints_the_source():
    out = run_python("-m", "collectives", "show", "psum").stdout
    assert "def psum_body" in out and "lax.psum(x, axis)" in out
    assert "def psum_numpy" in out
    # the functions the library runs are the recipe file's
    assert "psum_body in recipes/reductions.py" in out


def test_show_hlo_prints_what_each_form_compiles_to_beside_the_cost_model():
    out = run_python("-m", "collectives", "show", "psum_scatter", "--hlo",
                     "--mesh", "4x2", "--axis", "i", "--hlo-text").stdout
    shard_map, jit = out.split("\nshard_map form: ")[1].split("\njit form: ")
    assert shard_map.startswith("meets its cost model")
    assert "reduce-scatter over i: f32 operand of 96 bytes, group of 4" in shard_map
    assert "reduce-scatter(" in shard_map  # the HLO instruction
    assert "cost model: {'reduce-scatter': 1}" in shard_map
    # XLA:CPU writes the jit form's reduce-scatter as an all-reduce
    assert jit.startswith("meets its cost model") and "all-reduce over" in jit


def test_show_hlo_says_when_a_form_differs_from_the_cost_model():
    from collectives._compiled_view import compiled_view
    from collectives._costs import one_collective

    wrong = dataclasses.replace(cx.RECIPES["psum"], name="psum_as_gather",
                                cost_model=one_collective("all-gather"))
    out = compiled_view(wrong, (8,), ("i",))
    assert out.count("DIFFERS from its cost model: expected {'all-gather': 1}, "
                     "compiled to {'all-reduce': 1}") == 3  # every placed form


def test_run_prints_every_form():
    out = run_python("-m", "collectives", "run", "pmax", "--mesh", "4x2").stdout
    for form in ("pmap:", "shard_map:", "jit:", "reference:"):
        assert form in out


def test_unknown_recipe_in_show():
    result = run_python("-m", "collectives", "show", "psumm", check=False)
    assert result.returncode == 2 and "Known recipes" in result.stderr


def test_a_forms_hook_of_another_signature_is_refused_with_the_fix():
    # The older hook forms(recipe, mesh, axis) is refused, as check's
    # docstring says (it once said the hook still ran, with a warning):
    # a TypeError naming the hook and the fix, before any row runs.
    called = []

    def older(recipe, mesh, axis):
        called.append(recipe.name)
        return recipe.forms(mesh, axis)

    one = [((8,), ("i",), None)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError, match=r"expected forms\(recipe, axes\), got "
                           r"<function .*older.*Fix: take \(recipe, axes\) "
                           r"\(axes\.mesh, axes\.axis\)"):
            cx.check(["psum"], configs=one, forms=older)
    assert called == [] and caught == []
    assert "TypeError: ``forms`` does not take" in cx.check.__doc__
    assert "DeprecationWarning" not in cx.check.__doc__
    (row,) = cx.check(["psum"], configs=one,
                      forms=lambda recipe, axes: recipe.bound_forms(axes))
    assert row.ok and not row.skipped and row.explicit == "ok"


def test_check_prints_an_explicit_column():
    out = run_python("-m", "collectives", "check", "psum", "--mesh", "4x2").stdout
    header, _, row = out.splitlines()[:3]
    assert "explicit" in header.split()
    assert row.split()[header.split().index("explicit")] == "ok", out


def test_check_validates_each_row_once(monkeypatch):
    calls = []
    recipe = cx.RECIPES["psum"]
    original = type(recipe).validated_axes

    def counting(self, *args, **kwargs):
        calls.append(self.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(recipe), "validated_axes", counting)
    rows = cx.check(["psum"], configs=[((8,), ("i",), None)])
    assert len(rows) == 1 and rows[0].ok
    assert calls == ["psum"], calls
