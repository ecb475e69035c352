"""The JAX compatibility matrix: every release, a fresh venv, one result file each.

For each release listed in ``tools/jax_releases.txt`` (the one list of the
supported range), this script makes a venv under ``--venv-root``, installs
``jax==V jaxlib==V`` and this package with its ``test`` extra (with pip, or
uv with ``--uv PATH``; their caches are reused), then runs, with the working
tree on ``PYTHONPATH`` so the code under test is the checkout's:

1. ``tools/jax_probes.py``: which parallel APIs the release has, and two
   behaviours (jax#34249, jax#20125);
2. ``python -m collectives check --json``: every registered recipe in every
   form against the NumPy oracle;
3. a fast subset of the test suite (``--tests``, default :data:`DEFAULT_TESTS`).

and writes ``docs/compat/results/jax-<V>.json``, from which the docs page
``docs/compatibility.md`` is rendered and which ``tests/test_compat_results.py``
checks for staleness (a recipe a file has no row for, or no verdict for its
explicit form, is "not yet measured" there; ``--missing`` measures just
those rows, on the releases
whose Python this machine has, and merges them into the files). Only the
standard library is needed to run it::

    python tools/jax_matrix.py                 # every release (tox -e matrix)
    python tools/jax_matrix.py --spread        # first release, newest of each minor
    python tools/jax_matrix.py --releases 0.8.1 0.12.0.1
    python tools/jax_matrix.py --missing       # only rows a result lacks
    python tools/jax_matrix.py --list-new      # releases newer than the list
    python tools/jax_matrix.py --steps tests --tests tests/test_conformance.py
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASES_FILE = ROOT / "tools" / "jax_releases.txt"
RESULTS_DIR = ROOT / "docs" / "compat" / "results"
WORKAROUNDS = ROOT / "docs" / "compat" / "workarounds.json"
PROBES_SCRIPT = ROOT / "tools" / "jax_probes.py"
DEFAULT_VENV_ROOT = ROOT / ".tox" / "matrix"

DEFAULT_TESTS = ("tests/test_compat.py tests/test_sharp_edges_grads.py "
                 "tests/test_sharp_edges_nan.py tests/test_sharp_edges_pmap.py "
                 "tests/test_sharp_edges_ppermute.py tests/test_sharp_edges_rng.py "
                 "tests/test_sharp_edges_sharding.py "
                 "tests/test_sharp_edges_versions.py "
                 "tests/test_sharp_edges_explicit.py tests/test_explicit_mode.py "
                 "tests/test_migrate_removed_apis.py tests/test_migrate_pmap.py "
                 "tests/test_vmap_batching.py tests/test_reductions.py "
                 "tests/test_psum_scatter.py tests/test_ppermute.py "
                 "tests/test_all_to_all.py tests/test_axis_index.py "
                 "tests/test_conformance.py "
                 "tests/test_clusters.py::test_two_ranks_of_a_faked_cluster_pass_check "
                 "-k 'not test_conformance or cost_model or rejects'")
"""The fast subset of the suite each release runs (``--tests`` replaces it):
the version-sensitive tests, the conformance suite's fast checks (every
recipe's compiled HLO against its cost model, the bad inputs), and two ranks
of each faked cluster (SLURM, Open MPI) passing ``worker -- check``."""

TIMEOUTS = {"install": 1200, "probes": 300, "check": 900, "tests": 1200}
"""Seconds each step of one release may take before it counts as failed."""


# -- the list of releases (shared with the staleness test and the docs page) ---

def version_key(release: str) -> tuple[int, ...]:
    """``"0.9.0.1"`` -> ``(0, 9, 0, 1)``, for sorting."""
    return tuple(int(part) for part in re.findall(r"\d+", release))


def read_releases(path: Path = RELEASES_FILE) -> dict[str, str]:
    """Release -> Python version, in release order, from ``jax_releases.txt``."""
    releases = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            release, python = line.split()
            releases[release] = python
    return dict(sorted(releases.items(), key=lambda item: version_key(item[0])))


def spread(releases) -> list[str]:
    """One release per minor version: the oldest release for the oldest minor
    (the supported floor), the newest release for every other minor."""
    ordered = sorted(releases, key=version_key)
    newest_of_minor = {}
    for release in ordered:
        newest_of_minor[version_key(release)[:2]] = release
    newest_of_minor[version_key(ordered[0])[:2]] = ordered[0]
    return sorted(newest_of_minor.values(), key=version_key)


def result_path(release: str, results_dir: Path = RESULTS_DIR) -> Path:
    return results_dir / f"jax-{release}.json"


def load_results(results_dir: Path = RESULTS_DIR) -> dict[str, dict]:
    """Release -> its committed result, in release order."""
    found = {}
    for path in results_dir.glob("jax-*.json"):
        data = json.loads(path.read_text())
        found[data["jax"]] = data
    return dict(sorted(found.items(), key=lambda item: version_key(item[0])))


def load_workarounds(path: Path = WORKAROUNDS) -> dict[str, str]:
    """Recipe -> what to write where it fails (``docs/compat/workarounds.json``)."""
    return json.loads(path.read_text()) if path.exists() else {}


def unmeasured(results: dict[str, dict], recipes,
               form: str | None = None) -> dict[str, list[str]]:
    """Recipe -> the releases whose result has no row for it (with ``form=
    "explicit"``: no verdict for its explicit form, a row measured before the
    form existed), in release order: not yet measured there (``--missing``
    measures them). Releases that did not install are left out: they have no
    rows at all."""
    lacking: dict[str, list[str]] = {}
    for release, result in results.items():
        if result["install"]["ok"]:
            for name in recipes:
                if not _measured(result.get("recipes", {}).get(name), form):
                    lacking.setdefault(name, []).append(release)
    return lacking


def _measured(entry: dict | None, form: str | None = None) -> bool:
    return entry is not None and (form is None or form in entry)


def to_measure(result: dict, recipes) -> list[str]:
    """The recipes ``--missing`` checks on a release: those with no row, or
    with no verdict for the explicit form."""
    known = result.get("recipes", {})
    return [n for n in recipes if not _measured(known.get(n), "explicit")]


def failing_rows(result: dict, workarounds: dict[str, str]) -> dict[str, str]:
    """Recipe -> what is wrong, for the measured rows of one release that
    fail with no reason, or with no workaround in ``docs/compat/workarounds.json``
    (the compatibility page shows each failure with its workaround)."""
    wrong = {}
    for name, entry in result.get("recipes", {}).items():
        if entry["ok"]:
            continue
        if not entry["reason"]:
            wrong[name] = f"{name} fails and its row gives no reason"
        elif name not in workarounds:
            wrong[name] = (f"{name} disagrees with its oracle ({entry['reason']}) "
                           "and docs/compat/workarounds.json has no workaround "
                           "for it")
    return wrong


def probe_docs(path: Path = PROBES_SCRIPT) -> dict[str, tuple[str, str]]:
    """Probe name -> (what it checks, what to write instead where it is false),
    read from the docstrings of ``jax_probes.py`` without importing it
    (importing starts JAX). The second part is the paragraph after
    ``Instead:``, empty when there is none."""
    import ast

    docs = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Name) and d.id == "probe"
                for d in node.decorator_list):
            what, _, instead = (ast.get_docstring(node) or "").partition("Instead:")
            docs[node.name] = (" ".join(what.split()), " ".join(instead.split()))
    return docs


# -- one release ---------------------------------------------------------------

def _first_line(text: str, limit: int = 240) -> str:
    """The line of an error message worth showing: the last ``Error:`` line,
    else the first non-empty line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)]
    line = (errors[-1] if errors else lines[0]) if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _run(cmd, *, env, timeout, cwd=ROOT) -> tuple[int, str, str, float]:
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code = -1
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = f"TimeoutError: no result after {timeout} s"
    except FileNotFoundError as exc:  # e.g. no python3.12 on this machine
        code, out, err = 127, "", f"FileNotFoundError: {exc.filename} not found"
    return code, out, err, time.perf_counter() - start


