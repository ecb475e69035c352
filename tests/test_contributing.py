"""Adding a recipe is what CONTRIBUTING.md says: in a copy of the repository,
one recipe of each family (core, pattern, strategy) is added by the steps
that its "Adding a recipe" section lists, and nothing else; each then reaches
``list``, ``check``, ``show --hlo``, the gallery, the bench and every
registry-driven part of the suite, and passes there."""

import re
import shutil
import textwrap

import pytest

from helpers import ROOT
from helpers import SLOW
from helpers import only_with_marker
from helpers import run_python

_SKELETON = '''
    """{title}

    Registered as: ``collectives.RECIPES["{name}"]``.
    Devices: 8 (simulated on CPU by ``main()``).
    JAX versions checked: the one the suite runs.
    """

    import os

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P


    # [start:body]
    {body}
    # [end:body]


    # [start:pmap]
    def {stem}_pmap({args}, n):
        body = jax.pmap({stem}_body, axis_name="i", in_axes={pmap_in_axes})
        out = np.asarray(body({pmap_args}))
        return {pmap_out}
    # [end:pmap]


    # [start:shard_map]
    def {stem}_shard_map({args}, mesh):
        return jax.jit(jax.shard_map({stem}_body, mesh=mesh, in_specs={in_specs},
                                     out_specs={out_spec}))({args})
    # [end:shard_map]


    # [start:jit]
    {program}


    def {stem}_jit({args}, mesh):
        return jax.jit(lambda {args}: {stem}_program({args}, mesh.shape["i"]),
                       in_shardings=tuple(NamedSharding(mesh, s) for s in {in_specs}),
                       out_shardings=NamedSharding(mesh, {out_spec}))({args})
    # [end:jit]


    # [start:explicit]
    {explicit}


    def {stem}_explicit({args}, mesh):
        mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(
            jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))
        with jax.set_mesh(mesh):
            placed = [jax.device_put(a, s) for a, s in zip(({args},), {in_specs})]
            return jax.jit(lambda *a: jax.sharding.reshard(
                {stem}_explicit_program(*a, mesh.shape["i"]), {out_spec}))(*placed)
    # [end:explicit]


    # [start:numpy]
    {numpy}
    # [end:numpy]


    def main():
        jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
        jax.config.update("jax_num_cpu_devices", 8)
        mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
        {inputs}
        want = {stem}_numpy({args}, 8)
        for got in ({stem}_pmap({args}, 8), {stem}_shard_map({args}, mesh),
                    {stem}_jit({args}, mesh), {stem}_explicit({args}, mesh)):
            np.testing.assert_array_equal(np.asarray(got), want)
        print("result:", np.asarray(want).ravel()[:4].tolist())
        print("ok: every form agrees with NumPy")


    if __name__ == "__main__":
        main()
'''


def _recipe_file(**fields):
    # each field's continuation lines take the indentation of where it goes
    stem, args = fields["stem"], fields["args"]
    fields.setdefault("explicit", f"""
        def {stem}_explicit_program({args}, n):
            # the jit form's program, right as it is on Explicit axes
            return {stem}_program({args}, n)""")
    for key, indent in (("body", 4), ("program", 4), ("explicit", 4), ("numpy", 4),
                        ("inputs", 8)):
        fields[key] = textwrap.dedent(fields[key]).strip().replace(
            "\n", "\n" + " " * indent)
    return textwrap.dedent(_SKELETON.format(**fields))


# -- one recipe of each family ----------------------------------------------------

CORE = dict(
    stem="double_psum", name="throwaway_double_psum", args="x",
    title="Twice the psum: a core recipe added as CONTRIBUTING.md says.",
    body='''
        def double_psum_body(x, axis="i"):
            # x: [k, m] on each device -> [k, m], the same on every device
            return 2 * lax.psum(x, axis)''',
    program='''
        def double_psum_program(x, n):
            return 2 * x.reshape(n, -1, *x.shape[1:]).sum(0, dtype=x.dtype)''',
    numpy='''
        def double_psum_numpy(x, n):
            wide = np.asarray(x, np.float64).reshape(n, -1, *x.shape[1:])
            return (2 * wide.sum(0)).astype(x.dtype)''',
    pmap_in_axes="0", pmap_args="x.reshape(n, -1, *x.shape[1:])",
    pmap_out="out[0]  # replicated: every device holds the sum",
    in_specs='(P("i"),)', out_spec="P()",
    inputs="x = np.arange(16.0, dtype=np.float32).reshape(8, 2)")

