"""The recipe gallery: one page per file in ``recipes/`` and ``guides/``,
made at build time.

Each page is written from the file itself: its docstring, its tagged regions
(``# [start:NAME]`` ... ``# [end:NAME]``, pulled in with ``literalinclude``),
its ``main()``, and what it printed when this build ran it in a subprocess.
A new file in either folder gets a page with no change here. A recipe that
fails, or prints no ``ok:`` line, is a build warning (an error under ``-W``).

Outputs are cached in ``_generated/gallery/.cache`` by the file's content and
the Python that ran it, so a rebuild reruns only the files that changed.
"""

from __future__ import annotations

import ast
import concurrent.futures
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gallery_sections import FAMILY_TITLES
from gallery_sections import diagrams_by_file
from gallery_sections import sections
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

TAG = re.compile(r"^# \[start:([A-Za-z0-9_]+)\]\s*$", re.MULTILINE)
META = re.compile(r"^(Devices|JAX versions checked|Run):\s*(.*)$")
NUMBERED = re.compile(r"^(\s*)(\d+)\.\s+(.*)$")
BULLET = re.compile(r"^(\s*)[*-]\s+(.*)$")
CODE = re.compile(r"(``.+?``|`[^`]+`)")
EMPHASIS = re.compile(
    r"(?<![\w*])(\*\*(?=\S)([^*]+?)(?<=\S)\*\*|\*(?=[^\s*])([^*]+?)(?<=[^\s*])\*)(?![\w*])")

REGION_TITLES = {
    "shard_map": "shard_map",
    "jit": "jit",
    "explicit": "explicit",
    "pmap": "pmap (legacy)",
    "numpy": "NumPy oracle",
}


# -- docstring to MyST ---------------------------------------------------------

def _escape_plain(text: str) -> str:
    """Escape Markdown and HTML, keeping ``**bold**`` and ``*emphasis*``."""
    parts = EMPHASIS.split(text)
    # split() keeps the groups: text, whole match, bold inner, emphasis inner, ...
    out = []
    for i in range(0, len(parts), 4):
        out.append(re.sub(r"([*_<\\])", r"\\\1", parts[i]))
        if i + 1 < len(parts):
            bold, emphasis = parts[i + 2], parts[i + 3]
            inner = re.sub(r"([_<\\])", r"\\\1", bold or emphasis)
            out.append(f"**{inner}**" if bold else f"*{inner}*")
    return "".join(out)


def _escape(text: str) -> str:
    """Escape Markdown and HTML outside code spans, keeping bold and emphasis.

    The docstrings are plain text that marks ``**strong**`` and ``*emphasis*``
    as Markdown does; any other ``*`` (``2**2``, ``a * b``) is literal.
    """
    parts = CODE.split(text)
    return "".join(part if i % 2 else _escape_plain(part)
                   for i, part in enumerate(parts))


def docstring_markdown(doc: str) -> tuple[str, str]:
    """``(title, body)`` of a recipe docstring, the body as MyST Markdown.

    The docstrings are plain text: paragraphs, ``*`` bullets, numbered
    items (numbered as in the file, not renumbered), and the ``Devices:``,
    ``JAX versions checked:`` and ``Run:`` lines, which become a collapsed
    "Verified on" note at the end.
    """
    lines = doc.strip().splitlines()
    # The title is the first paragraph, however many lines it takes.
    end = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    title = " ".join(line.strip() for line in lines[:end]).rstrip(".")
    out: list[str] = []
    notes: list[str] = []
    item_indent = None  # indentation of the text of the open list item
    for line in lines[end:]:
        if not line.strip():
            out.append("")
            item_indent = None
            continue
        indent = len(line) - len(line.lstrip())
        meta, numbered = META.match(line), NUMBERED.match(line)
        bullet = BULLET.match(line)
        if meta:
            # Devices, versions, run command: a "Verified on" note at the end.
            notes.append(f"**{meta.group(1)}:** {_escape(meta.group(2))}")
            item_indent = None
        elif numbered:
            if out and out[-1]:
                out.append("")
            out.append(f"**{numbered.group(2)}.** {_escape(numbered.group(3))}")
            item_indent = len(numbered.group(1)) + 1
        elif bullet:
            out.append(f"- {_escape(bullet.group(2))}")
            item_indent = len(bullet.group(1)) + 1
        else:
            if item_indent is not None and indent < item_indent and out and out[-1]:
                out.append("")  # a paragraph after a list, not a continuation
                item_indent = None
            out.append(_escape(line.strip()))
    body = "\n".join(out).strip()
    if notes:
        body += "\n\n:::{dropdown} Verified on\n" + "\\\n".join(notes) + "\n:::"
    return title, body


