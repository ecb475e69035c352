"""tools/jax_matrix.py (the release matrix) and ``check --json``, which it reads."""

import json
import re
import shutil
import textwrap

import pytest

from collectives import RECIPES
from helpers import ROOT
from helpers import load_matrix
from helpers import run_python


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


def test_check_json_writes_every_row(tmp_path):
    out = tmp_path / "check.json"
    run_python("-m", "collectives", "check", "psum", "ppermute_ring", "--mesh", "8",
               "--json", str(out))
    data = json.loads(out.read_text())
    assert data["jax"]
    assert [row["recipe"] for row in data["rows"]] == ["psum", "ppermute_ring"]
    assert all(row["ok"] and row["detail"] == "" for row in data["rows"])
    assert data["rows"][0]["forms"][:3] == ["pmap", "shard_map", "jit"]


def test_releases_are_ordered_by_version_not_text(matrix, tmp_path):
    listing = tmp_path / "releases.txt"
    listing.write_text("# comment\n0.10.0 3.11\n0.9.0.1 3.11  # note\n0.9.0 3.11\n"
                       "0.12.0 3.12\n")
    releases = matrix.read_releases(listing)
    assert list(releases) == ["0.9.0", "0.9.0.1", "0.10.0", "0.12.0"]
    assert releases["0.12.0"] == "3.12"


def test_spread_is_one_release_per_minor(matrix):
    releases = ["0.8.0", "0.8.1", "0.8.3", "0.9.0", "0.9.0.1", "0.9.2", "0.10.2",
                "0.12.0", "0.12.0.1"]
    assert matrix.spread(releases) == ["0.8.0", "0.9.2", "0.10.2", "0.12.0.1"]
    listed = matrix.read_releases()
    minors = {matrix.version_key(v)[:2] for v in listed}
    assert len(matrix.spread(listed)) == len(minors)


def test_recipe_table_keeps_the_first_failure_per_recipe(matrix):
    rows = [
        {"recipe": "psum", "ok": True, "mesh": "8", "axis": "i", "dtype": "float32",
         "detail": ""},
        {"recipe": "pmax", "ok": False, "mesh": "4x2", "axis": "j",
         "dtype": "float32",
         "detail": "Traceback...\n  File x\nValueError: the first reason\nmore"},
        {"recipe": "pmax", "ok": False, "mesh": "8", "axis": "i", "dtype": "float32",
         "detail": "TypeError: a second reason"},
    ]
    table = matrix.recipe_table(rows)
    assert table["psum"] == {"ok": True, "rows": 1, "failed": 0, "reason": "",
                             "explicit": "not run"}
    assert table["pmax"]["failed"] == 2 and not table["pmax"]["ok"]
    assert table["pmax"]["reason"] == (
        "mesh 4x2 axis j float32: ValueError: the first reason")


def _rows(*states):
    return [{"recipe": "r", "ok": state != "FAIL", "mesh": mesh, "axis": "i",
             "dtype": "float32", "detail": "", "explicit": state}
            for mesh, state in zip(("8", "4x2"), states, strict=False)]


@pytest.mark.parametrize("states,verdict", [
    (("ok", "ok"), "agrees"),
    (("ok", "FAIL"), "fails"),
    (("skipped: keys", "skipped: keys"), "skipped: keys"),
    (("ok", "skipped: one axis"), "skipped on mesh 4x2: one axis"),
    (("-", "-"), "not run"),
])
def test_the_explicit_verdict_reads_every_row(matrix, states, verdict):
    assert matrix.recipe_table(_rows(*states))["r"]["explicit"] == verdict
    # check rows from before the form existed: no key, so no verdict yet
    old = [{k: v for k, v in row.items() if k != "explicit"} for row in _rows(*states)]
    assert matrix.explicit_verdict(old) == "not run"


