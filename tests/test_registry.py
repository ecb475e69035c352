"""The registry is the one list: a recipe added as CONTRIBUTING.md says (its
recipe file and its facts module) reaches the CLI's ``list`` and ``check``,
the gallery, the bench, the hypothesis strategies and the conformance suite
with no other edit."""

import dataclasses
import re
import shutil
import textwrap

import pytest

import collectives as cx
from collectives._registry import register
from helpers import ROOT
from helpers import run_python

RECIPE_FILE = textwrap.dedent('''
    """Twice the psum: a recipe added as CONTRIBUTING.md says.

    Registered as: ``collectives.RECIPES["throwaway_double_psum"]``.
    Devices: 8 (simulated on CPU by ``main()``).
    JAX versions checked: the one the suite runs.
    """

    import os

    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P


    # [start:body]
    def double_psum_body(x, axis="i"):
        # x: [k, m] on each device -> [k, m], the same on every device
        return 2 * lax.psum(x, axis)
    # [end:body]


    # [start:pmap]
    def double_psum_pmap(x, n):
        out = jax.pmap(double_psum_body, axis_name="i")(x.reshape(n, -1, *x.shape[1:]))
        return np.asarray(out)[0]
    # [end:pmap]


    # [start:shard_map]
    def double_psum_shard_map(x, mesh):
        return jax.jit(jax.shard_map(double_psum_body, mesh=mesh, in_specs=P("i"),
                                     out_specs=P()))(x)
    # [end:shard_map]


    # [start:jit]
    def double_psum_program(x, n):
        return 2 * x.reshape(n, -1, *x.shape[1:]).sum(0, dtype=x.dtype)


    def double_psum_jit(x, mesh):
        return jax.jit(lambda x: double_psum_program(x, mesh.shape["i"]),
                       in_shardings=NamedSharding(mesh, P("i")),
                       out_shardings=NamedSharding(mesh, P()))(x)
    # [end:jit]


    # [start:numpy]
    def double_psum_numpy(x, n):
        wide = np.asarray(x, np.float64).reshape(n, -1, *x.shape[1:])
        return (2 * wide.sum(0)).astype(x.dtype)
    # [end:numpy]


    def main():
        jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
        jax.config.update("jax_num_cpu_devices", 8)
        mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
        x = np.arange(16.0, dtype=np.float32).reshape(8, 2)
        want = double_psum_numpy(x, 8)
        for got in (double_psum_pmap(x, 8), double_psum_shard_map(x, mesh),
                    double_psum_jit(x, mesh)):
            np.testing.assert_array_equal(np.asarray(got), want)
        print("2 * column sums:", want.tolist())
        print("ok: every form is twice the psum")


    if __name__ == "__main__":
        main()
''')

FACTS = textwrap.dedent('''
    """The facts of recipes/throwaway.py."""
    from jax import lax

    from collectives._costs import one_collective
    from collectives._layout import by_axis_size
    from collectives._layout import grid_shape
    from collectives._layout import make_spec
    from collectives._presentation import BenchSpec
    from collectives._recipe import Recipe
    from collectives._registry import register
    from collectives.recipes import throwaway as file

    register(Recipe(
        name="throwaway_double_psum", summary="2 * psum, a recipe added in a test",
        recipe_file="throwaway.py", body=file.double_psum_body,
        program=by_axis_size(file.double_psum_program),
        oracle=by_axis_size(file.double_psum_numpy),
        in_specs=lambda axes: (make_spec(axes.entry, axes.others_entry),),
        out_specs=lambda axes: make_spec(None, axes.others_entry),
        example_shapes=lambda axes, dims: (grid_shape(axes, dims),),
        n_terms=lambda axes: axes.size + 1, dtype_kinds=frozenset({"float"}),
        cost_model=one_collective("all-reduce"),
        bench=BenchSpec(lambda x, axis, n: lax.psum(x, axis), "all-reduce")))
''')

