"""JAX's defaults: Explicit mesh axes, often set globally with ``jax.set_mesh``.

After ``jax.set_mesh(jax.make_mesh((4, 2), ("X", "Y")))``, as JAX's guide to
distributed arrays begins, the README example, ``check()``, a bench sweep and
``assert_forms_agree`` on every recipe run and pass (each form runs on its
own mesh; the explicit form on Explicit axes). A user's Explicit mesh passed
in works in every form. Breaking a recipe file's global program breaks the
explicit form, which ``check`` then reports."""

import re

import jax
import numpy as np
import pytest

import collectives as cx
from collectives._recipe import clear_caches
from collectives.recipes import reductions
from collectives.recipes.reductions import blocks
from helpers import ROOT
from helpers import SLOW
from helpers import only_with_marker
from helpers import run_python

_SCRIPT = """
import jax
import numpy as np
import collectives as cx
from collectives.testing import assert_forms_agree

cx.use_cpu_devices(8)
jax.set_mesh(jax.make_mesh((4, 2), ("X", "Y")))
print("context:", jax.sharding.get_abstract_mesh())
{readme}
print("README example: ok")
rows = cx.check()
failed = [row for row in rows if not row.ok]
print("check:", len(rows) - len(failed), "agree,", len(failed), "disagree")
for row in rows:
    if not row.ok or row.skipped:
        print("ROW", row.recipe, row.mesh, row.axis, row.ok, row.detail[:300])
import io
from collectives import bench
doc = bench.run(["psum"], sizes=(1024,), samples=2, budget=0.2, memory=False,
                out=io.StringIO())
print("bench:", sorted(set(row["form"] for row in doc["results"])))
mesh = cx.make_mesh((4, 2), ("i", "j"))
for name, recipe in cx.RECIPES.items():
    axes = recipe.axes(mesh)
    if recipe.unsupported_reason(axes):
        mesh_1d = cx.make_mesh((8,), "i")
        args, on = recipe.example_args(mesh_1d), mesh_1d
    else:
        args, on = recipe.example_args(mesh), mesh
    report = assert_forms_agree(recipe, *args, mesh=on)
    print("agree:", name, "+".join(report.forms))
"""


def _readme_example():
    text = (ROOT / "README.md").read_text()
    return text[text.index("```python\n") + len("```python\n"):].split("```")[0]


@pytest.mark.slow
def test_on_a_global_explicit_mesh_everything_runs_and_agrees(request):
    only_with_marker(request, "slow", SLOW)
    script = _SCRIPT.format(readme=_readme_example())
    out = run_python("-c", script, timeout=900, env={"JAX_PLATFORMS": "cpu"}).stdout
    assert "axis_types=(Explicit, Explicit)" in out.splitlines()[0] or (
        jax.__version_info__ < (0, 9)), out[:500]
    assert "README example: ok" in out
    assert "bench: ['copy', 'jit', 'pmap', 'ring', 'shard_map']" in out, out
    summary = re.search(r"check: (\d+) agree, (\d+) disagree", out)
    assert summary and int(summary[1]) > 100 and summary[2] == "0", out
    assert "ROW" not in out or all("skipped" in line or "True" in line
                                   for line in out.splitlines()
                                   if line.startswith("ROW")), out
    agreed = re.findall(r"^agree: (\w+) (\S+)$", out, re.M)
    assert {name for name, _ in agreed} == set(cx.RECIPES), out
    ran_explicit = [name for name, forms in agreed if "explicit" in forms.split("+")]
    skipped = [name for name in cx.RECIPES
               if cx.RECIPES[name].explicit_reason is not None]
    assert set(ran_explicit) | set(skipped) == set(cx.RECIPES), out


_MAKE_MESH_SCRIPT = """
import jax
import collectives as cx
from collectives.testing import assert_forms_agree

cx.use_cpu_devices(8)
meshes = [jax.make_mesh((8,), ("i",)), jax.make_mesh((4, 2), ("X", "Y"))]
if {global_mesh}:
    jax.set_mesh(meshes[1])
for mesh in meshes:
    print("mesh:", dict(mesh.shape), mesh.axis_types)
    for name, recipe in cx.RECIPES.items():
        if recipe.unsupported_reason(recipe.axes(mesh)):
            continue
        expected = sorted(recipe.forms(mesh))  # the oracle included
        try:
            report = assert_forms_agree(recipe, *recipe.example_args(mesh), mesh=mesh)
        except Exception as error:
            print("FAIL:", name, dict(mesh.shape), type(error).__name__,
                  str(error)[:400].replace(chr(10), " "))
            continue
        ran = sorted(report.forms)
        print("agree:" if ran == expected else "FORMS:", name, len(mesh.shape),
              "+".join(ran), "+".join(expected))
"""


@pytest.mark.slow
@pytest.mark.parametrize("global_mesh", [False, True], ids=["passed", "global"])
def test_every_form_of_every_recipe_runs_on_meshes_from_jax_make_mesh(
        request, global_mesh):
    # The meshes users make (Explicit axes from JAX 0.9, whatever the
    # release's default is before), passed to every form, with and without
    # a global jax.set_mesh of one of them: every form the recipe has on the
    # mesh runs and agrees with the oracle (the suite's own meshes come from
    # cx.make_mesh, Auto on every release).
    only_with_marker(request, "slow", SLOW)
    script = _MAKE_MESH_SCRIPT.format(global_mesh=global_mesh)
    out = run_python("-c", script, timeout=900, env={"JAX_PLATFORMS": "cpu"}).stdout
    meshes = re.findall(r"^mesh: .*$", out, re.M)
    assert len(meshes) == 2, out
    if jax.__version_info__ >= (0, 9):
        assert all("Explicit" in line and "Auto" not in line for line in meshes), out
    assert "FAIL:" not in out and "FORMS:" not in out, out
    agreed = re.findall(r"^agree: (\w+) (\d) (\S+) ", out, re.M)
    # every recipe runs on at least one of the two meshes, most on both
    assert {name for name, _, _ in agreed} == set(cx.RECIPES), out
    assert sum(ndim == "2" for _, ndim, _ in agreed) > len(cx.RECIPES) // 2, out
    assert any("explicit" in forms.split("+") for _, _, forms in agreed), out