def _python_env() -> dict[str, str]:
    """The environment for interpreter lookup: on pyenv machines, make every
    installed 3.11 and 3.12 visible (``PYENV_VERSION=3.11.x:3.12.y``)."""
    env = dict(os.environ)
    if shutil.which("pyenv"):
        # (pyenv's python3 shim sets PYENV_VERSION to one version for its child)
        chosen = [v for v in env.get("PYENV_VERSION", "").split(":") if v]
        bare = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True,
                              text=True).stdout.split()
        for minor in ("3.11", "3.12"):
            if not any(v.startswith(minor + ".") for v in chosen):
                chosen += [v for v in bare if v.startswith(minor + ".")][:1]
        env["PYENV_VERSION"] = ":".join(chosen)
    return env


def _test_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "PYTHONPATH")}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", HYPOTHESIS_PROFILE="ci",
               PIP_DISABLE_PIP_VERSION_CHECK="1", VIRTUAL_ENV=str(venv),
               PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    return env


def build_wheel(out: Path) -> str:
    """This package built once, as a wheel in ``out``: releases installed side
    by side must not build the source tree at the same time."""
    code, _, err, _ = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "-w", str(out), str(ROOT)], env=_python_env(),
                           timeout=TIMEOUTS["install"])
    wheels = sorted(out.glob("jax_collectives-*.whl"))
    if code != 0 or not wheels:
        raise SystemExit(f"building the wheel failed: {_first_line(err)}")
    return str(wheels[-1])