_NOT_COPIED = shutil.ignore_patterns(
    ".git", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache", ".tox",
    "*.egg-info", "_build", "_generated")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the repository with one recipe added as CONTRIBUTING.md says:
    its recipe file and its facts module, and no other edit."""
    root = tmp_path_factory.mktemp("throwaway") / "repo"
    shutil.copytree(ROOT, root, symlinks=True, ignore=_NOT_COPIED)
    (root / "recipes" / "throwaway.py").write_text(RECIPE_FILE)
    (root / "collectives" / "_facts" / "throwaway.py").write_text(FACTS)
    return root


def test_a_new_recipe_reaches_list_check_the_gallery_and_the_bench(checkout):
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        sys.path.insert(0, "docs/_ext")
        import gallery_sections
        from collectives._cli import main
        main(["list"])
        paths = sorted(Path("recipes").glob("*.py"))
        for title, members in gallery_sections.sections(paths):
            for path, names in members:
                print("gallery:", title, path.name, names)
        main(["bench", "-c", "throwaway_double_psum", "-b", "1K", "-e", "1K",
              "--budget", "0", "-r", "2", "--no-memory", "-q"])
        raise SystemExit(main(["check", "throwaway_double_psum"]))
    """)
    out = run_python("-c", script, cwd=checkout, env=_ENV).stdout
    assert re.search(r"^throwaway_double_psum +2 \* psum", out, re.M), out
    assert "gallery: Patterns throwaway.py ['throwaway_double_psum']" in out, out
    bench_rows = re.findall(r"^throwaway_double_psum .*", out, re.M)
    assert any("shard_map" in row for row in bench_rows), out
    rows = re.findall(r"^throwaway_double_psum +\S+ +\S+ +float32 .* ok$", out, re.M)
    assert len(rows) == 4, out  # check's four mesh configurations
    assert "4 agree, 0 disagree" in out, out
    standalone = run_python("recipes/throwaway.py", cwd=checkout, env=_ENV).stdout
    assert "ok: every form is twice the psum" in standalone


def test_a_new_recipe_reaches_the_conformance_suite(checkout):
    args = ("-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q",
            "tests/test_conformance.py", "tests/test_one_implementation.py")
    collected = run_python(*args, "--collect-only", "-k", "throwaway",
                           cwd=checkout, env=_ENV).stdout
    ids = [line for line in collected.splitlines() if "throwaway" in line]
    assert len(ids) >= 12, collected
    # The value, cost-model and retrace checks, and the recipe-file checks.
    ran = run_python(
        *args, "-k", "throwaway and (oracle or cost_model or retrace or file)",
        cwd=checkout, env=_ENV).stdout
    assert re.search(r"\b([6-9]|\d\d) passed", ran), ran
    assert "failed" not in ran, ran


_ENV = {"JAX_PLATFORMS": "cpu"}


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


def test_the_older_field_names_still_work_with_a_warning():
    psum = cx.RECIPES["psum"]
    renamed = {"count_terms": "n_terms", "hlo": "cost_model",
               "source": "recipe_file", "exact": "bitwise"}
    fields = {f.name: getattr(psum, f.name) for f in dataclasses.fields(psum)}
    for old, new in renamed.items():
        given = {name: value for name, value in fields.items() if name != new}
        with pytest.warns(DeprecationWarning,
                          match=rf"Recipe\({old}=\.\.\.\) is deprecated: pass {new}="):
            recipe = cx.Recipe(**given, **{old: fields[new]})
        assert getattr(recipe, new) == fields[new]
        with pytest.warns(DeprecationWarning, match=rf"Recipe\.{old} is deprecated"):
            assert getattr(recipe, old) == fields[new]
    with pytest.raises(TypeError, match="both hlo= and cost_model="), \
            pytest.warns(DeprecationWarning):
        cx.Recipe(**fields, hlo=fields["cost_model"])
    axes = psum.axes(cx.make_mesh((8,), "i"))
    placed = psum.place(*psum.example_args(axes.mesh), axes=axes)
    with pytest.warns(DeprecationWarning, match="Recipe.expected_hlo is deprecated"):
        older = psum.expected_hlo("shard_map", axes, placed)
    assert older == psum.expected_costs("shard_map", axes, placed)
