"""The Sphinx extensions in docs/_ext, which need the docs extra (Sphinx),
and the site's browser check on pages made here, which needs Chromium.

Skipped where Sphinx (or Chromium) is not installed; CI runs this file in its
docs venv (``.ci/run``'s docs job, Chromium installed), and
``tools/never_run.py`` fails CI if no venv runs it.
"""

import ast
import importlib.util
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from collectives import RECIPES
from helpers import ROOT
from helpers import STANDALONE_FILES

DOCS = ROOT / "docs"


@pytest.fixture
def docs_ext(monkeypatch):
    pytest.importorskip("sphinx", reason="the docs extensions need the docs extra")
    monkeypatch.syspath_prepend(str(DOCS / "_ext"))


def test_gallery_pages_are_titled_by_their_recipes_and_index_them(docs_ext):
    # A search for a recipe's name finds its page first: the page's title
    # names it and the page holds a main index entry for it.
    import gallery
    from gallery_sections import sections

    core = {name for name, recipe in RECIPES.items() if recipe.family == "core"}
    seen = set()
    for _, members in sections(STANDALONE_FILES):
        for path, names in members:
            doc = ast.get_docstring(ast.parse(path.read_text()))
            title = gallery.page_title(gallery.docstring_markdown(doc)[0],
                                       names, path.stem)
            words = set(re.findall(r"[\w*]+", title))
            for name in names:
                assert name in words or any(
                    w.endswith("*") and name.startswith(w[:-1]) for w in words), (
                    path.name, name, title)
            entries = gallery.index_entries(names)
            assert all(f"! {name}" in entries[0] for name in names), entries
            assert title not in (path.stem, f"{path.stem}.py"), title
            seen |= core & set(names)
    assert seen == core
    assert gallery.page_title("All-reduce: psum and pmean in three forms",
                              ["psum", "pmean"], "reductions") == (
        "All-reduce: psum, pmean")
    assert gallery.page_title("Matmuls", ["mm", "mm_a", "mm_b", "other"], "mm") == (
        "Mm: mm*, other")


def test_compat_matrices_scroll_in_a_box_that_keeps_their_labels(docs_ext):
    import compat_matrix

    results = {"0.8.0": {"recipes": {"psum": {"ok": True}},
                         "probes": {"p": True}},
               "0.9.0": {"recipes": {"psum": {"ok": True}}, "probes": {}}}
    recipes = compat_matrix.recipes_table(results, ["psum"], {})
    apis = compat_matrix.apis_table(results, {"p": ("a probe", "")})
    for text, row in ((recipes, "| `psum` | ✓ | ✓ |"), (apis, "| `p` | ● | · |")):
        box = re.search(r"```\{container\} compat-matrix\n\n(.*?)```", text, re.S)
        assert box and row in box.group(1), text


def test_a_recipe_no_result_measured_is_shown_as_not_yet_measured(docs_ext):
    import compat_matrix

    results = {"0.8.0": {"recipes": {"psum": {"ok": True}}},
               "0.9.0": {"recipes": {"psum": {"ok": True},
                                     "throwaway": {"ok": True}}},
               "0.9.1": {"recipes": {"psum": {"ok": True}}}}
    text = compat_matrix.recipes_table(results, ["psum", "throwaway"], {})
    assert "| `throwaway` | ? | ✓ | ? |" in text, text
    assert "- `throwaway`: 0.8.0, 0.9.1" in text, text
    assert "Not yet measured" in text and "--missing" in text, text
    assert "Every recipe agrees" not in text, text
    measured = {release: {"recipes": {"psum": {"ok": True}}} for release in results}
    assert "Every recipe agrees" in compat_matrix.recipes_table(
        measured, ["psum"], {})
    # A failure is still a failure, listed with its reason, next to the gaps.
    results["0.9.0"]["recipes"]["psum"] = {"ok": False, "reason": "R1"}
    text = compat_matrix.recipes_table(results, ["psum", "throwaway"], {"psum": "W"})
    assert "| `psum` | ✓ | ✗ [1] | ✓ |" in text, text
    assert "1. psum on 0.9.0: R1 Workaround: W" in text, text
    assert "- `throwaway`: 0.8.0, 0.9.1" in text, text


def test_rows_measured_after_their_release_are_listed_with_their_commit(docs_ext):
    import compat_matrix

    run = {"python": "3.11", "date": "2026-11-30", "commit": "abc1234",
           "install": {"ok": True}, "check": {"agree": 5, "disagree": 0}}
    results = {"0.8.0": {**run, "recipes": {
        "psum": {"ok": True},
        "throwaway": {"ok": True, "date": "2026-12-02", "commit": "def5678"}}}}
    text = compat_matrix.releases_table(results)
    assert "jax 0.8.0: `throwaway` (2026-12-02, `def5678`)" in text, text
    assert "`psum` (" not in text, text
    # a release measured again as a whole: one entry, not one per recipe
    results["0.8.0"]["recipes"]["psum"] = {"ok": True, "date": "2026-12-02",
                                           "commit": "def5678"}
    text = compat_matrix.releases_table(results)
    assert "jax 0.8.0: every recipe (2026-12-02, `def5678`)" in text, text