def make_venv(release: str, python: str, venv: Path, *, fresh: bool, log,
              package: str = ".", uv: str | None = None) -> dict:
    """A venv with ``jax==release`` and this package's test extra (``package``:
    the source tree, or a wheel of it), installed by pip or, given its path,
    by ``uv`` (the same packages, with about 60 % of pip's CPU time)."""
    py = venv / "bin" / "python"
    if venv.exists() and not fresh:
        code, out, _, _ = _run([str(py), "-c", "import jax; print(jax.__version__)"],
                               env=_test_env(venv), timeout=120)
        if code == 0 and out.strip() == release:
            log(f"  reusing {venv}")
            return {"ok": True, "detail": "reused"}
    shutil.rmtree(venv, ignore_errors=True)
    env = _python_env()
    if uv:  # uv venv needs the interpreter's path (pyenv's shim resolves it)
        code, out, err, _ = _run([f"python{python}", "-c",
                                  "import sys; print(sys.executable)"], env=env,
                                 timeout=120)
        make = [uv, "venv", "-q", "--no-python-downloads", "-p", out.strip(),
                str(venv)]
        install = [uv, "pip", "install", "-q", "--compile-bytecode", "--python",
                   str(py)]
    else:
        code, err = 0, ""
        make = [f"python{python}", "-m", "venv", str(venv)]
        install = [str(py), "-m", "pip", "install", "-q"]
    if code == 0:
        code, _, err, _ = _run(make, env=env, timeout=300)
    if code != 0:
        return {"ok": False, "detail": _first_line(err) or f"no python{python}"}
    log(f"  installing jax=={release} with python{python}")
    code, _, err, seconds = _run(
        [*install, f"jax=={release}", f"jaxlib=={release}", f"{package}[test]"],
        env=_test_env(venv), timeout=TIMEOUTS["install"])
    return {"ok": code == 0, "detail": "" if code == 0 else _first_line(err),
            "seconds": round(seconds, 1)}


def recipe_table(rows: list[dict]) -> dict[str, dict]:
    """``check`` rows -> one entry per recipe: ok, rows run, first failure,
    and the explicit form's verdict (:func:`explicit_verdict`)."""
    table: dict[str, dict] = {}
    by_recipe: dict[str, list[dict]] = {}
    for row in rows:
        by_recipe.setdefault(row["recipe"], []).append(row)
        entry = table.setdefault(row["recipe"], {"ok": True, "rows": 0, "failed": 0,
                                                 "reason": ""})
        entry["rows"] += 1
        if not row["ok"]:
            entry["failed"] += 1
            if entry["ok"]:
                entry["reason"] = (f"mesh {row['mesh']} axis {row['axis']} "
                                   f"{row['dtype']}: {_first_line(row['detail'])}")
            entry["ok"] = False
    for name, entry in table.items():
        entry["explicit"] = explicit_verdict(by_recipe[name])
    return table


