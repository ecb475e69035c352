"""The documentation's sources: code that runs, references that exist, pages reachable.

The site itself is built (warnings as errors) by ``tox -e docs`` and in CI;
these checks need no Sphinx and run with the suite (the docs extensions' own
tests, which need it, are in test_docs_extensions.py).
"""

import ast
import contextlib
import io
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from collectives import RECIPES
from collectives._diagram import diagram_names
from helpers import ROOT
from helpers import STANDALONE_FILES
from helpers import standalone_file

DIAGRAM_NAMES = diagram_names()

DOCS = ROOT / "docs"


def _python_blocks(page: str) -> list[str]:
    # ```python blocks, and ```{runnable} ones (shown with their output)
    return re.findall(r"```(?:python|\{runnable\})\n(.*?)```",
                      (DOCS / page).read_text(), re.S)


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


def test_no_page_names_a_private_module():
    # The site's browser check finds these in the built pages, near CI's end;
    # a page's own source is where they are written.
    named = {page.name: sorted(set(re.findall(r"collectives\._\w+", page.read_text())))
             for page in sorted(DOCS.glob("*.md"))}
    assert not {page: names for page, names in named.items() if names}, (
        "a page of the site names private modules; name the public API or the test")


def test_migration_guide_points_at_functions_and_tests_that_exist():
    text = (DOCS / "migration.md").read_text()
    shown = re.findall(r"\{literalinclude\} \.\./(?:recipes|guides)/(\w+)\.py\s+"
                       r":language: python\s+:pyobject: (\w+)", text)
    assert len(shown) == text.count(":pyobject:")
    for stem, name in shown:
        recipe = ast.parse(standalone_file(stem).read_text())
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
        assert standalone_file(stem).exists(), (page, stem)
    for name in re.findall(r"\{collective-diagram\} (\w+)", text):
        assert name in DIAGRAM_NAMES, (page, name)


def test_concepts_has_a_row_and_a_diagram_for_every_core_collective():
    text = (DOCS / "concepts.md").read_text()
    # The figures (and their ``collective-NAME`` anchors) come from the registry.
    assert "```{collective-diagrams} core\n```" in text
    for name in DIAGRAM_NAMES:
        if RECIPES[name].family == "core":
            assert re.search(rf"^\| \[?`{name}", text, re.M) or (
                name in ("pmax", "pmin") and "[`pmax`, `pmin`]" in text), name


def test_landing_page_has_install_snippet_and_a_door_to_each_page():
    # (docs/browser_check.py checks the built site: a card for every page of
    # the navigation's Recipes and Using it sections)
    text = (DOCS / "index.md").read_text()
    assert "```bash\npip install" in text
    assert "```{readme-snippet}\n```" in text  # the README's code, run at build
    assert "```{collective-diagram} psum\n```" in text
    doors = re.findall(r":::\{grid-item-card\} (.+)\n:link: (\w+)", text)
    assert doors[:3] == [("Learn shard_map", "concepts"),
                         ("Migrate from pmap", "migration"),
                         ("Test my sharded code", "testing")], doors
    assert {page for _, page in doors} >= {
        "gallery", "strategies", "choosing", "sharp_edges", "compatibility",
        "benchmarks", "multi_process"}
    for _, page in doors:
        assert (DOCS / f"{page}.md").exists(), page


def test_readme_snippet_prints_the_psum_the_landing_page_shows():
    # The landing page shows this code and whatever it prints at build time;
    # here: it runs, on simulated CPU devices, and prints the sum over "i".
    readme = (ROOT / "README.md").read_text()
    code = re.findall(r"^```python\n(.*?)^```", readme, re.S | re.M)[0]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_NUM_CPU_DEVICES", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                            text=True, timeout=300, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    x = np.arange(32.0).reshape(4, 2, 4)
    assert result.stdout.strip() == str(x.sum(0)), result.stdout


def test_every_recipe_file_tags_the_forms_the_gallery_shows_in_tabs():
    import collectives as cx

    sources = {recipe.recipe_file for recipe in cx.RECIPES.values()}
    for path in STANDALONE_FILES:
        text = path.read_text()
        # a file that holds registered recipes shows their per-device body
        tags = ("body", "shard_map", "jit", "pmap", "numpy") if (
            path.name in sources) else ("shard_map", "jit", "pmap", "numpy")
        for tag in tags:
            assert f"# [start:{tag}]\n" in text and f"# [end:{tag}]\n" in text, (
                path.name, tag)


