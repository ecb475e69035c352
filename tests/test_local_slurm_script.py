"""tools/local_slurm.sh: a throwaway single-node SLURM on 127.0.0.1 starts,
runs srun inside it, passes COMMAND's exit status on, and leaves no daemon
and no directory behind -- also when it is sent SIGTERM mid-job.

Marked ``launchers`` (run with ``-m launchers``; CI runs them with the
other launcher tests). Skips unless munged, slurmctld, slurmd, srun and sinfo
are installed (Debian/Ubuntu: apt-get install slurm-wlm munge), or fails
where ``COLLECTIVES_REQUIRE_LAUNCHERS=1``. About 5 s per test.
"""

import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers import ROOT

SCRIPT = ROOT / "tools" / "local_slurm.sh"
TOOLS = ("munged", "slurmctld", "slurmd", "srun", "sinfo")


def _missing_tools():
    # The script also looks in /usr/sbin, where the daemons live.
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"])
    return [tool for tool in TOOLS if not shutil.which(tool, path=path)]


pytestmark = pytest.mark.launchers


@pytest.fixture
def needs_slurm(request):
    if "launchers" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("runs with -m launchers")
    missing = _missing_tools()
    if missing:
        why = (f"{', '.join(missing)} not installed "
               "(Debian/Ubuntu: apt-get install slurm-wlm munge)")
        if os.environ.get("COLLECTIVES_REQUIRE_LAUNCHERS") == "1":
            pytest.fail(f"COLLECTIVES_REQUIRE_LAUNCHERS=1, but {why}")
        pytest.skip(why)


def _cluster_dir(stderr):
    match = re.search(r"^local SLURM \S+ on 127\.0\.0\.1 \(ctld port \d+, "
                      r"slurmd port \d+, conf (\S+)/slurm\.conf\)$", stderr, re.M)
    assert match, f"no start-up line in:\n{stderr}"
    return match.group(1)


def _processes_using(path):
    """Pids whose command line or open files name ``path`` (the daemons name
    it on their command line; slurmstepd keeps a log in it open)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if path in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
                continue
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd).startswith(path + "/"):
                    found.append(int(proc.name))
                    break
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _assert_all_gone(path):
    assert not Path(path).exists(), f"{path} was not removed"
    left = _processes_using(path)
    assert not left, f"processes left behind: {left}"


def test_runs_srun_passes_the_exit_status_and_cleans_up(needs_slurm, tmp_path):
    command = ("sinfo -h -o %t && srun -n 2 --kill-on-bad-exit=1 printenv SLURM_PROCID"
               " && exit 3")
    proc = subprocess.run(["bash", str(SCRIPT), "--", "bash", "-c", command],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    state, *ranks = proc.stdout.split()
    assert state == "idle"
    assert sorted(ranks) == ["0", "1"]
    _assert_all_gone(_cluster_dir(proc.stderr))


def test_sigterm_mid_job_stops_the_job_and_every_daemon(needs_slurm, tmp_path):
    nap = f"300.{os.getpid()}{time.time_ns() % 10**6}"  # marks the tasks
    with subprocess.Popen(
            ["bash", str(SCRIPT), "--", "srun", "-n", "2", "bash", "-c",
             f"echo started; exec sleep {nap}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=tmp_path) as proc:
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout],
                         daemon=True).start()
        try:
            deadline = time.monotonic() + 60
            started = 0
            while started < 2:
                try:
                    started += lines.get(timeout=0.5).strip() == "started"
                except queue.Empty:
                    if proc.poll() is not None:
                        pytest.fail(f"exited {proc.returncode} before the tasks "
                                    f"started:\n{proc.stderr.read()}")
                    if time.monotonic() > deadline:
                        pytest.fail("the two tasks did not start within 60 s")
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            rc = proc.wait(timeout=60)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stderr = proc.stderr.read()
    assert rc == 143, stderr
    assert took < 30, f"tear-down took {took:.1f} s:\n{stderr}"
    _assert_all_gone(_cluster_dir(stderr))
    assert not _processes_using(f"sleep\0{nap}"), "the job's tasks were left running"
