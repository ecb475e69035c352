"""tools/never_run.py: the tests no CI venv runs, from hand-written JUnit reports."""

import pytest

from helpers import ROOT
from helpers import load_file

never_run = load_file(ROOT / "tools" / "never_run.py", "never_run")

SKIP = '<skipped type="pytest.skip" message="{}">tests/x.py:1: {}</skipped>'


def _report(path, cases):
    """A JUnit report like pytest's: ``cases`` maps (classname, name) to
    ``"passed"``, ``"xfailed"``, ``"failed"`` or a skip message."""
    body = []
    for (classname, name), outcome in cases.items():
        inner = {"passed": "",
                 "xfailed": '<skipped type="pytest.xfail" message="known" />',
                 "failed": '<failure message="boom">trace</failure>'}.get(
                     outcome, SKIP.format(outcome, outcome))
        body.append(f'<testcase classname="{classname}" name="{name}" '
                    f'time="0.1">{inner}</testcase>')
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites>'
                    '<testsuite name="pytest" tests="1">' + "".join(body)
                    + "</testsuite></testsuites>")
    return path


@pytest.fixture
def tree(tmp_path):
    """A checkout with one test file, for turning class names into node ids."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("")
    return tmp_path


A = ("tests.test_a", "test_x[0.8.0-psum]")
B = ("tests.test_a", "test_y")


def test_a_test_skipped_in_every_report_fails_the_check(tree, capsys):
    one = _report(tree / "one.xml", {A: "needs the docs extra", B: "passed"})
    two = _report(tree / "two.xml", {A: "needs the docs extra"})
    missing, excused = never_run.never_run([one, two], tree, allowed=())
    assert missing == {"tests/test_a.py::test_x[0.8.0-psum]": "needs the docs extra"}
    assert excused == {}
    assert never_run.main([str(one), str(two), "--root", str(tree)], allowed=()) == 1
    out = capsys.readouterr().out
    assert "tests/test_a.py::test_x[0.8.0-psum]: needs the docs extra" in out
    assert "ALLOWED in tools/never_run.py" in out


@pytest.mark.parametrize("elsewhere", ["passed", "failed", "xfailed", None])
def test_running_once_anywhere_passes(tree, elsewhere):
    # None: the other run deselected it (-m), so its report does not list it,
    # and the step that selects it ran it.
    skipped = _report(tree / "default.xml", {A: "runs with -m scale", B: "passed"})
    cases = {A: elsewhere} if elsewhere else {B: "passed"}
    other = _report(tree / "step.xml", cases)
    missing, _ = never_run.never_run([skipped, other], tree, allowed=())
    assert missing == ({} if elsewhere else
                       {"tests/test_a.py::test_x[0.8.0-psum]": "runs with -m scale"})


def test_allowed_tests_pass_with_their_reason(tree, capsys):
    report = _report(tree / "one.xml", {A: "needs a GPU or TPU", B: "passed"})
    allowed = (never_run.Allowed("tests/test_a.py::test_x[*]", "needs a GPU*",
                                 "no accelerator in CI"),)
    assert never_run.never_run([report], tree, allowed) == (
        {}, {"tests/test_a.py::test_x[0.8.0-psum]": "no accelerator in CI"})
    assert never_run.main([str(report), "--root", str(tree)], allowed=allowed) == 0
    assert "1 tests skipped everywhere on purpose" in capsys.readouterr().out
    # The message must match too: another skip of the same test is not excused.
    other = _report(tree / "two.xml", {A: "needs the docs extra"})
    assert never_run.never_run([other], tree, allowed)[0] == {
        "tests/test_a.py::test_x[0.8.0-psum]": "needs the docs extra"}
    # One matching skip among the reports is enough: the default run skips
    # it for its marker, its own step for the reason allowed.
    step = _report(tree / "step.xml", {A: "runs with -m documented"})
    assert never_run.never_run([step, report], tree, allowed) == (
        {}, {"tests/test_a.py::test_x[0.8.0-psum]": "no accelerator in CI"})


def _module_skipped(path, why):
    """A report like pytest's for a module that skips itself at collection
    (``pytest.importorskip`` at its top): no class, the module's dotted name."""
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        '<testcase classname="" name="tests.test_a" time="0.0">'
        '<skipped message="collection skipped">(&apos;tests/test_a.py&apos;, 8, '
        f'"Skipped: {why}")</skipped></testcase></testsuite></testsuites>')
    return path


def test_a_module_skipped_at_collection_ran_where_its_tests_ran(tree, capsys):
    why = "could not import 'matplotlib': No module named 'matplotlib'"
    readme = _module_skipped(tree / "readme.xml", why)
    # Skipped whole in every report: the file is named, with pytest's reason.
    assert never_run.never_run([readme], tree, allowed=()) == (
        {"tests/test_a.py": why}, {})
    assert never_run.main([str(readme), "--root", str(tree)], allowed=()) == 1
    assert f"tests/test_a.py: {why}" in capsys.readouterr().out
    # Its tests ran in another venv's report (the one with matplotlib).
    extras = _report(tree / "extras.xml", {B: "passed"})
    assert never_run.never_run([readme, extras], tree, allowed=()) == ({}, {})
    # Only its own tests count: another file's running does not.
    (tree / "tests" / "test_b.py").write_text("")
    other = _report(tree / "other.xml", {("tests.test_b", "test_y"): "passed"})
    assert never_run.never_run([readme, other], tree, allowed=())[0] == {
        "tests/test_a.py": why}


def test_node_ids_name_the_file_classes_and_doctests():
    assert never_run.node_id("tests.test_docs", "test_a[x.y]") == (
        "tests/test_docs.py::test_a[x.y]")
    assert never_run.node_id("tests.test_docs.TestK", "test_a") == (
        "tests/test_docs.py::TestK::test_a")
    assert never_run.node_id("collectives._layout", "collectives._layout.Axes") == (
        "collectives/_layout.py::collectives._layout.Axes")
    # a module skipped whole at collection: no class, its dotted name
    assert never_run.node_id("", "tests.test_never_run") == "tests/test_never_run.py"


def test_a_missing_report_is_refused_with_the_fix(tmp_path, capsys):
    with pytest.raises(SystemExit):
        never_run.main([str(tmp_path / "junit-docs.xml")])
    assert "needs --junitxml=FILE" in capsys.readouterr().err


def test_every_allowed_entry_gives_a_reason():
    assert all(entry.reason for entry in never_run.ALLOWED)