PATTERN = dict(
    stem="centre", name="throwaway_centre", args="x",
    title="Each block minus the mean block: a pattern added as CONTRIBUTING.md says.",
    body='''
        def centre_body(x, axis="i"):
            # x: [k, m] on each device -> [k, m]: x minus the mean over devices
            return x - lax.pmean(x, axis)''',
    program='''
        def centre_program(x, n):
            blocks = x.reshape(n, -1, *x.shape[1:])
            return (blocks - blocks.mean(0, keepdims=True)).reshape(x.shape)''',
    numpy='''
        def centre_numpy(x, n):
            blocks = np.asarray(x, np.float64).reshape(n, -1, *x.shape[1:])
            centred = blocks - blocks.mean(0, keepdims=True)
            return centred.reshape(x.shape).astype(x.dtype)''',
    pmap_in_axes="0", pmap_args="x.reshape(n, -1, *x.shape[1:])",
    pmap_out="out.reshape(-1, *out.shape[2:])  # the blocks, in device order",
    in_specs='(P("i"),)', out_spec='P("i")',
    inputs="x = np.arange(16.0, dtype=np.float32).reshape(8, 2)")

STRATEGY = dict(
    stem="dp_square", name="throwaway_dp_square", args="w, x",
    title="Data-parallel gradient of 0.5 |x @ w|^2: a strategy added as "
          "CONTRIBUTING.md says.",
    body='''
        def dp_square_body(w, x, axis="i"):
            # w: [m] replicated, x: [k, m] rows of the batch -> [m], the
            # gradient of the whole batch's loss on every device
            return lax.psum(x.T @ (x @ w), axis)''',
    program='''
        def dp_square_program(w, x, n):
            return x.T @ (x @ w)''',
    explicit='''
        def dp_square_explicit_program(w, x, n):
            # x.T @ ... contracts the sharded rows: say where the sum lives
            return jnp.matmul(x.T, x @ w, out_sharding=P())''',
    numpy='''
        def dp_square_numpy(w, x, n):
            w64, x64 = np.asarray(w, np.float64), np.asarray(x, np.float64)
            return (x64.T @ (x64 @ w64)).astype(x.dtype)''',
    pmap_in_axes="(None, 0)", pmap_args="w, x.reshape(n, -1, *x.shape[1:])",
    pmap_out="out[0]  # replicated: every device holds the gradient",
    in_specs='(P(), P("i"))', out_spec="P()",
    inputs="w = np.arange(3.0, dtype=np.float32)\n"
           "x = np.arange(24.0, dtype=np.float32).reshape(8, 3) % 5")