def test_regressions_name_what_newly_fails(matrix):
    committed = {"install": {"ok": True},
                 "recipes": {"psum": {"ok": True}, "pmax": {"ok": False}},
                 "tests": {"failures": [{"test": "t::old"}]},
                 "probes": {"lax_pvary": True}}
    new = {"install": {"ok": True},
           "recipes": {"psum": {"ok": False, "reason": "R1"},
                       "pmax": {"ok": False, "reason": "R2"}},
           "tests": {"failures": [{"test": "t::old", "reason": "x"},
                                  {"test": "t::new", "reason": "R3"}]},
           "probes": {"lax_pvary": False}}
    assert matrix.regressions(new, committed) == [
        "recipe psum: R1", "test t::new: R3", "probe lax_pvary: True -> False"]
    assert matrix.regressions(committed, committed) == []


def test_probe_docs_name_every_probe_once(matrix):
    docs = matrix.probe_docs()
    assert {"jax_shard_map", "lax_pvary", "lax_pcast_varying",
            "vmap_of_shard_map_psum"} <= set(docs)
    assert all(what.endswith((".", ")")) for what, _ in docs.values())
    assert docs["lax_pvary"][1].startswith("`lax.pcast(x, axis, to=\"varying\")`")
    assert docs["jax_shard_map"][1] == ""


def test_unknown_release_is_refused_with_the_fix(matrix, capsys):
    with pytest.raises(SystemExit):
        matrix.main(["--releases", "0.0.1"])
    err = capsys.readouterr().err
    assert "0.0.1" in err and "jax_releases.txt" in err


def test_the_matrix_refuses_fewer_than_one_job(matrix, capsys):
    with pytest.raises(SystemExit):
        matrix.main(["--jobs", "0", "--releases", next(iter(matrix.read_releases()))])
    assert "--jobs 0: needs 1 or more" in capsys.readouterr().err



@pytest.mark.parametrize("uv", [None, "/opt/uv"])
def test_venvs_install_the_release_and_the_test_extra_with_pip_or_uv(
        matrix, monkeypatch, tmp_path, uv):
    ran = []

    def fake_run(cmd, **kwargs):
        ran.append([str(part) for part in cmd])
        return 0, "/usr/bin/python3.11\n", "", 0.1

    monkeypatch.setattr(matrix, "_run", fake_run)
    venv = tmp_path / "jax-0.8.0"
    result = matrix.make_venv("0.8.0", "3.11", venv, fresh=True, log=print,
                              package="w.whl", uv=uv)
    assert result["ok"]
    install = ran[-1]
    assert install[-3:] == ["jax==0.8.0", "jaxlib==0.8.0", "w.whl[test]"]
    if uv is None:
        assert ran[0] == ["python3.11", "-m", "venv", str(venv)]
        assert install[:4] == [f"{venv}/bin/python", "-m", "pip", "install"]
    else:  # the interpreter's own path, never a downloaded one
        assert ran[1][:2] == ["/opt/uv", "venv"] and "--no-python-downloads" in ran[1]
        assert ran[1][-3:] == ["-p", "/usr/bin/python3.11", str(venv)]
        assert install[:3] == ["/opt/uv", "pip", "install"]
        assert "--compile-bytecode" in install  # else every import recompiles
        assert install[install.index("--python") + 1] == f"{venv}/bin/python"


def _result(recipes, **extra):
    return {"jax": "0.8.0", "python": "3.11", "date": "2026-11-30",
            "commit": "abc1234", "install": {"ok": True},
            "probes": {"lax_pvary": True}, "check": {"agree": 2, "disagree": 0},
            "tests": {"passed": 9}, "recipes": recipes, **extra}


def test_unmeasured_rows_are_named_per_recipe_and_failures_need_a_workaround(matrix):
    results = {"0.8.0": _result({"psum": {"ok": True}}),
               "0.9.0": _result({"psum": {"ok": False, "reason": "R1"},
                                 "new": {"ok": False, "reason": ""}}),
               "0.9.1": {"install": {"ok": False, "detail": "no wheel"}}}
    assert matrix.unmeasured(results, ["psum", "new"]) == {"new": ["0.8.0"]}
    assert matrix.failing_rows(results["0.8.0"], {}) == {}
    wrong = matrix.failing_rows(results["0.9.0"], {})
    assert "psum disagrees with its oracle (R1)" in wrong["psum"]
    assert "workarounds.json" in wrong["psum"]
    assert wrong["new"] == "new fails and its row gives no reason"
    assert list(matrix.failing_rows(results["0.9.0"], {"psum": "W", "new": "W"})) == [
        "new"]


