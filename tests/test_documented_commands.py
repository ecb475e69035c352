"""Every `python -m collectives ...` command shown in the README and on the
start, benchmarks, multi-process and testing pages runs as shown.

Commands run as written, with three kinds of change, all listed in
:data:`SHORTER`: bench budgets and sizes are cut (the figures are not the
point here, a crash is), output files go to a temporary directory, and a
command that another test already runs verbatim is left to it. Commands
with placeholders (`my_script.py`, `host0`, `$I`) or that need a cluster
(`worker`) are parsed, not run: the cluster templates run for real in
tests/test_launchers.py. Marked ``documented`` (CI runs them; locally
``python -m pytest -m documented``).
"""

import re
import shlex

import pytest

from collectives import _cli
from collectives.distributed._results import worker_argv
from helpers import ROOT
from helpers import only_with_marker
from helpers import run_python

PAGES = ["README.md", "docs/start.md", "docs/benchmarks.md", "docs/multi_process.md",
         "docs/testing.md"]
PLACEHOLDERS = ("my_script.py", "host0", "$I", "SCRIPT")
RUN_ELSEWHERE = {
    "python -m collectives launch -n 2 --devices-per-process 4 -- check":
        "tests/test_launchers.py::test_every_recipe_agrees_under_launch",
}
SHORTER = {  # option: what it becomes here (None: its value, unchanged)
    "--budget": "0.05",
    "-e": "256K",
    "-b": "1K",
}
OUTPUTS = ("--json", "--csv", "--plot")


def documented_commands(first_page_only=True):
    """(page, command) for every command line in a fenced code block; a
    command shown on several pages once, with the first page."""
    found = {}
    every = set()
    for page in PAGES:
        text = (ROOT / page).read_text()
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
            block = re.sub(r"\\\n\s*", " ", block)
            for line in block.splitlines():
                line = line.split(" #")[0].strip()
                if line.startswith("python -m collectives "):
                    found.setdefault(" ".join(line.split()), page)
                    every.add((page, " ".join(line.split())))
    if not first_page_only:
        return sorted(every)
    return sorted((page, command) for command, page in found.items())


COMMANDS = documented_commands()


def test_the_pages_show_commands():
    pages = {page for page, _ in documented_commands(first_page_only=False)}
    assert pages >= {"README.md", "docs/start.md", "docs/benchmarks.md",
                     "docs/multi_process.md"}, pages
    assert len(COMMANDS) >= 15


ACROSS_PROCESSES = ["-r", "1", "--scatter-iters", "1", "--scatter-chunk", "64K"]
"""Added to a bench across processes (fixed rounds, no --budget there)."""


def shortened(argv, tmp_path):
    """``argv`` with bench budgets and sizes cut and outputs in ``tmp_path``."""
    out, outputs = [], []
    words = iter(argv)
    for word in words:
        out.append(word)
        if "bench" in argv and word in SHORTER:
            next(words)
            out.append(SHORTER[word])
        elif word in OUTPUTS:
            path = tmp_path / next(words).replace("/", "_")
            out.append(str(path))
            outputs.append(path)
    if "bench" in argv and "--overhead" not in argv:
        if "launch" in argv:
            out += ACROSS_PROCESSES
        elif "--budget" not in argv:
            out += ["--budget", SHORTER["--budget"]]
    return out, outputs


def _parse_only(argv):
    argv = [word.replace("$I", "0") for word in argv]
    args = _cli.build_parser().parse_args(argv[3:])
    if getattr(args, "target", None):
        worker_argv(args.target)


@pytest.mark.documented
@pytest.mark.parametrize("page,command", COMMANDS, ids=[c for _, c in COMMANDS])
def test_documented_command_runs(request, tmp_path, page, command):
    only_with_marker(request, "documented", "CI runs it")
    if command in RUN_ELSEWHERE:
        pytest.skip(f"run verbatim by {RUN_ELSEWHERE[command]}")
    argv = shlex.split(command)
    if any(p in command for p in PLACEHOLDERS) or argv[3] == "worker":
        _parse_only(argv)
        return
    argv, outputs = shortened(argv, tmp_path)
    result = run_python(*argv[1:], cwd=ROOT, timeout=600, check=False)
    assert result.returncode == 0, (
        f"{page}: `{command}` (run as `{shlex.join(argv)}`) exited "
        f"{result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    for path in outputs:
        assert path.exists() and path.stat().st_size > 0, f"{command}: no {path.name}"