FACTS = {
    "double_psum": '''
        """The facts of recipes/double_psum.py."""
        from jax import lax

        from collectives._costs import one_collective
        from collectives._layout import by_axis_size
        from collectives._layout import one_grid
        from collectives._layout import one_input
        from collectives._layout import rows_on_axes
        from collectives._layout import rows_replicated
        from collectives._presentation import BenchSpec
        from collectives._recipe import Recipe
        from collectives._registry import register
        from collectives.recipes import double_psum as file

        register(Recipe(
            name="throwaway_double_psum", family="core",
            summary="2 * psum, a recipe added in a test",
            recipe_file="double_psum.py", body=file.double_psum_body,
            program=by_axis_size(file.double_psum_program),
            explicit_program=by_axis_size(file.double_psum_explicit_program),
            oracle=by_axis_size(file.double_psum_numpy),
            in_specs=one_input(rows_on_axes), out_specs=rows_replicated,
            example_shapes=one_grid, n_terms=lambda axes: axes.size + 1,
            dtype_kinds=frozenset({"float"}),
            cost_model=one_collective("all-reduce"),
            bench=BenchSpec(lambda x, axis, n: lax.psum(x, axis), "all-reduce")))
    ''',
    "centre": '''
        """The facts of recipes/centre.py."""
        from collectives._costs import one_collective
        from collectives._layout import by_axis_size
        from collectives._layout import one_grid
        from collectives._layout import one_input
        from collectives._layout import rows_on_axes
        from collectives._recipe import Recipe
        from collectives._registry import register
        from collectives.recipes import centre as file

        register(Recipe(
            name="throwaway_centre", family="pattern",
            summary="each block minus the mean block, a recipe added in a test",
            recipe_file="centre.py", body=file.centre_body,
            program=by_axis_size(file.centre_program),
            explicit_program=by_axis_size(file.centre_explicit_program),
            oracle=by_axis_size(file.centre_numpy),
            in_specs=one_input(rows_on_axes), out_specs=rows_on_axes,
            example_shapes=one_grid, n_terms=lambda axes: axes.size + 2,
            dtype_kinds=frozenset({"float"}), bitwise=False,
            cost_model=one_collective("all-reduce")))
    ''',
    "dp_square": '''
        """The facts of recipes/dp_square.py."""
        from collectives._costs import fixed
        from collectives._layout import by_axis_size
        from collectives._layout import make_spec
        from collectives._recipe import Recipe
        from collectives._registry import register
        from collectives.recipes import dp_square as file

        register(Recipe(
            name="throwaway_dp_square", family="strategy",
            summary="data-parallel gradient of 0.5 |x w|^2, a recipe added in a test",
            recipe_file="dp_square.py", body=file.dp_square_body,
            program=by_axis_size(file.dp_square_program),
            explicit_program=by_axis_size(file.dp_square_explicit_program),
            oracle=by_axis_size(file.dp_square_numpy),
            in_specs=lambda axes: (make_spec(), make_spec(axes.entry)),
            out_specs=lambda axes: make_spec(), arg_names=("w", "x"),
            example_shapes=lambda axes, dims: ((dims[0],), (axes.size * 2, dims[0])),
            n_terms=lambda axes: 2 * axes.size + 8,
            dtype_kinds=frozenset({"float"}),
            exact_dtypes=frozenset({"float32", "float64"}),
            cost_model=fixed({"all-reduce": 1})))
    ''',
}

DIAGRAM = '''
    """What recipes/dp_square.py does: the collectives of its compiled
    shard_map form, one row each."""
    import dataclasses

    import numpy as np

    import collectives as cx
    from collectives.hlo import collective_stats

    CAPTION = "The gradient's all-reduce over the data axis."


    @dataclasses.dataclass(frozen=True)
    class Trace:
        kinds: tuple[str, ...]
        loss_grad: np.ndarray


    def trace(n_devices=8):
        recipe = cx.RECIPES["throwaway_dp_square"]
        mesh = cx.make_mesh((n_devices,), "i")
        axes = recipe.axes(mesh)
        args = recipe.example_args(mesh, exact=True)
        stats = collective_stats(recipe.compiled("shard_map", axes),
                                 *recipe.place(*args, axes=axes))
        return Trace(tuple(op.kind for op in stats.ops),
                     np.asarray(recipe.shard_map(*args, mesh=mesh)))


    def text(record):
        return "\\n".join(f"step {i}: {kind}" for i, kind in enumerate(record.kinds))


    def draw(record, path):
        rows = "".join(f'<text x="4" y="{16 * (i + 1)}">{kind}</text>'
                       for i, kind in enumerate(record.kinds))
        open(path, "w").write(f'<svg xmlns="http://www.w3.org/2000/svg">{rows}</svg>')
'''

RECIPES = {"double_psum": CORE, "centre": PATTERN, "dp_square": STRATEGY}
NAMES = [fields["name"] for fields in RECIPES.values()]

_NOT_COPIED = shutil.ignore_patterns(
    ".git", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache", ".tox",
    "*.egg-info", "_build", "_generated", "data")