def test_every_pitfall_has_an_anchor_and_a_verified_on_note():
    text = (DOCS / "sharp_edges.md").read_text()
    numbers = re.findall(r"^## (\d+)\. ", text, re.M)
    assert numbers == [str(n) for n in range(1, len(numbers) + 1)], numbers
    for n in numbers:
        assert f"(pitfall-{n})=\n## {n}. " in text, n
        assert f"{{ref}}`{n} <pitfall-{n}>`" in text, n  # the summary table links it
    sections = re.split(r"^## \d+\. ", text, flags=re.M)[1:len(numbers) + 1]
    for n, section in zip(numbers, sections, strict=True):
        assert ":::{dropdown} Verified on" in section, n
        prose = re.sub(r":::\{dropdown\}.*?\n:::", "", section, flags=re.S)
        assert "test_pitfall" not in prose and "_compat." not in prose, n
    assert "collectives._" not in text



def test_pitfall_counts_in_prose_come_from_the_table():
    # conf.py counts the summary table's rows; the pages say the count
    # through the {{ pitfalls }} substitution, never as a typed number word.
    tree = ast.parse((DOCS / "conf.py").read_text())
    wanted = {"NUMBER_WORDS", "pitfall_count", "number_word"}
    nodes = [n for n in tree.body if getattr(n, "name", None) in wanted or (
        isinstance(n, ast.Assign) and n.targets[0].id in wanted)]
    facts = {"DOCS": DOCS, "re": re}
    exec(compile(ast.Module(nodes, type_ignores=[]), "docs/conf.py", "exec"), facts)
    text = (DOCS / "sharp_edges.md").read_text()
    sections = re.findall(r"^## (\d+)\. ", text, re.M)
    assert facts["pitfall_count"]() == len(sections) > 10
    assert facts["number_word"](len(sections)) == facts["NUMBER_WORDS"][len(sections)]
    words = "|".join(facts["NUMBER_WORDS"][2:])
    for page, use in (("sharp_edges.md", "{{ pitfalls | capitalize }} ways"),
                      ("index.md", "{{ pitfalls }} pitfalls"),
                      ("start.md", "{{ pitfalls }} ways")):
        text = (DOCS / page).read_text()
        assert use in text, page
        typed = re.findall(rf"\b({words}) (?:ways|pitfalls)\b", text, re.I)
        assert not typed, (page, typed)
    # GitHub renders the README without substitutions: its typed word must match
    readme = (DOCS.parent / "README.md").read_text()
    typed = re.findall(rf"\b({words}) pitfalls\b", readme, re.I)
    assert [t.lower() for t in typed] == [facts["number_word"](len(sections))], typed


def _browser_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "browser_check", DOCS / "browser_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("size", [5, 300, 70_000])
def test_browser_check_websocket_frames_round_trip(size):
    # The DevTools client is written with the standard library only: its
    # frames must be what RFC 6455 says, at each of the three length sizes.
    import socket
    import struct

    ws_class = _browser_check().WebSocket
    near, far = socket.socketpair()
    ws = object.__new__(ws_class)
    ws.sock, ws.buffer = near, b""
    text = ("é" + "x" * size)[:size]
    ws.send(text)
    first, second = far.recv(2, socket.MSG_WAITALL)
    assert first == 0x81 and second & 0x80  # final text frame, masked
    n = second & 0x7F
    if n == 126:
        n = struct.unpack(">H", far.recv(2, socket.MSG_WAITALL))[0]
    elif n == 127:
        n = struct.unpack(">Q", far.recv(8, socket.MSG_WAITALL))[0]
    mask = far.recv(4, socket.MSG_WAITALL)
    payload = far.recv(n, socket.MSG_WAITALL)
    assert bytes(b ^ mask[i % 4] for i, b in enumerate(payload)).decode() == text
    # The browser's reply, unmasked and split in two frames (continuation).
    data = text.encode()
    half = len(data) // 2

    def frame(opcode_byte, chunk):
        n = len(chunk)
        head = bytes([opcode_byte])
        if n < 126:
            return head + bytes([n]) + chunk
        if n < 1 << 16:
            return head + bytes([126]) + struct.pack(">H", n) + chunk
        return head + bytes([127]) + struct.pack(">Q", n) + chunk

    far.sendall(frame(0x01, data[:half]) + frame(0x80, data[half:]))
    assert ws.recv() == text
    near.close()
    far.close()


def test_browser_check_searches_each_collective_for_its_recipe_page():
    wanted = _browser_check().search_pages()
    assert wanted["psum"] == wanted["pmin"] == "reductions"
    assert wanted["ppermute"] == wanted["ppermute_ring"] == "ppermute"
    assert wanted["all_to_all"] == "all_to_all"
    assert wanted["all_to_all_blocks"] == "all_to_all_blocks"
    core = {name for name, recipe in RECIPES.items() if recipe.family == "core"}
    assert core <= set(wanted)
