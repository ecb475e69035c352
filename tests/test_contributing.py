"""Adding a recipe is what CONTRIBUTING.md says: in a copy of the repository,
two recipes of each family (core, pattern, strategy, kernel) are added by the
steps that its "Adding a recipe" section lists, and nothing else
(``tools/contributing_trial.py``); each then reaches ``list``, ``check``,
``show --hlo``, the gallery, the bench and every registry-driven part of the
suite, and passes there. CI runs the whole suite, the documentation build
and the browser check in such a copy."""

import re
import textwrap

import pytest

from helpers import ROOT
from helpers import SLOW
from helpers import load_file
from helpers import only_with_marker
from helpers import run_python

trial = load_file(ROOT / "tools" / "contributing_trial.py", "contributing_trial")
NAMES = trial.NAMES
_ENV = {"JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def checkout(request, tmp_path_factory):
    """A copy of the repository with eight recipes added as CONTRIBUTING.md's
    "Adding a recipe" says, step by step, and nothing else (only where the
    slow tests run: every test here is one)."""
    only_with_marker(request, "slow", SLOW)
    return trial.build(tmp_path_factory.mktemp("contributing") / "repo")


@pytest.mark.slow
def test_each_new_recipe_reaches_list_check_show_the_gallery_and_the_bench(checkout):
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        sys.path.insert(0, "docs/_ext")
        import gallery_sections
        from collectives._cli import main
        main(["list"])
        import collectives as cx
        print("order:", " ".join(f"{name}:{recipe.family}"
                                 for name, recipe in cx.RECIPES.items()))
        paths = sorted(Path("recipes").glob("*.py"))
        for title, members in gallery_sections.sections(paths):
            for path, names in members:
                print("gallery:", title, path.name, names)
        main(["bench", "-c", "throwaway_double_psum", "-b", "1K", "-e", "1K",
              "--budget", "0", "-r", "2", "--no-memory", "-q"])
        import importlib
        for stem in ("dp_square", "dp_mean_square"):
            main(["show", "throwaway_" + stem, "--hlo"])
            diagram = importlib.import_module("collectives._strategy_diagrams." + stem)
            print("diagram:", stem, diagram.text(diagram.trace()))
        raise SystemExit(main(["check", *sys.argv[1:]]))
    """)
    out = run_python("-c", script, *NAMES, cwd=checkout, env=_ENV,
                     timeout=900).stdout
    for name in NAMES:
        assert re.search(rf"^{name} +\S", out, re.M), out
    # list: in the registry's order, the families one after another, each new
    # recipe in its own
    order = dict(pair.split(":") for pair in
                 re.search(r"^order: (.*)$", out, re.M).group(1).split())
    assert re.findall(r"^(\w+)  ", out, re.M)[:len(order)] == list(order), out
    ranks = [list(trial.FAMILIES).index(family) for family in order.values()]
    assert ranks == sorted(ranks), order
    for family, stems in trial.FAMILIES.items():
        assert all(order[f"throwaway_{stem}"] == family for stem in stems), order
    titles = {"core": "Core collectives", "pattern": "Patterns",
              "strategy": "Parallelism strategies",
              "kernel": "Kernels: collectives from the inside"}
    for family, stems in trial.FAMILIES.items():
        for stem in stems:
            assert re.search(rf"gallery: {titles[family]} {stem}\.py "
                             rf"\['throwaway_{stem}'\]", out), (stem, out)
    assert any("shard_map" in row for row in
               re.findall(r"^throwaway_double_psum .*", out, re.M)), out
    assert out.count("form: meets its cost model") == 6, out  # 2 x every placed form
    for stem in ("dp_square", "dp_mean_square"):
        assert f"diagram: {stem} step 0: all-reduce" in out, out
    # 6 lax recipes x 4 mesh configurations, 2 kernels x 3 (one axis at a time)
    assert "30 agree, 0 disagree" in out, out
    for stem in trial.STEMS:
        standalone = run_python(f"recipes/{stem}.py", cwd=checkout, env=_ENV).stdout
        assert re.search(r"^ok: .* with NumPy$", standalone, re.M), standalone


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
            *REGISTRY_DRIVEN, "-k", " or ".join(["throwaway", *trial.STEMS]))
    ran = run_python(*args, cwd=checkout, env=_ENV, timeout=900, check=False)
    out = ran.stdout
    assert ran.returncode == 0, out[-6000:] + ran.stderr[-3000:]
    for name in (*NAMES, *(f"{stem}.py" for stem in trial.STEMS)):
        assert name in run_python(*args, "--collect-only", cwd=checkout,
                                  env=_ENV).stdout, name
    assert re.search(r"\b\d{2,} passed", out), out
    assert "failed" not in out and "error" not in out.lower().replace(
        "errors", ""), out