def test_bench_measures_memory_under_a_scoped_explicit_mesh():
    # bench's default (memory on) lowers the pmap form: it must not see the
    # caller's mesh either
    from collectives import bench
    from collectives._compat import mesh_scope
    from collectives._compat import with_axis_types

    with mesh_scope(with_axis_types(cx.make_mesh((4, 2), ("X", "Y")), explicit=True)):
        doc = bench.run(["psum"], ("pmap", "shard_map"), sizes=(1024,), samples=1,
                        budget=0, memory=True)
    rows = [row for row in doc["results"] if row["form"] == "pmap"]
    assert rows and rows[0]["memory"]["argument_bytes"] > 0, rows


def test_a_users_explicit_mesh_runs_every_form():
    mesh = jax.make_mesh((4, 2), ("i", "j"),
                         axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    x = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    want = cx.RECIPES["psum"].reference(x, mesh=mesh, axis="i")
    for form in cx.FORMS:
        got = getattr(cx.RECIPES["psum"], form)(x, mesh=mesh, axis="i")
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=form)


def test_the_explicit_form_types_its_inputs_and_outputs():
    mesh = cx.make_mesh((8,), "i")
    recipe = cx.RECIPES["all_to_all"]
    axes = recipe.axes(mesh)
    (x,) = recipe.place(*recipe.example_args(mesh), axes=axes, form="explicit")
    assert "@i" in str(jax.typeof(x)).split(",")[0]  # rows sharded, in the type
    out = recipe.compiled("explicit", axes)(x)
    assert out.sharding.spec == jax.P(None, "i")  # columns, as out_specs says


def _max_instead(x, n):
    return blocks(x, n).max(0)


def _min_instead(x, n):
    return blocks(x, n).min(0)


@pytest.mark.parametrize(("name", "program", "wrong"), [
    ("psum", reductions.psum_program, _max_instead),
    ("pmax", reductions.pmax_program, _min_instead),
])
def test_breaking_the_global_program_in_the_file_fails_the_explicit_form(
        name, program, wrong, monkeypatch):
    # the file's own function object (the one the registry holds) computes
    # the wrong reduction: the explicit form must then disagree
    monkeypatch.setattr(program, "__code__", wrong.__code__)
    clear_caches()
    try:
        (row,) = cx.check([name], configs=[((8,), ("i",), None)],
                          forms=lambda recipe, axes: {
                              k: f for k, f in recipe.bound_forms(axes).items()
                              if k in ("explicit", "reference")})
        assert not row.ok and "explicit disagrees with the reference" in row.detail
    finally:
        monkeypatch.undo()
        clear_caches()
    (row,) = cx.check([name], configs=[((8,), ("i",), None)])
    assert row.ok and "explicit" in row.forms


def test_explicit_is_a_form_of_every_recipe_or_skipped_with_a_reason():
    flat, square = cx.make_mesh((8,), "i"), cx.make_mesh((4, 2), ("i", "j"))
    for name, recipe in cx.RECIPES.items():
        # on a mesh the recipe runs on (dp_tp_mlp's needs two axes)
        mesh = flat if recipe.unsupported_reason(recipe.axes(flat)) is None else square
        axes = recipe.axes(mesh)
        assert recipe.unsupported_reason(axes) is None, name
        reason = recipe.unrunnable_form("explicit", axes)
        assert ("explicit" in recipe.forms(mesh)) == (reason is None), name
        if reason is not None:
            assert len(reason) > 20, (name, reason)  # says why
            with pytest.raises(NotImplementedError, match=re.escape(reason[:30])):
                recipe.explicit(*recipe.example_args(mesh), mesh=mesh)




@pytest.mark.parametrize(("broken", "left_out", "ok", "explicit"), [
    (None, None, True, "ok"),
    ("pmap", None, False, "ok"),          # another form disagreed: not explicit's
    ("shard_map", "explicit", False, "-"),  # not compared
    ("explicit", None, False, "FAIL"),
])
def test_the_explicit_column_is_the_explicit_forms_own_result(broken, left_out, ok,
                                                               explicit):
    def wrong(x):
        return x + 1

    def raises(*args):
        raise RuntimeError("planted")

    def forms_for(recipe, axes):
        forms = dict(recipe.bound_forms(axes))
        if broken is not None:
            form = forms[broken]
            forms[broken] = lambda *args: jax.tree_util.tree_map(wrong, form(*args))
        forms.pop(left_out, None)
        return forms

    (row,) = cx.check(["psum"], configs=[((8,), ("i",), None)], forms=forms_for)
    assert (row.ok, row.explicit) == (ok, explicit), row
    if broken == "pmap":  # a form that raises before explicit runs: still its own
        def raising(recipe, axes):
            return {**recipe.bound_forms(axes), "pmap": raises}
        (row,) = cx.check(["psum"], configs=[((8,), ("i",), None)], forms=raising)
        assert not row.ok and "planted" in row.detail and row.explicit == "ok", row