# -- running the recipes -------------------------------------------------------

def _cache_key(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes())
    digest.update(sys.executable.encode())
    try:
        import jax
        digest.update(jax.__version__.encode())
    except ImportError:  # pragma: no cover - jax is a dependency
        pass
    return digest.hexdigest()


def _run(path: Path, cache_dir: Path, timeout: float) -> dict:
    cache = cache_dir / f"{path.stem}.json"
    key = _cache_key(path)
    if cache.exists():
        cached = json.loads(cache.read_text())
        if cached.get("key") == key and cached.get("returncode") == 0:
            return {**cached, "cached": True}
    env = dict(os.environ)
    env.pop("JAX_NUM_CPU_DEVICES", None)  # the recipe sets its own count
    env.setdefault("JAX_PLATFORMS", "cpu")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:  # as a user who copied the file
        try:
            result = subprocess.run(
                [sys.executable, str(path)], cwd=cwd, env=env, capture_output=True,
                text=True, timeout=timeout)
            returncode, stdout, stderr = result.returncode, result.stdout, result.stderr
        except subprocess.TimeoutExpired as error:
            returncode = -1
            stdout = error.stdout or ""
            stderr = f"timed out after {timeout:.0f} s"
            stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
    record = {"key": key, "returncode": returncode, "stdout": stdout,
              "stderr": stderr[-4000:], "seconds": time.perf_counter() - start}
    cache.write_text(json.dumps(record))
    return {**record, "cached": False}


# -- writing the pages ---------------------------------------------------------

def _regions(text: str) -> list[str]:
    return [name for name in TAG.findall(text) if f"# [end:{name}]" in text]


def _has_main(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.FunctionDef) and node.name == "main"
               for node in tree.body)


# The forms, modern first, as tabs; a file's other regions are shown above.
FORMS = ("shard_map", "jit", "explicit", "pmap", "numpy")


def _literalinclude(rel: str, region: str) -> list[str]:
    return [f"```{{literalinclude}} {rel}", ":language: python",
            f':start-after: "# [start:{region}]"',
            f':end-before: "# [end:{region}]"', "```"]


def page_title(title: str, names: list[str], stem: str) -> str:
    """A gallery page's title: what the file teaches, then its recipes' names.

    ``title`` is the docstring's title; its head (up to the first ``": "``,
    or else the file's name in words) names the topic and ``names`` (the
    registry's recipes in the file) name what to search for: ``All-reduce:
    psum, pmean, pmax, pmin``. A name that two or more others extend is
    folded into ``name*`` (``allgather_matmul*``); a file with no name beyond
    its head keeps the docstring's title.
    """
    head = (title.split(": ", 1)[0] if ": " in title
            else stem.replace("_", " ").capitalize())
    stems = [n for n in names
             if sum(m.startswith(n + "_") for m in names) >= 2]
    shown = [f"{n}*" if n in stems else n for n in names
             if n != head and not any(n.startswith(s + "_") for s in stems)]
    return f"{head}: {', '.join(shown)}" if shown else title


def index_entries(names: list[str]) -> list[str]:
    """The index directive that makes a file's page the first search result
    for each of its recipes' names (a main index entry outranks any text)."""
    if not names:
        return []
    return ["```{index} " + ", ".join(f"! {n}" for n in names), "```", ""]


