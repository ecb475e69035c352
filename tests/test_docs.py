"""The documentation's sources: code that runs, references that exist, pages reachable.

The site itself is built (warnings as errors) by ``tox -e docs`` and in CI;
these checks need no Sphinx and run with the suite.
"""

import ast
import contextlib
import io
import re

import pytest

from collectives._diagram import diagram_names
from helpers import RECIPES_DIR
from helpers import ROOT

DIAGRAM_NAMES = diagram_names()

DOCS = ROOT / "docs"


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)


def _toctree_entries(text: str) -> set[str]:
    entries = set()
    for block in re.findall(r"```\{toctree\}\n(.*?)```", text, re.S):
        entries |= {line.strip() for line in block.splitlines()
                    if line.strip() and not line.strip().startswith(":")}
    return entries


def _conf_value(name: str):
    tree = ast.parse((DOCS / "conf.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"docs/conf.py sets no {name}")


def test_the_tour_runs_and_prints_what_it_says():
    (tour,) = _python_blocks("start.md")
    assert len(tour.strip().splitlines()) <= 24
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(tour, "docs/start.md", "exec"), {})
    text = out.getvalue()
    assert "psum_scatter over 4 devices" in text
    assert "reduce-scatter           1" in text
    assert text.rstrip().endswith("[3. 0. 1. 2.]")


def test_every_page_is_reachable_from_the_index():
    entries = _toctree_entries((DOCS / "index.md").read_text())
    entries |= _toctree_entries((DOCS / "api.md").read_text())
    pages = {p.stem for p in DOCS.glob("*.md")} - {"index"}
    assert pages <= entries, f"not in any toctree: {sorted(pages - entries)}"


def test_migration_guide_points_at_functions_and_tests_that_exist():
    text = (DOCS / "migration.md").read_text()
    shown = re.findall(r"\{literalinclude\} \.\./recipes/(\w+)\.py\s+"
                       r":language: python\s+:pyobject: (\w+)", text)
    assert len(shown) == text.count(":pyobject:")
    for stem, name in shown:
        recipe = ast.parse((RECIPES_DIR / f"{stem}.py").read_text())
        assert name in {n.name for n in recipe.body
                        if isinstance(n, ast.FunctionDef)}, (stem, name)
    tests = "".join((ROOT / "tests" / f"test_{stem}.py").read_text()
                    for stem in sorted({stem for stem, _ in shown}))
    named = set(re.findall(r"`(test_\w+)`", text))
    assert named and all(f"def {name}(" in tests for name in named), named
    # Every idiom of JAX's migration guide has a section.
    for idiom in ("in_axes=None", "out_axes=None", "Nested pmap",
                  "device_put_sharded", "unreplicate", "donate_argnums"):
        assert idiom in text, idiom


@pytest.mark.parametrize("page", ["concepts.md", "migration.md", "index.md",
                                  "strategies.md"])
def test_links_into_the_gallery_name_recipe_files(page):
    text = (DOCS / page).read_text()
    for stem in re.findall(r"_generated/gallery/(\w+)\.md", text):
        assert (RECIPES_DIR / f"{stem}.py").exists(), (page, stem)
    for name in re.findall(r"\{collective-diagram\} (\w+)", text):
        assert name in DIAGRAM_NAMES, (page, name)


def test_concepts_has_a_row_and_a_diagram_for_every_core_collective():
    text = (DOCS / "concepts.md").read_text()
    for name in DIAGRAM_NAMES:
        assert f"{{collective-diagram}} {name}\n" in text, name
        assert re.search(rf"^\| \[?`{name}", text, re.M) or (
            name in ("pmax", "pmin") and "[`pmax`, `pmin`]" in text), name
