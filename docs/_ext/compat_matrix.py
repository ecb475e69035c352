"""The compatibility page's tables, written at build time from the results.

``tools/jax_matrix.py`` leaves one JSON file per JAX release in
``docs/compat/results/``; this extension turns them into Markdown tables in
``_generated/compat/`` that ``compatibility.md`` includes:

* ``recipes.inc``: registered recipe x release, agrees or fails (with the
  one-line reason and the workaround from ``docs/compat/workarounds.json``),
  or not yet measured (a recipe the release's file has no row for, never
  shown as agreeing; ``tools/jax_matrix.py --missing`` measures them);
* ``explicit.inc``: the same for the explicit form alone, skipped rows with
  the recipe's reason;
* ``apis.inc``: each probe of ``tools/jax_probes.py`` with the releases where
  it holds (first and last) and what to write instead;
* ``releases.inc``: per release, the Python, the check and test-subset counts
  and every failing test with its reason.

Nothing here is hand-written, so the page cannot drift from the results; a
failure without a workaround, or a release of ``tools/jax_releases.txt``
without a result, is a build warning (an error under ``-W``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
AGREES, FAILS, NOT_MEASURED, HOLDS, ABSENT = "✓", "✗", "?", "●", "·"
DASH = "\N{EN DASH}"
SKIPPED = DASH


def _matrix():
    spec = importlib.util.spec_from_file_location(
        "jax_matrix", ROOT / "tools" / "jax_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _in_matrix_box(table: list[str]) -> list[str]:
    """A release matrix's table lines, in a box whose header row and row
    labels stay in view while it scrolls (the ``compat-matrix`` class)."""
    return ["```{container} compat-matrix", "", *table, "```"]


def _spans(releases: list[str], holds: list[bool]) -> str:
    """``0.8.0-0.9.2, 0.10.1`` (en dashes): the runs of releases where it holds."""
    runs, start, prev = [], None, None
    for release, ok in zip(releases, holds, strict=True):
        if ok and start is None:
            start = release
        if not ok and start is not None:
            runs.append((start, prev))
            start = None
        prev = release
    if start is not None:
        runs.append((start, prev))
    return ", ".join(a if a == b else f"{a}{DASH}{b}" for a, b in runs) or "none"


def recipes_table(results: dict[str, dict], recipes: list[str],
                  workarounds: dict[str, str]) -> str:
    releases = list(results)
    table = ["| recipe | " + " | ".join(releases) + " |",
             "|---|" + "---|" * len(releases)]
    notes: list[str] = []
    unmeasured: dict[str, list[bool]] = {}
    for name in recipes:
        cells = []
        for release in releases:
            entry = results[release].get("recipes", {}).get(name)
            unmeasured.setdefault(name, []).append(entry is None)
            if entry is None:
                cells.append(NOT_MEASURED)
            elif entry["ok"]:
                cells.append(AGREES)
            else:
                notes.append(f"{name} on {release}: {entry['reason']}")
                cells.append(f"{FAILS} [{len(notes)}]")
                if name not in workarounds:
                    logger.warning(f"compat: {name} fails on jax {release} and "
                                   f"docs/compat/workarounds.json has no entry")
        table.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines = [*_in_matrix_box(table), ""]
    if notes:
        lines += ["Failures:", ""]
        for i, note in enumerate(notes, 1):
            name = note.split(" on ", 1)[0]
            lines.append(f"{i}. {_cell(note)} Workaround: "
                         f"{_cell(workarounds.get(name, '(none listed)'))}")
    lacking = {name: _spans(releases, missing) for name, missing in unmeasured.items()
               if any(missing)}
    if lacking:
        if notes:
            lines.append("")
        lines += [f"Not yet measured ({NOT_MEASURED}): no result has a row for "
                  "these recipes on these releases, so nothing is known there; "
                  "`python tools/jax_matrix.py --missing` measures them.", ""]
        lines += [f"- `{name}`: {spans}" for name, spans in lacking.items()]
    elif not notes:
        lines.append(f"Every recipe agrees with its NumPy oracle in every form on "
                     f"every release ({len(recipes)} recipes x {len(releases)} "
                     f"releases).")
    return "\n".join(lines) + "\n"


def explicit_table(results: dict[str, dict], recipes: list[str]) -> str:
    """Registered recipe x release for the explicit form alone: agrees, fails,
    skipped (with the recipe's reason, once per reason), or not yet measured
    (a row from before the form existed)."""
    releases = list(results)
    table = ["| recipe | " + " | ".join(releases) + " |",
             "|---|" + "---|" * len(releases)]
    reasons: list[str] = []
    unmeasured: list[str] = []
    for name in recipes:
        cells = []
        for release in releases:
            verdict = results[release].get("recipes", {}).get(name, {}).get("explicit")
            if verdict is None:
                cells.append(NOT_MEASURED)
                if results[release]["install"]["ok"]:
                    unmeasured.append(f"{name} on {release}")
            elif verdict == "agrees":
                cells.append(AGREES)
            elif verdict == "fails":
                cells.append(FAILS)
            else:  # the column names the release: the reason need not
                reason = verdict.replace(f"JAX {release} ", "this release ")
                note = f"`{name}`: {reason}"
                if note not in reasons:
                    reasons.append(note)
                cells.append(f"{SKIPPED} [{reasons.index(note) + 1}]")
        table.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines = [*_in_matrix_box(table), ""]
    if reasons:
        lines += [f"Skipped ({SKIPPED}), with the reason the recipe gives:", ""]
        lines += [f"{i}. {_cell(note)}" for i, note in enumerate(reasons, 1)]
    if unmeasured:
        lines += ["", f"Not yet measured ({NOT_MEASURED}): {len(unmeasured)} rows "
                  "were measured before the explicit form existed; "
                  "`python tools/jax_matrix.py --missing` measures them."]
    return "\n".join(lines) + "\n"


def apis_table(results: dict[str, dict], docs: dict[str, tuple[str, str]]) -> str:
    releases = list(results)
    lines = ["| API or behaviour | releases where it holds | first | last | "
             "where it does not, write |", "|---|---|---|---|---|"]
    for probe, (what, instead) in docs.items():
        holds = [bool(results[r].get("probes", {}).get(probe)) for r in releases]
        have = [r for r, ok in zip(releases, holds, strict=True) if ok]
        first, last = (have[0], have[-1]) if have else (DASH, DASH)
        lines.append(f"| {_cell(what)} | {_spans(releases, holds)} | {first} | "
                     f"{last} | {_cell(instead) or DASH} |")
    lines += ["", "Per release (" + HOLDS + " holds, " + ABSENT + " does not):", ""]
    table = ["| probe | " + " | ".join(releases) + " |",
             "|---|" + "---|" * len(releases)]
    for probe in docs:
        marks = [HOLDS if results[r].get("probes", {}).get(probe) else ABSENT
                 for r in releases]
        table.append(f"| `{probe}` | " + " | ".join(marks) + " |")
    lines += _in_matrix_box(table)
    return "\n".join(lines) + "\n"


def releases_table(results: dict[str, dict]) -> str:
    lines = ["| JAX | Python | run on | commit | check: forms x meshes agree | "
             "test subset: passed / failed / skipped |",
             "|---|---|---|---|---|---|"]
    failures, later = [], []
    for release, result in results.items():
        check = result.get("check", {})
        tests = result.get("tests", {})
        agree = (f"{check.get('agree', 0)} / "
                 f"{check.get('agree', 0) + check.get('disagree', 0)}")
        counts = (f"{tests.get('passed', 0)} / {tests.get('failed', 0)} / "
                  f"{tests.get('skipped', 0)}") if tests else "not run"
        if not result["install"]["ok"]:
            agree = counts = f"install failed: {_cell(result['install']['detail'])}"
        python = result.get("versions", {}).get("python", result["python"])
        lines.append(f"| {release} | {python} | {result['date']} | "
                     f"`{result['commit']}` | {agree} | {counts} |")
        failures += [(release, f) for f in tests.get("failures", [])]
        later += _measured_later(release, result.get("recipes", {}))
    lines.append("")
    if failures:
        lines += ["Failing tests:", ""]
        lines += [f"- {release}: `{f['test']}`: {_cell(f['reason'])}"
                  for release, f in failures]
    else:
        lines.append("No test of the subset fails on any release.")
    if later:
        lines += ["", "Rows measured after their release's run "
                  "(`tools/jax_matrix.py --missing`, `check` only; the counts "
                  "above include them): " + "; ".join(later) + "."]
    args = {r.get("tests", {}).get("args") for r in results.values()} - {None}
    lines += ["", "Test subset: " + "; ".join(f"`pytest {a}`" for a in sorted(args))]
    return "\n".join(lines) + "\n"


def _measured_later(release: str, recipes: dict[str, dict]) -> list[str]:
    """``jax V: `a`, `b` (date, `commit`)`` per later ``--missing`` run of a
    release; ``every recipe`` where that run measured them all again."""
    runs: dict[tuple[str, str], list[str]] = {}
    for name, entry in recipes.items():
        if "commit" in entry:
            runs.setdefault((entry["date"], entry["commit"]), []).append(name)
    return [f"jax {release}: "
            + ("every recipe" if len(names) == len(recipes)
               else ", ".join(f"`{n}`" for n in names))
            + f" ({date}, `{commit}`)" for (date, commit), names in runs.items()]


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate(app: Sphinx) -> None:
    import collectives

    matrix = _matrix()
    results = matrix.load_results()
    missing = [r for r in matrix.read_releases() if r not in results]
    if missing:
        logger.warning(f"compat: no matrix result for jax {', '.join(missing)}; "
                       f"run python tools/jax_matrix.py --releases "
                       f"{' '.join(missing)}")
    workarounds = matrix.load_workarounds()
    out = Path(app.srcdir) / "_generated" / "compat"
    out.mkdir(parents=True, exist_ok=True)
    _write_if_changed(out / "recipes.inc",
                      recipes_table(results, list(collectives.RECIPES), workarounds))
    _write_if_changed(out / "explicit.inc",
                      explicit_table(results, list(collectives.RECIPES)))
    _write_if_changed(out / "apis.inc", apis_table(results, matrix.probe_docs()))
    _write_if_changed(out / "releases.inc", releases_table(results))


def setup(app: Sphinx) -> dict:
    app.connect("builder-inited", generate)
    return {"version": "1", "parallel_read_safe": True}