def test_filled_rows_are_the_recipes_the_committed_result_lacks(matrix):
    committed = _result({"psum": {"ok": True}})
    new = _result({"psum": {"ok": True}, "a": {"ok": True},
                   "b": {"ok": False, "reason": "R2"}})
    assert matrix.filled_rows(new, committed) == ["a: agrees", "b: fails: R2"]
    assert matrix.filled_rows(committed, committed) == []


def test_a_run_elsewhere_prints_the_rows_the_committed_results_lack(
        matrix, monkeypatch, tmp_path, capsys):
    # CI's matrix step: a full run into --results elsewhere, where a recipe
    # added since the committed run gets its first row.
    committed = matrix.load_results()["0.8.0"]

    def run_release(release, python, args, log):
        return {**committed, "recipes": {**committed["recipes"],
                                         "throwaway": {"ok": True}}}

    monkeypatch.setattr(matrix, "build_wheel", lambda out: "w.whl")
    monkeypatch.setattr(matrix, "run_release", run_release)
    assert matrix.main(["--releases", "0.8.0", "--strict",
                        "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "FILLED (not yet in docs/compat/results): throwaway: agrees" in out
    assert "measured 1 rows that docs/compat/results lacks (jax 0.8.0)" in out
    assert "python tools/jax_matrix.py --missing" in out


def test_missing_checks_only_the_lacking_recipes_and_merges_their_rows(
        matrix, monkeypatch, tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    done = {"ok": True, "rows": 1, "failed": 0, "explicit": "agrees"}
    stored = {"0.8.0": _result({"psum": done}),  # lacks "new"
              "0.8.1": _result({"psum": done, "new": done}),
              # psum measured before the explicit form: measured again
              "0.9.0": _result({"psum": {"ok": True, "rows": 2, "failed": 0},
                                "new": done}),
              "0.11.0": _result({"psum": done}, python="3.12")}  # lacks "new"
    for release, result in stored.items():
        result["jax"] = release
        matrix.result_path(release, results).write_text(json.dumps(result))
    built, checked = [], []

    def make_venv(release, python, venv, **kwargs):
        built.append(release)
        if python == "3.12":
            return {"ok": False, "detail": "FileNotFoundError: python3.12 not found"}
        return {"ok": True, "detail": "reused"}

    def run_check(venv, work, names=()):
        checked.append((venv.name, list(names)))
        return ({"agree": 3, "disagree": 1, "seconds": 1.0},
                {name: {"ok": False, "rows": 4, "failed": 1, "reason": "R",
                        "explicit": "fails"} for name in names})

    monkeypatch.setattr(matrix, "registered_recipes", lambda *a: ["psum", "new"])
    monkeypatch.setattr(matrix, "build_wheel", lambda out: "w.whl")
    monkeypatch.setattr(matrix, "make_venv", make_venv)
    monkeypatch.setattr(matrix, "run_check", run_check)
    assert matrix.main(["--missing", "--results", str(results),
                        "--venv-root", str(tmp_path / "venvs")]) == 0
    # Only the releases lacking a row are built; only the lacking recipe checked.
    assert built == ["0.8.0", "0.9.0", "0.11.0"]
    assert checked == [("jax-0.8.0", ["new"]), ("jax-0.9.0", ["psum"])]
    merged = json.loads(matrix.result_path("0.8.0", results).read_text())
    recipes = merged.pop("recipes")
    new = recipes.pop("new")
    assert recipes == stored["0.8.0"]["recipes"]
    assert new["reason"] == "R" and new["date"] and new["commit"]
    assert merged.pop("check") == {"agree": 5, "disagree": 1}
    # Probes, tests, the release's date and commit: as they were.
    assert merged == {k: v for k, v in stored["0.8.0"].items()
                      if k not in ("recipes", "check")}
    # A row measured again replaces the old one and its counts (2 agreed).
    again = json.loads(matrix.result_path("0.9.0", results).read_text())
    assert again["recipes"]["psum"]["explicit"] == "fails"
    assert again["check"] == {"agree": 2 - 2 + 3, "disagree": 1}
    # The release this machine has no Python for keeps its file as it was.
    assert json.loads(matrix.result_path("0.11.0", results).read_text()) == (
        stored["0.11.0"])
    out = capsys.readouterr().out
    assert "filled new: fails: R" in out
    assert "2 rows measured and merged" in out
    assert "not measured here: jax 0.11.0" in out


def test_a_result_measured_outside_a_git_checkout_names_the_version(
        matrix, monkeypatch, tmp_path):
    # The README's commands run in a source tree without .git too (an sdist,
    # a copied tree): the stamp then says so, never an empty commit.
    (tmp_path / "collectives").mkdir()
    (tmp_path / "collectives" / "__init__.py").write_text('__version__ = "9.8.7"\n')
    monkeypatch.setattr(matrix, "ROOT", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert matrix._commit() == "9.8.7 (not a git checkout)"


def test_missing_refuses_strict_with_the_reason(matrix, capsys):
    with pytest.raises(SystemExit):
        matrix.main(["--missing", "--strict"])
    assert "--missing adds rows to the results" in capsys.readouterr().err


THROWAWAY = textwrap.dedent("""
    # Two recipes registered with the registry's own API before the tests
    # collect: one that no results file has a row for, one measured failing.
    import dataclasses

    import collectives as cx
    from collectives._registry import register

    for name in ("throwaway_unmeasured", "throwaway_disagrees"):
        register(dataclasses.replace(cx.RECIPES["psum"], name=name))
""")


def test_a_new_recipe_is_not_yet_measured_and_a_measured_failure_still_fails(
        tmp_path):
    # tests/test_compat_results.py itself, in a copy of the repository whose
    # 0.8.0 result measured one of the two new recipes failing.
    root = tmp_path / "repo"
    shutil.copytree(ROOT, root, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache",
        ".tox", "*.egg-info", "build", "_build", "_generated"))
    (root / "throwaway_recipes.py").write_text(THROWAWAY)
    path = root / "docs" / "compat" / "results" / "jax-0.8.0.json"
    result = json.loads(path.read_text())
    result["recipes"]["throwaway_disagrees"] = {
        "ok": False, "rows": 4, "failed": 1,
        "reason": "mesh 8 axis i float32: AssertionError: 3 of 8 elements differ"}
    path.write_text(json.dumps(result))
    ran = run_python("-m", "pytest", "-p", "throwaway_recipes", "-p",
                     "no:cacheprovider", "-n", "0", "-q", "-rfs",
                     "tests/test_compat_results.py", cwd=root, check=False,
                     env={"JAX_PLATFORMS": "cpu"})
    out = ran.stdout + ran.stderr
    test = "tests/test_compat_results.py::test_the_recipe_agrees_on_every_release"
    assert re.findall(r"^FAILED (\S+)", out, re.M) == [
        f"{test}[throwaway_disagrees]"], out
    assert ("jax 0.8.0: throwaway_disagrees disagrees with its oracle (mesh 8 axis "
            "i float32: AssertionError: 3 of 8 elements differ)") in out, out
    releases = " ".join(load_matrix().read_releases())
    assert re.search(r"^SKIPPED \[1\] tests/test_compat_results.py:\d+: not yet "
                     rf"measured: throwaway_unmeasured on jax {re.escape(releases)}\. "
                     r"Fix: run `python tools/jax_matrix.py --missing`", out, re.M), out
    # and nothing else skipped but the recipes no result measured yet: the
    # new one, and any a contributor has added and not yet measured
    results = [json.loads(f.read_text()) for f in
               (ROOT / "docs" / "compat" / "results").glob("jax-*.json")]
    unmeasured = [name for name in RECIPES
                  if any(name not in r.get("recipes", {}) for r in results)]
    assert re.search(rf"^1 failed, \d+ passed, {1 + len(unmeasured)} skipped in ",
                     out, re.M), (unmeasured, out)
