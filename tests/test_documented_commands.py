"""Every `python -m collectives ...` command shown in the README and on the
start, benchmarks, multi-process, testing and choosing-a-strategy pages runs
as shown.

Commands run as written, with four kinds of change: bench budgets and sizes
are cut (:data:`SHORTER`, :func:`smaller_sizes`; the figures are not the
point here, a crash is), a
plan sweep keeps its device counts up to 64 and its first model
(:data:`PLAN_SWEEP`), output files go to a temporary directory, and a
command that another test already runs verbatim is left to it. Commands
with placeholders (`my_script.py`, `host0`, `$I`), that need a cluster
(`worker`) or a target's compiler where it is not installed (`plan
--topology`, `plan --target`) are parsed, not run: the cluster templates run for real in
tests/test_launchers.py. Marked ``documented`` (CI runs them; locally
``python -m pytest -m documented``).
"""

import importlib.util
import re
import shlex

import pytest

from collectives import _cli
from collectives.bench._sweep import format_size
from collectives.bench._sweep import parse_size
from collectives.distributed._results import worker_argv
from helpers import ROOT
from helpers import only_with_marker
from helpers import run_python

PAGES = ["README.md", "docs/start.md", "docs/benchmarks.md", "docs/multi_process.md",
         "docs/testing.md", "docs/choosing.md"]
PLACEHOLDERS = ("my_script.py", "host0", "$I", "SCRIPT")
RUN_ELSEWHERE = {
    "python -m collectives launch -n 2 --devices-per-process 4 -- check":
        "tests/test_launchers.py::test_every_recipe_agrees_under_launch",
}
SHORTER = {  # option: what it becomes here (:func:`smaller_sizes` for -b, -e)
    "--budget": "0.05",
    "-e": None,
    "-b": None,
}
SMALLEST, WIDEST = "1K", 256
"""A bench's sweep starts at 1K here and spans what the command spans, up to
256 times its first size (1K..256K)."""
OUTPUTS = ("--json", "--csv", "--plot")
PLAN_SWEEP = {"--devices": lambda n: int(n) <= 64, "--model": None}
"""A plan sweep (several values) keeps the device counts up to 64 and the
first model; a single value (``plan --devices 2048``) runs as shown."""


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


COMMANDS = sorted(documented_commands(), key=lambda found: " launch " not in found[1])
"""The commands, those across processes first: the longest (the bench across
two processes above all), started first so that they do not run alone at
the end of a run with several workers."""


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
        if "plan" in argv and word in PLAN_SWEEP:
            values = _values(argv, argv.index(word) + 1)
            keep = PLAN_SWEEP[word]
            if len(values) > 1:
                values = [v for v in values if keep(v)] if keep else values[:1]
            out += values
            for _ in _values(argv, argv.index(word) + 1):
                next(words)
        elif "bench" in argv and word in SHORTER:
            next(words)
            out.append(SHORTER[word] or smaller_sizes(argv)[word])
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


def smaller_sizes(argv):
    """``-b`` and ``-e`` of a bench's sweep moved down to start at 1K, with as
    many sizes as the command's sweep (at most 1K..256K): ``-b 1M -e 16M``
    runs as ``-b 1K -e 16K``, ``-b 1K -e 1G`` as ``-b 1K -e 256K``. Each size
    compiles every collective in every form again, so a shortened sweep
    never has more sizes than the documented one."""
    begin, end = (parse_size(argv[argv.index(flag) + 1]) if flag in argv
                  else default for flag, default in
                  (("-b", parse_size("1K")), ("-e", parse_size("4M"))))
    smallest = parse_size(SMALLEST)
    return {"-b": SMALLEST,
            "-e": format_size(smallest * min(max(end // begin, 1), WIDEST))}


def _values(argv, start):
    """The values of an option with several (up to the next option)."""
    values = []
    for word in argv[start:]:
        if word.startswith("-"):
            break
        values.append(word)
    return values


def _needs_what_is_missing(argv):
    """A command that needs a compiler this venv lacks: the target's own for
    ``plan --topology``, ``plan --target`` and ``show --target`` (it is
    parsed instead; CI's target step compiles for both targets)."""
    if "--topology" in argv:
        wanted = "libtpu"
    elif "--target" in argv and argv[3] in ("plan", "show"):
        target = argv[argv.index("--target") + 1]
        wanted = "jax_plugins.xla_cuda12" if target == "h100" else "libtpu"
    else:
        return False
    try:
        return importlib.util.find_spec(wanted) is None
    except ModuleNotFoundError:
        return True


def _parse_only(argv):
    argv = [word.replace("$I", "0") for word in argv]
    args = _cli.build_parser().parse_args(argv[3:])
    if argv[3] == "worker" and getattr(args, "target", None):
        worker_argv(args.target)


@pytest.fixture(scope="module")
def empty_cache(tmp_path_factory):
    """A cache directory that starts empty, so the first plan measures this
    machine's profile (its bench sweep) as on a fresh machine, and the
    others read that measurement back."""
    return {"XDG_CACHE_HOME": str(tmp_path_factory.mktemp("cache"))}


@pytest.mark.documented
@pytest.mark.parametrize("page,command", COMMANDS, ids=[c for _, c in COMMANDS])
def test_documented_command_runs(request, tmp_path, empty_cache, page, command):
    only_with_marker(request, "documented", "CI runs it")
    if command in RUN_ELSEWHERE:
        pytest.skip(f"run verbatim by {RUN_ELSEWHERE[command]}")
    argv = shlex.split(command)
    if (any(p in command for p in PLACEHOLDERS) or argv[3] == "worker"
            or _needs_what_is_missing(argv)):
        _parse_only(argv)
        return
    argv, outputs = shortened(argv, tmp_path)
    result = run_python(*argv[1:], cwd=ROOT, timeout=600, check=False,
                        env=empty_cache)
    assert result.returncode == 0, (
        f"{page}: `{command}` (run as `{shlex.join(argv)}`) exited "
        f"{result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    for path in outputs:
        assert path.exists() and path.stat().st_size > 0, f"{command}: no {path.name}"