def test_the_explicit_form_has_its_own_matrix_with_each_skip_reason_once(docs_ext):
    import compat_matrix

    install = {"install": {"ok": True}}
    def keys(release):
        return {"ok": True, "explicit": f"skipped: JAX {release} cannot reshard keys"}
    agrees = {"ok": True, "explicit": "agrees"}
    results = {
        "0.8.0": {**install, "recipes": {"psum": agrees,
                                         "mc": keys("0.8.0")}},
        "0.9.0": {**install, "recipes": {"psum": {"ok": True},  # measured before it
                                         "mc": keys("0.9.0")}},
        "0.10.0": {**install, "recipes": {"psum": {"ok": False, "explicit": "fails"},
                                          "mc": agrees}}}
    text = compat_matrix.explicit_table(results, ["psum", "mc"])
    box = re.search(r"```\{container\} compat-matrix\n\n(.*?)```", text, re.S)
    assert "| `psum` | ✓ | ? | ✗ |" in box.group(1), text
    skipped = compat_matrix.SKIPPED
    assert f"| `mc` | {skipped} [1] | {skipped} [1] | ✓ |" in box.group(1), text
    assert "1. `mc`: skipped: this release cannot reshard keys" in text, text
    assert "2." not in text, text
    assert "Not yet measured (?): 1 rows" in text and "--missing" in text, text


WIDE_COMMAND = "python -m collectives plan " + " ".join(
    f"--flag-{i} {i}" for i in range(20))
WIDE_TABLE = ("<table><thead><tr><th>row</th>"
              + "".join(f"<th>column&nbsp;number&nbsp;{i}</th>" for i in range(24))
              + "</tr></thead><tbody><tr><td>a</td>"
              + "".join(f"<td>{i}</td>" for i in range(24)) + "</tr></tbody></table>")
PAGE = f"""<!doctype html><html><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>.bd-article {{ max-width: 800px; }}
.pst-scrollable-table-container, pre {{ overflow-x: auto; }}</style>{{script}}</head>
<body><article class="bd-article"><p>A page.</p>
<pre>{WIDE_COMMAND}</pre>
<div class="pst-scrollable-table-container">{WIDE_TABLE}</div>
</article></body></html>"""


def _problems_at(page: str, widths: tuple[int, ...]) -> dict[int, list[str]]:
    """The page script's problems on ``page`` (HTML) at each width."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("the browser check needs Chromium (apt-get install chromium)")
    spec = importlib.util.spec_from_file_location(
        "browser_check", DOCS / "browser_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as root:
        (Path(root) / "page.html").write_text(page)
        (Path(root) / "collectives.js").write_text(
            (DOCS / "_theme" / "collectives.js").read_text())
        server, base = check.serve(Path(root))
        process, url = check.start_chromium(binary, str(Path(root) / "profile"))
        socket = None
        try:
            socket = check.WebSocket(url)
            tools = check.DevTools(socket)
            tools.call("Page.enable")
            return {width: check.check_page(tools, base + "page.html", width, None,
                                            {}, [])["problems"]
                    for width in widths}
        finally:
            if socket is not None:
                socket.close()
            process.kill()
            process.wait()
            process.stderr.close()
            server.shutdown()
            server.server_close()


def test_the_browser_check_refuses_a_command_line_or_table_cut_on_a_desktop():
    # At 1400 px the article is read whole: a code box or a table that
    # scrolls sideways hides text. On a phone a table may scroll, with the
    # line above it (the theme's collectives.js) saying so; without that
    # line it is a problem too.
    bare = _problems_at(PAGE.replace("{script}", ""), (1400, 390))
    assert any(p.startswith("code box hides text") and "--flag-0" in p
               for p in bare[1400]), bare[1400]
    assert any(p.startswith("table hides columns") for p in bare[1400]), bare[1400]
    assert any(p.startswith("table scrolls sideways with no line saying so")
               for p in bare[390]), bare[390]
    script = '<script src="collectives.js"></script>'
    hinted = _problems_at(PAGE.replace("{script}", script), (390,))
    assert not [p for p in hinted[390] if "table" in p], hinted[390]
    narrow = PAGE.replace("{script}", "").replace(
        WIDE_COMMAND, "python -m collectives check")
    narrow = narrow.replace(WIDE_TABLE, "<table><tr><td>a</td><td>1</td></tr></table>")
    assert _problems_at(narrow, (1400,)) == {1400: []}


def test_every_kernels_dma_cost_is_found_in_the_facts_module_of_its_file(docs_ext):
    # the kernels page reads each kernel's DmaCost from the facts module named
    # like its recipe file, whatever that module calls the recipe itself
    from kernel_diagrams import dma_cost_function

    import collectives as cx
    from collectives._facts._kernel import DmaCost

    kernels = [name for name, recipe in RECIPES.items() if recipe.family == "kernel"]
    assert len(kernels) >= 7, kernels
    for name in kernels:
        recipe = RECIPES[name]
        mesh = cx.make_mesh((8,), "i")
        axes = recipe.axes(mesh)
        cost = dma_cost_function(name)(axes, recipe.example_args(mesh))
        assert isinstance(cost, DmaCost) and cost.steps >= 1, (name, cost)
        assert dma_cost_function(name).__module__ == (
            f"collectives._facts.{Path(recipe.recipe_file).stem}"), name