def explicit_verdict(rows: list[dict]) -> str:
    """One recipe's explicit column over its ``check`` rows: ``agrees`` (every
    row that ran it), ``fails`` (a row whose explicit form disagreed), ``not
    run`` (no row ran it, none said why), or ``skipped: why`` where it does not
    run on this release (on every mesh, or ``skipped on mesh M: why`` on some).
    ``check`` rows from before the form existed carry no ``explicit`` key: the
    recipe's verdict is then absent, not yet measured."""
    states = [r.get("explicit", "-") for r in rows]
    if "FAIL" in states:
        return "fails"
    skipped = [(r, s) for r, s in zip(rows, states, strict=True)
               if s.startswith("skipped")]
    ran = states.count("ok")
    if skipped and not ran:
        return skipped[0][1]
    if skipped:
        row, state = skipped[0]
        return f"skipped on mesh {row['mesh']}: {state.removeprefix('skipped: ')}"
    return "agrees" if ran else "not run"


def run_check(venv: Path, work: Path, names=()) -> tuple[dict, dict]:
    """``python -m collectives check --json [names]``: (summary, per-recipe
    table); every registered recipe unless ``names`` are given."""
    out_json = work / "check.json"
    code, out, err, seconds = _run(
        [str(venv / "bin" / "python"), "-m", "collectives", "check", *names,
         "--json", str(out_json)], env=_test_env(venv), timeout=TIMEOUTS["check"])
    summary = {"returncode": code, "seconds": round(seconds, 1)}
    if not out_json.exists():
        summary["detail"] = _first_line(err or out)
        return summary, {}
    rows = json.loads(out_json.read_text())["rows"]
    summary.update(agree=sum(r["ok"] for r in rows),
                   disagree=sum(not r["ok"] for r in rows))
    return summary, recipe_table(rows)


def run_tests(venv: Path, work: Path, tests: str) -> dict:
    """The fast test subset, with one line per failing test."""
    junit = work / "junit.xml"
    code, out, err, seconds = _run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--junitxml={junit}", *shlex.split(tests)],
        env=_test_env(venv), timeout=TIMEOUTS["tests"])
    summary = {"args": tests, "returncode": code, "seconds": round(seconds, 1),
               "passed": 0, "failed": 0, "skipped": 0, "failures": []}
    if not junit.exists():
        summary["failures"].append({"test": "(session)",
                                    "reason": _first_line(err or out)})
        return summary
    for case in ET.parse(junit).iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            summary["failed"] += 1
            summary["failures"].append(
                {"test": test,
                 "reason": _first_line(problem.get("message") or problem.text or "")})
        elif case.find("skipped") is not None:
            summary["skipped"] += 1
        else:
            summary["passed"] += 1
    return summary


def installed_versions(venv: Path) -> dict[str, str]:
    """The exact Python, jax, jaxlib and numpy the venv runs."""
    code, out, err, _ = _run(
        [str(venv / "bin" / "python"), "-c",
         "import sys, jax, jaxlib, numpy; print(sys.version.split()[0], "
         "jax.__version__, jaxlib.__version__, numpy.__version__)"],
        env=_test_env(venv), timeout=TIMEOUTS["probes"])
    if code != 0:
        raise RuntimeError(f"version query failed: {_first_line(err)}")
    return dict(zip(("python", "jax", "jaxlib", "numpy"), out.split(), strict=True))