def _page(path: Path, run: dict, diagrams: list[str], rel: str,
          names: list[str], family: str | None, strategy_diagram: bool) -> str:
    text = path.read_text()
    tree = ast.parse(text)
    title, body = docstring_markdown(ast.get_docstring(tree) or path.stem)
    name, shown = path.stem, _shown(path)
    lines = [f"(recipe-{name})=", f"# {_escape(page_title(title, names, name))}", "",
             *index_entries(names), f"{_escape(title)}.", "",
             f"{{download}}`Download {shown} <{rel}>`; run it with "
             f"`python {shown}` (it needs only jax and numpy"
             f"{' and optax' if 'Requires: optax.' in text else ''}).", "",
             body, ""]
    if family == "strategy":
        # (docs/browser_check.js asserts that such a page shows its per-device
        # body and its strategy diagram)
        lines += ["```{container} strategy-page", "",
                  "{bdg-primary}`parallelism strategy`", "```", ""]
        if not strategy_diagram:
            logger.warning(f"{shown} holds a parallelism strategy but "
                           "has no diagram: add collectives/_strategy_diagrams/"
                           f"{name}.py (trace, draw, text, CAPTION)",
                           location=str(path))
    if strategy_diagram:
        lines += ["## What the strategy does, step by step", "",
                  "Traced from a real run of this file's functions when this "
                  "page was built (click the figure for full size):", "",
                  "```{strategy-diagram} " + name, "```", ""]
    if diagrams:
        lines += ["## What the collectives do to the shards", ""]
        for collective in diagrams:
            lines += ["```{collective-diagram} " + collective, "```", ""]
    regions = _regions(text)
    if names and "body" not in regions:
        logger.warning(f"{shown} holds the recipe(s) {', '.join(names)} "
                       "but no '# [start:body]' region: tag the per-device body "
                       "its pmap and shard_map forms run",
                       location=str(path))
    if "body" in regions:
        lines += ["## The per-device body", "",
                  "Where the collectives are called: the code each device runs "
                  "in the `shard_map` and `pmap` forms. "
                  + (f"The library runs these same functions for "
                     f"{', '.join(f'`RECIPES[{n!r}]`' for n in names)}."
                     if names else ""), "", *_literalinclude(rel, "body"), ""]
    for region in (r for r in regions if r not in FORMS and r != "body"):
        lines += [f"## `{region}`", "", *_literalinclude(rel, region), ""]
    forms = [r for r in FORMS if r in regions]
    if forms:
        lines += ["## The forms", "",
                  "Modern first: `shard_map` (per-device code with explicit "
                  "collectives), `jit` (a global program on Auto axes; XLA "
                  "inserts the collectives), `explicit` (the global program on "
                  "Explicit axes, the shardings in the types), legacy `pmap` "
                  "(the \"before\" of a migration), and the NumPy oracle every "
                  "form is checked against.", "",
                  "`````{tab-set}"]
        for form in forms:
            lines += [f"````{{tab-item}} {REGION_TITLES[form]}", f":sync: {form}", "",
                      *_literalinclude(rel, form), "````"]
        lines += ["`````", ""]
    output = run["stdout"].rstrip() or "(no output)"
    lines += ["## Output", "",
              f"What `python {shown}` printed when this page was built "
              f"({run['seconds']:.1f} s, simulated CPU devices):", "",
              "```{code-block} text", ":class: recipe-output", "", output, "```", ""]
    if _has_main(tree):
        lines += ["## Running every form against the oracle: `main()`", "",
                  f"```{{literalinclude}} {rel}", ":language: python",
                  ":pyobject: main", "```", ""]
    return "\n".join(lines)


def _listing(groups, thumbnails: dict[str, str], prefix: str,
             toctree: bool = True) -> str:
    lines = []
    for group, members in groups:
        if toctree:
            lines += [f"## {group}", ""]
        lines += ["::::{grid} 1 2 3 3", ":gutter: 3", ""]
        for path, names in members:
            doc = ast.get_docstring(ast.parse(path.read_text())) or path.stem
            title, _ = docstring_markdown(doc)
            heading = page_title(title, names, path.stem)
            # The card's title is its page's title (docs/browser_check.js
            # checks that a card titled with a page's title opens it); its
            # text, the rest of the docstring's title.
            lines += [f":::{{grid-item-card}} {_escape(heading)}",
                      f":link: recipe-{path.stem}", ":link-type: ref",
                      ":class-card: recipe-card"]
            if path.stem in thumbnails:
                lines.append(f":img-top: {thumbnails[path.stem]}")
                lines.append(":class-img-top: recipe-thumbnail")
            lines += [""]
            rest = title.split(": ", 1)[1] if ": " in title else title
            if rest.split(",")[0].split()[0] not in names:  # (not "Psum, ...")
                rest = rest[:1].upper() + rest[1:]
            if heading != title:
                lines += [f"{_escape(rest)}.", ""]
            lines += [f"{{bdg-secondary-line}}`{_shown(path)}`", ":::", ""]
        lines += ["::::", ""]
    if not toctree:
        return "\n".join(lines)
    lines += ["```{toctree}", ":hidden:", ""]
    lines += [f"{prefix}{path.stem}" for _, members in groups for path, _ in members]
    lines += ["```", ""]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """A file as a user runs it from the repository: ``recipes/psum.py``."""
    return f"{path.parent.name}/{path.name}"