_ENV = {"JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def checkout(request, tmp_path_factory):
    """A copy of the repository with three recipes added as CONTRIBUTING.md's
    "Adding a recipe" says, step by step, and nothing else (only where the
    slow tests run: every test here is one)."""
    only_with_marker(request, "slow", SLOW)
    root = tmp_path_factory.mktemp("contributing") / "repo"
    shutil.copytree(ROOT, root, symlinks=True, ignore=_NOT_COPIED)
    steps = (ROOT / "CONTRIBUTING.md").read_text()
    # Step 1, the recipe file; step 2, its facts module, named alike.
    for stem, fields in RECIPES.items():
        assert "recipes/<file>.py" in steps and "collectives/_facts/<file>.py" in steps
        (root / "recipes" / f"{stem}.py").write_text(_recipe_file(**fields))
        (root / "collectives" / "_facts" / f"{stem}.py").write_text(
            textwrap.dedent(FACTS[stem]))
    # Step 3, a core recipe: its name joins the README's contract.
    assert "README's **Core recipes** bullet" in steps
    readme = root / "README.md"
    text = readme.read_text()
    readme.write_text(text.replace("`axis_index` — each", "`axis_index`, "
                                   "`throwaway_double_psum` — each", 1))
    # Step 4, a strategy: its diagram, named like its recipe file.
    assert "collectives/_strategy_diagrams/<file>.py" in steps
    (root / "collectives" / "_strategy_diagrams" / "dp_square.py").write_text(
        textwrap.dedent(DIAGRAM))
    return root


@pytest.mark.slow
def test_each_new_recipe_reaches_list_check_show_the_gallery_and_the_bench(checkout):
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
        main(["show", "throwaway_dp_square", "--hlo"])
        from collectives._strategy_diagrams import dp_square
        print("diagram:", dp_square.text(dp_square.trace()))
        raise SystemExit(main(["check", *sys.argv[1:]]))
    """)
    out = run_python("-c", script, *NAMES, cwd=checkout, env=_ENV).stdout
    for name in NAMES:
        assert re.search(rf"^{name} +\S", out, re.M), out
    # list: the core recipe among the core ones, the strategy last
    listed = re.findall(r"^(\w+)  ", out, re.M)
    assert listed.index("throwaway_double_psum") < listed.index("allgather_matmul")
    assert listed[-1] == "throwaway_dp_square" or listed.index(
        "throwaway_dp_square") > listed.index("ring_attention")
    for section, stem in (("Core collectives", "double_psum"),
                          ("Patterns", "centre"),
                          ("Parallelism strategies", "dp_square")):
        assert re.search(rf"gallery: {section} {stem}\.py \['throwaway_", out), out
    assert any("shard_map" in row for row in
               re.findall(r"^throwaway_double_psum .*", out, re.M)), out
    assert out.count("form: meets its cost model") == 3, out  # every placed form
    assert "diagram: step 0: all-reduce" in out, out
    assert "12 agree, 0 disagree" in out, out  # 3 recipes x 4 mesh configurations
    for stem in RECIPES:
        standalone = run_python(f"recipes/{stem}.py", cwd=checkout, env=_ENV).stdout
        assert "ok: every form agrees with NumPy" in standalone


REGISTRY_DRIVEN = (
    "tests/test_conformance.py", "tests/test_one_implementation.py",
    "tests/test_recipe_files.py", "tests/test_core_properties.py",
    "tests/test_bad_input.py", "tests/test_hlo.py", "tests/test_compat_results.py",
    "tests/test_explicit_regions.py",
)
"""The suite's files that iterate the registry (the rest test named recipes)."""


@pytest.mark.slow
def test_the_registry_driven_suite_runs_each_new_recipe_and_passes(checkout):
    args = ("-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
            *REGISTRY_DRIVEN, "-k", "throwaway or double_psum or centre or dp_square")
    ran = run_python(*args, cwd=checkout, env=_ENV, timeout=900, check=False)
    out = ran.stdout
    assert ran.returncode == 0, out[-6000:] + ran.stderr[-3000:]
    for name in (*NAMES, *(f"{stem}.py" for stem in RECIPES)):
        assert name in run_python(*args, "--collect-only", cwd=checkout,
                                  env=_ENV).stdout, name
    assert re.search(r"\b\d{2,} passed", out), out
    assert "failed" not in out and "error" not in out.lower().replace(
        "errors", ""), out
