"""Every file in recipes/ and guides/ runs standalone and imports only jax
and numpy (and optax, in the training files whose docstring says
``Requires: optax``); recipes/ holds the registered recipes, guides/ the
rest, and each file has its own test module."""

import ast
import os
import re

import pytest

import collectives as cx
from helpers import GUIDE_FILES
from helpers import RECIPE_FILES
from helpers import ROOT
from helpers import STANDALONE_FILES
from helpers import run_python

ALLOWED_IMPORTS = {"jax", "numpy", "functools", "math", "os", "time", "__future__"}


def test_recipes_hold_the_registered_recipes_and_guides_the_rest():
    sources = {recipe.recipe_file for recipe in cx.RECIPES.values()}
    unused = {path.name for path in RECIPE_FILES} - sources
    assert not unused, (f"{sorted(unused)}: no registered recipe comes from "
                        "these files in recipes/; a file that shows no recipe "
                        "(a sharp edge, a migration, a walk-through) goes in "
                        "guides/")
    assert not sources & {path.name for path in GUIDE_FILES}, (
        "a registered recipe's file is in guides/; it goes in recipes/")


@pytest.mark.parametrize("path", STANDALONE_FILES, ids=lambda p: p.name)
def test_each_file_has_its_own_test_module(path):
    assert (ROOT / "tests" / f"test_{path.stem}.py").exists(), (
        f"{path.parent.name}/{path.name} has no tests/test_{path.stem}.py")


@pytest.mark.parametrize("path", STANDALONE_FILES, ids=lambda p: p.name)
def test_recipe_imports_only_jax_and_numpy(path):
    tree = ast.parse(path.read_text())
    allowed = ALLOWED_IMPORTS | (
        {"optax"} if "Requires: optax." in ast.get_docstring(tree) else set())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots = {(node.module or "").split(".")[0]}
        else:
            continue
        assert roots <= allowed, f"{path.name} imports {roots}"


@pytest.mark.parametrize("path", STANDALONE_FILES, ids=lambda p: p.name)
def test_recipe_skeleton(path):
    text = path.read_text()
    doc = ast.get_docstring(ast.parse(text))
    assert doc and "Devices:" in doc and "JAX versions checked:" in doc, path.name
    assert 'if __name__ == "__main__":' in text
    tags = ["shard_map", "jit", "numpy"]
    if path.name in {recipe.recipe_file for recipe in cx.RECIPES.values()}:
        tags.append("explicit")  # every registered recipe shows its explicit form
    for tag in tags:
        assert f"# [start:{tag}]" in text and f"# [end:{tag}]" in text, (path, tag)
    # Simulated devices are CPU devices: choose the platform too, or a GPU
    # machine's one device would be the default backend.
    if '"jax_num_cpu_devices"' in text:
        assert ('jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", '
                '"cpu"))') in text, path.name


# $COLLECTIVES_RECIPE_PYTHON: an interpreter whose environment holds only jax,
# numpy and optax (CI sets one), to run the files where this package is absent.
RECIPE_PYTHON = os.environ.get("COLLECTIVES_RECIPE_PYTHON") or None
WITHOUT_PACKAGE = {"PYTHONPATH": ""} if RECIPE_PYTHON else None


@pytest.mark.skipif(RECIPE_PYTHON is None, reason="COLLECTIVES_RECIPE_PYTHON unset")
def test_the_recipe_interpreter_lacks_this_package(tmp_path):
    result = run_python("-c", "import collectives", python=RECIPE_PYTHON,
                        env=WITHOUT_PACKAGE, check=False, cwd=tmp_path)
    assert result.returncode != 0 and "No module named 'collectives'" in (
        result.stderr), result.stderr


@pytest.mark.parametrize("path", STANDALONE_FILES, ids=lambda p: p.name)
def test_recipe_runs_standalone(path, tmp_path):
    # A fresh process in an empty directory, as a user who copied the file.
    result = run_python(str(path), cwd=tmp_path, python=RECIPE_PYTHON,
                        env=WITHOUT_PACKAGE)
    assert "ok:" in result.stdout, result.stdout
    # and numbers a reader can check by hand, not only "ok"
    shown = [line for line in result.stdout.splitlines()
             if not line.startswith("ok:") and re.search(r"\d", line)]
    assert shown, f"{path.name} prints no numbers besides its verdict:\n{result.stdout}"


def test_the_recipes_folder_runs_as_an_index_of_its_files(tmp_path):
    result = run_python(str(RECIPE_FILES[0].parent / "__init__.py"), cwd=tmp_path,
                        python=RECIPE_PYTHON, env=WITHOUT_PACKAGE)
    listed = [line.split()[0] for line in result.stdout.splitlines()]
    assert listed == [path.name for path in RECIPE_FILES], result.stdout