def standalone_files(srcdir: Path, config) -> list[Path]:
    """The files the gallery shows: every ``.py`` in the recipes' and the
    guides' folders (each folder's ``__init__.py`` makes it a subpackage of
    ``collectives``, not a page)."""
    return [path for folder in (config.gallery_recipes_dir, config.gallery_guides_dir)
            for path in sorted((srcdir / folder).resolve().glob("*.py"))
            if path.name != "__init__.py"]


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate(app: Sphinx) -> None:
    config = app.config
    srcdir = Path(app.srcdir)
    out = srcdir / "_generated" / "gallery"
    cache_dir = out / ".cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths = standalone_files(srcdir, config)
    if not paths:
        logger.warning(f"gallery: no recipe files in {config.gallery_recipes_dir}")
        return
    start = time.perf_counter()
    jobs = config.gallery_jobs or max(2, os.cpu_count() or 2)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = dict(zip(paths, pool.map(
            lambda p: _run(p, cache_dir, config.gallery_timeout), paths), strict=True))
    fresh = sum(not run["cached"] for run in runs.values())
    logger.info(f"gallery: {len(paths)} recipes ({fresh} run, "
                f"{len(paths) - fresh} cached) in {time.perf_counter() - start:.1f} s")
    stale = {p.name for p in out.glob("*.md")} - {f"{p.stem}.md" for p in paths}
    for name in stale:
        (out / name).unlink()
    from collective_facts import strategy_diagram_files

    import collectives

    diagrams = diagrams_by_file()
    groups = sections(paths)
    names = {path.stem: recipe_names for _, members in groups
             for path, recipe_names in members}
    # a file's recipes share its family (the gallery groups files by it)
    families = {stem: collectives.RECIPES[found[0]].family
                for stem, found in names.items() if found}
    strategy_diagrams = strategy_diagram_files()
    for path, run in runs.items():
        if run["returncode"] != 0 or "ok:" not in run["stdout"]:
            logger.warning(
                f"gallery: {_shown(path)} failed (exit {run['returncode']}, "
                f"ok: line {'present' if 'ok:' in run['stdout'] else 'missing'}):\n"
                f"{run['stdout'][-2000:]}\n{run['stderr']}",
                location=None)
        rel = os.path.relpath(path, out)
        _write_if_changed(out / f"{path.stem}.md",
                          _page(path, run, diagrams.get(path.stem, []), rel,
                                names.get(path.stem, []), families.get(path.stem),
                                path.stem in strategy_diagrams))
    # Card thumbnails: each file's first diagram, drawn now so that the
    # gallery page finds the image whichever page Sphinx reads first.
    from collective_facts import draw
    from collective_facts import draw_strategy

    thumbnails = {stem: draw(names[0], srcdir) for stem, names in diagrams.items()}
    # (a strategy's own diagram, where it has one)
    thumbnails.update({stem: draw_strategy(stem, srcdir)[0]
                       for stem in sorted(strategy_diagrams) if stem in names})
    _write_if_changed(out / "listing.inc",
                      _listing(groups, thumbnails, "_generated/gallery/"))
    # The strategies page's cards: the strategy family's files.
    strategy_group = [(title, members) for title, members in groups
                      if title == FAMILY_TITLES["strategy"]]
    _write_if_changed(out / "strategies.inc",
                      _listing(strategy_group, thumbnails, "_generated/gallery/",
                               toctree=False))


_RECIPE_LINK = re.compile(r"\]\(\.\./(recipes|guides)/([A-Za-z0-9_]+\.py)?\)")


def link_recipes(app: Sphinx, docname: str, source: list[str]) -> None:
    """In the hand-written pages, links into ``../recipes/`` and
    ``../guides/`` open the gallery.

    ``[text](../recipes/NAME.py)`` goes to NAME's gallery page and
    ``[text](../recipes/)`` to the gallery itself; the files keep the plain
    relative links that also work when browsing the repository.
    """
    if docname.startswith("_generated/"):
        return
    up = "../" * docname.count("/")
    shown = {_shown(path) for path in standalone_files(Path(app.srcdir), app.config)}

    def target(match: re.Match) -> str:
        folder, file = match.groups()
        if file is None:
            return f"]({up}gallery.md)"
        if f"{folder}/{file}" not in shown:
            return match.group(0)
        return f"]({up}_generated/gallery/{file[:-3]}.md)"

    source[0] = _RECIPE_LINK.sub(target, source[0])


def setup(app: Sphinx) -> dict:
    app.add_config_value("gallery_recipes_dir", "../recipes", "env")
    app.add_config_value("gallery_guides_dir", "../guides", "env")
    app.add_config_value("gallery_jobs", 0, "env")
    app.add_config_value("gallery_timeout", 600, "env")
    app.connect("builder-inited", generate)
    app.connect("source-read", link_recipes)
    return {"version": "1", "parallel_read_safe": True}
