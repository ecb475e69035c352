"""Tests that CI never runs: skipped in every JUnit report that lists them.

Each pytest run of ``.ci/run`` (the suite on the default Python and on the
newest JAX, the docs venv, the ``-m launchers``, ``-m scale`` and
``-m documented`` steps) writes a JUnit XML report; this script reads them
all and prints, by node id, every test that was skipped in each report that
lists it and run in none, then exits 1. A test counts as run where it
passed, failed, errored or xfailed. A test a run deselects (``-m``) is not in
its report, so a test skipped by the default run and run by its own step
counts as run. ``ALLOWED`` names the tests that cannot run on this machine
or do not apply, each with its reason; they are counted, not failed.
Only the standard library is needed::

    python tools/never_run.py junit-*.xml
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Allowed(NamedTuple):
    """Tests skipped everywhere on purpose: node ids matching ``node`` whose
    skip message matches ``message`` (``*`` stands for any text; brackets
    are literal, as in parametrized ids), and why."""

    node: str
    message: str
    reason: str

    def covers(self, node_id: str, message: str) -> bool:
        return _matches(self.node, node_id) and _matches(self.message, message)


def _matches(pattern: str, text: str) -> bool:
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), text,
                        re.S) is not None


ALLOWED = (
    Allowed("tests/test_moe.py::test_dropless_form_equals_dense_routing", "*",
            "needs a GPU or TPU (accelerator marker): lax.ragged_all_to_all has "
            "no XLA:CPU implementation"),
    Allowed("tests/test_plan.py::test_a_topology_plan_reads_the_tpu_compilers_"
            "collectives", "*", "needs the TPU compiler, jax[tpu]'s libtpu"),
    Allowed("*test_kernel_tpu*", "*",
            "needs the TPU compiler, jax[tpu]'s libtpu (no TPU): compiles the "
            "kernel recipes for TPU topologies"),
    Allowed("tests/test_conformance.py::*", "* accepts every dtype kind",
            "does not apply: a recipe that accepts every dtype kind has none "
            "to refuse"),
    Allowed("tests/test_conformance.py::*",
            "* declares no replicated output on check's meshes",
            "does not apply: nothing replicated to check in the pmap form"),
    Allowed("tests/test_fsdp.py::*", "* does not run over both axes of a 4x2 mesh",
            "does not apply: the recipe runs over one mesh axis"),
    Allowed("tests/test_documented_commands.py::*", "run verbatim by *",
            "the command is a CI step of its own, run as the docs show it"),
    Allowed("tests/test_contributing.py::test_the_registry_driven_suite_runs_each_"
            "new_recipe_and_passes", "*",
            "CI runs the whole suite in the contributing trial's copy instead "
            "(the newest JAX's step), its registry-driven files included"),
    Allowed("tests/test_compat_results.py::*", "not yet measured: *",
            "a recipe added since a release's matrix run, until "
            "tools/jax_matrix.py --missing adds its rows (CI's matrix step "
            "prints the ones it measured)"),
)


def node_id(classname: str, name: str, root: Path = ROOT) -> str:
    """A JUnit test case's pytest node id: ``tests.test_x.TestY`` + ``test_z[a]``
    -> ``tests/test_x.py::TestY::test_z[a]`` (the module is the longest
    dotted prefix that is a file under ``root``). A module skipped as a
    whole at collection (``pytest.importorskip`` at its top) reports no class
    and its dotted name: its node id is the file, ``tests/test_x.py``."""
    if not classname and (root / (name.replace(".", "/") + ".py")).is_file():
        return name.replace(".", "/") + ".py"
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (root / path).is_file():
            return "::".join([path, *parts[end:], name])
    return f"{classname}::{name}"


def outcomes(report: Path, root: Path = ROOT) -> dict[str, tuple[bool, str]]:
    """Node id -> (ran, skip message) for each test case of one report; an
    xfailed test ran."""
    found = {}
    for case in ET.parse(report).iter("testcase"):
        skipped = case.find("skipped")
        ran = skipped is None or skipped.get("type") == "pytest.xfail"
        message = "" if ran else skipped.get("message", "")
        if message == "collection skipped":  # (file, line, "Skipped: why")
            why = re.search(r"Skipped: (.*)['\"]\)\s*$", skipped.text or "")
            message = why.group(1) if why else message
        found[node_id(case.get("classname", ""), case.get("name", ""), root)] = (
            ran, message)
    return found


def never_run(reports, root: Path = ROOT,
              allowed=ALLOWED) -> tuple[dict[str, str], dict[str, str]]:
    """(never run, allowed): node id -> its skip messages, and node id -> the
    reason ``allowed`` gives, for the tests skipped in every report that
    lists them. A module skipped whole at collection in one report ran
    where any of its tests ran in another. An entry of ``allowed`` covers a
    test when it matches the message of one of its skips (the default run's
    "runs with -m ..." is not the reason a test is skipped in its own
    step)."""
    ran, skipped = set(), {}
    for report in reports:
        for node, (did_run, message) in outcomes(Path(report), root).items():
            if did_run:
                ran.add(node)
            else:
                skipped.setdefault(node, []).append(message)
    missing, excused = {}, {}
    ran_files = {node.split("::", 1)[0] for node in ran}
    for node in sorted(set(skipped) - ran):
        if "::" not in node and node in ran_files:
            continue
        entry = next((a for a in allowed for message in skipped[node]
                      if a.covers(node, message)), None)
        if entry is None:
            missing[node] = " | ".join(dict.fromkeys(skipped[node]))
        else:
            excused[node] = entry.reason
    return missing, excused


def main(argv=None, allowed=ALLOWED) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path,
                        help="JUnit XML reports (pytest --junitxml)")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the directory pytest ran in (default: %(default)s)")
    args = parser.parse_args(argv)
    absent = [str(r) for r in args.reports if not r.is_file()]
    if absent:
        parser.error(f"no such report: {' '.join(absent)}; each pytest run "
                     "needs --junitxml=FILE")
    missing, excused = never_run(args.reports, args.root, allowed)
    reasons = sorted(set(excused.values()))
    print(f"{len(args.reports)} reports; {len(excused)} tests skipped everywhere "
          f"on purpose ({len(reasons)} reasons in tools/never_run.py's ALLOWED)")
    if not missing:
        print("every other test ran in at least one of them")
        return 0
    print(f"{len(missing)} tests were skipped in every report and ran in none:")
    for node, message in missing.items():
        print(f"  {node}: {message}")
    print("Fix: run them in a CI step whose venv has what they need, or add them "
          "to ALLOWED in tools/never_run.py with the reason they cannot run here.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