def registered_recipes(python: str, env: dict[str, str]) -> list[str] | None:
    """The checkout's registered recipes (``python -m collectives list``) as
    ``python`` imports them, or None where it cannot (no JAX there)."""
    code, out, _, _ = _run([python, "-m", "collectives", "list"],
                           env={**env, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
                           timeout=TIMEOUTS["probes"])
    return [line.split()[0] for line in out.splitlines() if line.strip()] \
        if code == 0 else None


def run_probes(venv: Path) -> dict[str, bool]:
    code, out, err, _ = _run([str(venv / "bin" / "python"), str(PROBES_SCRIPT)],
                             env=_test_env(venv), timeout=TIMEOUTS["probes"])
    if code != 0:
        raise RuntimeError(f"jax_probes.py failed: {_first_line(err)}")
    return json.loads(out)


def _commit() -> str:
    """The checkout's commit (``+changes`` when collectives/, tests/ or tools/
    differ from it); outside a git checkout (a source tarball, a copied tree)
    the package's version, saying so, never an empty stamp."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    if not head:
        version = re.search(r'^__version__ = "([^"]+)"',
                            (ROOT / "collectives" / "__init__.py").read_text(),
                            re.MULTILINE)
        return f"{version.group(1) if version else 'unknown'} (not a git checkout)"
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "collectives",
                            "tests", "tools"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return head + ("+changes" if dirty else "")


STEPS = ("probes", "check", "tests")


def run_release(release: str, python: str, args, log) -> dict:
    """The chosen steps for one release; the result written to its JSON file
    (steps not chosen keep what the file held)."""
    venv = Path(args.venv_root) / f"jax-{release}"
    path = result_path(release, Path(args.results))
    result: dict = json.loads(path.read_text()) if path.exists() else {}
    result.update({"jax": release, "python": python,
                   "date": datetime.date.today().isoformat(), "commit": _commit()})
    result["install"] = make_venv(release, python, venv, fresh=args.fresh, log=log,
                                  package=args.package, uv=args.uv)
    if args.install_only:
        return result
    if result["install"]["ok"]:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            if "probes" in args.steps:
                log("  probes")
                result["probes"] = run_probes(venv)
                result["versions"] = installed_versions(venv)
            if "check" in args.steps:
                log("  check")
                result["check"], result["recipes"] = run_check(venv, work)
            if "tests" in args.steps and args.tests:
                log("  tests")
                result["tests"] = run_tests(venv, work, args.tests)
                if getattr(args, "junit_dir", None) and (work / "junit.xml").exists():
                    shutil.copy(work / "junit.xml",
                                Path(args.junit_dir) / f"junit-matrix-{release}.xml")
    _write(path, result)
    return result


def _write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


def fill_release(release: str, python: str, args, log,
                 recipes: list[str] | None) -> list[str] | None:
    """``--missing``: ``check`` only the registered recipes the release's
    result has no row for, or no explicit verdict for (:func:`to_measure`),
    in its venv, and merge their rows into the file (a row measured again
    replaces the old one and its counts; each is stamped with its own date
    and commit; probes, tests and the file's date stay). ``recipes``: the
    registered names, or None where no interpreter with JAX could list them
    yet (the release's venv then lists them). Returns the recipes filled, or
    None where this machine cannot measure the release (no result file, or
    no venv: e.g. no ``python3.12``)."""
    path = result_path(release, Path(args.results))
    result = json.loads(path.read_text()) if path.exists() else {}
    if not result.get("install", {}).get("ok"):
        log(f"  no installed result to add rows to: measure the whole release "
            f"with --releases {release}")
        return None
    if recipes is not None and not to_measure(result, recipes):
        log("  every registered recipe has a row")
        return []
    venv = Path(args.venv_root) / f"jax-{release}"
    install = make_venv(release, python, venv, fresh=args.fresh, log=log,
                        package=args.package, uv=args.uv)
    if not install["ok"]:
        log(f"  not measurable here ({install['detail']}): its rows stay not "
            "yet measured")
        return None
    if recipes is None:
        recipes = registered_recipes(str(venv / "bin" / "python"), _test_env(venv))
        if recipes is None:
            raise RuntimeError(f"jax {release}: `python -m collectives list` failed")
    missing = to_measure(result, recipes)
    if not missing:
        log("  every registered recipe has a row")
        return []
    log(f"  check {' '.join(missing)}")
    with tempfile.TemporaryDirectory() as tmp:
        summary, table = run_check(venv, Path(tmp), names=missing)
    if not table:
        raise RuntimeError(f"jax {release}: check {' '.join(missing)} wrote no rows: "
                           f"{summary.get('detail', '')}")
    stamp = {"date": datetime.date.today().isoformat(), "commit": _commit()}
    for entry in table.values():
        entry.update(stamp)
    known = result.setdefault("recipes", {})
    check = result.setdefault("check", {})
    for name in table:  # a row measured again replaces its counts
        if name in known:
            check["agree"] = check.get("agree", 0) - (known[name]["rows"]
                                                      - known[name]["failed"])
            check["disagree"] = check.get("disagree", 0) - known[name]["failed"]
    known.update(table)
    for key in ("agree", "disagree"):
        check[key] = check.get(key, 0) + summary.get(key, 0)
    _write(path, result)
    for name, entry in table.items():
        log(f"  filled {name}: {_verdict(entry)}")
    log(f"  {summary['seconds']} s for check, "
        f"{install.get('seconds', 0)} s installing")
    return list(table)


def _verdict(entry: dict) -> str:
    return "agrees" if entry["ok"] else f"fails: {entry['reason']}"


def filled_rows(new: dict, committed: dict) -> list[str]:
    """The recipes ``new`` measured that the committed result has no row for
    (not yet measured there): one line each."""
    known = committed.get("recipes", {})
    return [f"{name}: {_verdict(entry)}"
            for name, entry in new.get("recipes", {}).items() if name not in known]


def regressions(new: dict, committed: dict) -> list[str]:
    """What fails in ``new`` but passed in the committed result (or was not
    yet measured there), and probes whose answer changed: one line each."""
    lines = []
    if not new["install"]["ok"]:
        return [f"install failed: {new['install']['detail']}"]
    for name, entry in new.get("recipes", {}).items():
        before = committed.get("recipes", {}).get(name)
        if not entry["ok"] and (before is None or before["ok"]):
            lines.append(f"recipe {name}: {entry['reason']}")
    old_failures = {f["test"] for f in committed.get("tests", {}).get("failures", [])}
    for failure in new.get("tests", {}).get("failures", []):
        if failure["test"] not in old_failures:
            lines.append(f"test {failure['test']}: {failure['reason']}")
    for probe, value in new.get("probes", {}).items():
        if probe in committed.get("probes", {}) and committed["probes"][probe] != value:
            lines.append(f"probe {probe}: {committed['probes'][probe]} -> {value}")
    return lines


def summary_line(result: dict) -> str:
    if not result["install"]["ok"]:
        return f"install failed: {result['install']['detail']}"
    check = result.get("check")
    tests = result.get("tests")
    text = f"{sum(result.get('probes', {}).values())} probes hold"
    if check:
        text += (f"; check {check.get('agree', 0)} agree, "
                 f"{check.get('disagree', '?')} disagree ({check['seconds']} s)")
    if tests:
        text += (f"; tests {tests['passed']} passed, {tests['failed']} failed "
                 f"({tests['seconds']} s)")
    return text


# -- newer releases ------------------------------------------------------------

def list_new(releases: dict[str, str]) -> list[str]:
    """Releases on the package index newer than the newest listed one."""
    newest_python = max(releases.values(), key=version_key)
    out = subprocess.run([f"python{newest_python}", "-m", "pip", "index",
                          "versions", "jax"], capture_output=True, text=True,
                         env=_python_env()).stdout
    match = re.search(r"Available versions: (.*)", out)
    known = max(releases, key=version_key)
    found = match.group(1).split(", ") if match else []
    return sorted((v for v in found if version_key(v) > version_key(known)),
                  key=version_key)


def print_now(text: str) -> None:
    print(text, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--releases", nargs="+", metavar="V",
                       help="only these releases (default: every listed one)")
    which.add_argument("--spread", action="store_true",
                       help="the oldest release and the newest of each minor (CI)")
    which.add_argument("--list-new", action="store_true",
                       help="print releases newer than tools/jax_releases.txt")
    parser.add_argument("--venv-root", default=str(DEFAULT_VENV_ROOT),
                        help="where the venvs live (default: %(default)s)")
    parser.add_argument("--results", default=str(RESULTS_DIR),
                        help="where the JSON results go (default: %(default)s)")
    parser.add_argument("--junit-dir", metavar="DIR",
                        help="keep each release's JUnit report of its tests as "
                             "DIR/junit-matrix-RELEASE.xml (tools/never_run.py "
                             "reads them: a test that runs only on old releases "
                             "counts as run)")
    parser.add_argument("--tests", default=DEFAULT_TESTS,
                        help="pytest arguments of the test subset; '' for none "
                             "(default: %(default)s)")
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS),
                        help="what to run (default: all); the others keep their "
                             "committed results")
    parser.add_argument("--fresh", action="store_true",
                        help="recreate venvs that already hold the release")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a recipe or test fails that passed in "
                             "the committed results, or a probe's answer changed "
                             "(CI: with --results elsewhere)")
    parser.add_argument("--missing", action="store_true",
                        help="only the rows the results lack: check just the "
                             "registered recipes a release's file has no row for, "
                             "on the chosen releases this machine has the Python "
                             "of, and merge them into the files (minutes a "
                             "release, most of it the venv)")
    parser.add_argument("--install-only", action="store_true",
                        help="only make the venvs (a later run reuses them); "
                             "writes no results")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="releases run side by side (default: 1); each one's "
                             "lines print when it ends")
    parser.add_argument("--uv", metavar="PATH",
                        help="install the venvs with this uv executable instead "
                             "of pip (the same packages, with about 60 %% of "
                             "pip's CPU time)")
    parser.add_argument("--skip", nargs="+", default=[], metavar="V",
                        help="leave these releases out (CI: those its full test "
                             "runs already cover)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: needs 1 or more releases at a time")
    if args.missing and (args.install_only or args.strict):
        parser.error("--missing adds rows to the results; it takes neither "
                     "--install-only nor --strict")
    releases = read_releases()
    if args.list_new:
        new = list_new(releases)
        print("\n".join(new) if new else "no newer release")
        return 0
    chosen = (spread(releases) if args.spread else args.releases or list(releases))
    chosen = [v for v in chosen if v not in args.skip]
    unknown = [v for v in chosen if v not in releases]
    if unknown:
        parser.error(f"--releases {' '.join(unknown)}: not in {RELEASES_FILE.name} "
                     f"(known: {' '.join(releases)}); add a line there first")
    committed = load_results()  # before this run overwrites any of them
    recipes = None
    if args.missing:  # the names from this interpreter, else from a venv it made
        made = sorted(Path(args.venv_root).glob("jax-*/bin/python"))
        for python in [sys.executable, *map(str, made)]:
            recipes = registered_recipes(python, dict(os.environ))
            if recipes is not None:
                break
        if recipes is not None:
            lacking = unmeasured(load_results(Path(args.results)), recipes,
                                 form="explicit")
            chosen = [v for v in chosen if any(v in r for r in lacking.values())]
            if not chosen:
                print("every result has a row for every registered recipe")
                return 0
    wheel_dir = tempfile.TemporaryDirectory()
    args.package = build_wheel(Path(wheel_dir.name))
    filled, unmeasurable = [], []

    def one(release: str) -> bool:
        """Run one release; print its lines together; True if it regressed."""
        lines = [f"jax {release} (python{releases[release]})"]
        log = lines.append if args.jobs > 1 else print_now
        if args.jobs == 1:
            print_now(lines.pop())
        if args.missing:
            names = fill_release(release, releases[release], args, log, recipes)
            (unmeasurable if names is None else filled).append((release, names))
            if lines:
                print_now("\n".join(lines))
            return False
        result = run_release(release, releases[release], args, log=log)
        if args.install_only:
            log(f"  install: {'ok' if result['install']['ok'] else 'FAILED'} "
                f"{result['install'].get('detail', '')}")
            if lines:
                print_now("\n".join(lines))
            return not result["install"]["ok"]
        log(f"  {summary_line(result)}")
        worse = regressions(result, committed.get(release, {}))
        for line in worse:
            log(f"  NEW: {line}")
        new_rows = filled_rows(result, committed[release]) if release in committed \
            else []
        for line in new_rows:
            log(f"  FILLED (not yet in docs/compat/results): {line}")
        if new_rows:
            filled.append((release, new_rows))
        if lines:
            print_now("\n".join(lines))
        return bool(worse)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        bad = sum(pool.map(one, chosen))
    wheel_dir.cleanup()
    if args.install_only:
        print(f"{len(chosen) - bad} of {len(chosen)} venvs ready in {args.venv_root}")
        return 1 if bad else 0
    if args.missing:
        rows = sum(len(names) for _, names in filled)
        print(f"{rows} rows measured and merged into {args.results}"
              + ("; commit them" if rows else ""))
        if unmeasurable:
            print(f"not measured here: jax {' '.join(v for v, _ in unmeasurable)} "
                  "(their rows stay not yet measured)")
        return 0
    if filled:
        print(f"measured {sum(len(rows) for _, rows in filled)} rows that "
              f"docs/compat/results lacks (jax {' '.join(v for v, _ in filled)}).")
        if Path(args.results).resolve() != RESULTS_DIR.resolve():
            print("To commit them (and the other releases' missing rows): "
                  "python tools/jax_matrix.py --missing && git add docs/compat/results")
    print(f"{len(chosen) - bad} of {len(chosen)} releases as committed; results "
          f"in {args.results}")
    return 1 if bad and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
