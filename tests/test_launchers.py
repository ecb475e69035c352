"""Every recipe and every fault under real launchers: `launch`, Open MPI's
`mpirun` and SLURM's `srun`, on 127.0.0.1.

Tests marked ``launchers`` run with ``-m launchers``; CI runs them inside a
single-node SLURM (``bash tools/local_slurm.sh -- python -m pytest -m
launchers``), where `mpirun` and `srun` exist. Elsewhere a test whose
launcher is missing skips, unless ``COLLECTIVES_REQUIRE_LAUNCHERS=1`` (CI)
makes that a failure. The SIGTERM and SIGKILL tests under `launch` need no
cluster and run in the default suite.

Each test tags the processes it starts (an environment variable every
launcher passes on) and counts them before and after: none may be left.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from collectives._registry import RECIPES
from collectives.distributed import _cluster
from collectives.distributed import _watch
from helpers import ROOT
from helpers import only_with_marker
from helpers import rank_env

REQUIRED = os.environ.get("COLLECTIVES_REQUIRE_LAUNCHERS") == "1"
TAG = "COLLECTIVES_TEST_TAG"
MPI_LOOPBACK = ["--mca", "oob_tcp_if_include", "lo", "--mca", "btl", "self,vader"]
KILL_BOUND = 30  # a SIGKILLed rank must fail the job within this (seconds)
TERM_BOUND = 10  # a SIGTERMed rank must stop within this
RANK_VARIABLE = {"launch": "COLLECTIVES_PROCESS_ID", "mpirun": "OMPI_COMM_WORLD_RANK",
                 "srun": "SLURM_PROCID"}


def _selected(request):
    only_with_marker(request, "launchers", "CI: inside tools/local_slurm.sh")


def _srun_works():
    if not shutil.which("srun") or not shutil.which("sinfo"):
        return "srun is not installed (Debian: apt-get install slurm-wlm munge)"
    # (asked again for up to a minute: a controller busy starting the jobs of
    # tests running side by side can fail to answer one query)
    deadline = time.monotonic() + 60
    while True:
        try:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True,
                                   text=True, timeout=15)
        except subprocess.TimeoutExpired:
            state = None
        if state is not None and ("idle" in state.stdout or "mix" in state.stdout
                                  or "alloc" in state.stdout):
            return None
        if time.monotonic() > deadline:
            break
        time.sleep(2)
    if state is None:
        return "sinfo did not answer in 15 s"
    return ("no SLURM node is up (run the tests inside `bash "
            f"tools/local_slurm.sh -- ...`): {state.stderr.strip()[:200]}")


def _mpirun_works():
    if not shutil.which("mpirun"):
        return "mpirun is not installed (Debian: apt-get install openmpi-bin)"
    return None


MISSING = {"launch": lambda: None, "mpirun": _mpirun_works, "srun": _srun_works}


def _need(launcher):
    why = MISSING[launcher]()
    if why:
        if REQUIRED:
            pytest.fail(f"COLLECTIVES_REQUIRE_LAUNCHERS=1, but {launcher}: {why}")
        pytest.skip(f"{launcher}: {why}")


def command(launcher, n, devices, target, *worker_options):
    """The command line that starts ``n`` ranks of ``devices`` CPU devices."""
    python = [sys.executable, "-m", "collectives"]
    if launcher == "launch":
        return [*python, "launch", "-n", str(n), "--devices-per-process",
                str(devices), *worker_options, "--", *target]
    worker = [*python, "worker", "--cpu-devices", str(devices), *worker_options,
              "--", *target]
    if launcher == "mpirun":
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        return ["mpirun", *root, "--oversubscribe", "-np", str(n), *MPI_LOOPBACK,
                *worker]
    return ["srun", "-n", str(n), "--kill-on-bad-exit=1", *worker]


def tagged(tag):
    """Live processes whose environment carries ``tag``."""
    found = []
    needle = f"{TAG}={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] != "Z":
            found.append(int(entry.name))
    return found


class Job:
    """One launcher run, its processes tagged; whatever is left is killed."""

    def __init__(self, argv, tmp_path, env=None):
        self.tag = uuid.uuid4().hex
        assert tagged(self.tag) == []
        self.out = open(tmp_path / f"job-{self.tag}.out", "w+")  # noqa: SIM115 (closed in close)
        env = {**rank_env(strip=()), TAG: self.tag, **(env or {})}
        self.proc = subprocess.Popen(argv, env=env, stdout=self.out,
                                     stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=ROOT,
                                     start_new_session=True)

    def wait(self, bound):
        """(exit code, output); fails the test past ``bound`` seconds."""
        try:
            code = self.proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job was still running after {bound} s:\n"
                        f"{self.output()[-3000:]}")
        return code, self.output()

    def output(self):
        self.out.seek(0)
        return self.out.read()

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while tagged(self.tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = tagged(self.tag)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        self.out.close()
        assert not left, f"processes {left} outlived the job"


@pytest.fixture
def job(tmp_path):
    jobs = []

    def start(argv, env=None):
        jobs.append(Job(argv, tmp_path, env))
        return jobs[-1]
    yield start
    for started in jobs:
        started.close()


# -- every recipe, every row, across processes ---------------------------------

# A row of the table `launch` prints (process, pid, ...) or rank 0 of
# `worker` prints (rank, host, ...), as run or as shown in the docs.
ROW = re.compile(r"^[#\s]*(?:\[p0\] )?(\d+) +(\S+) +(ok|failed|missing|stopped) "
                 r"+(-|-?\d+) +[\d.]+ +(.+?) *$", re.M)
DOCS = ROOT / "docs" / "multi_process.md"
TEMPLATES = ROOT / "examples" / "cluster"


def table(text):
    """(index, status, exit code, summary) of each row, and the closing line."""
    rows = [(index, status, code, summary)
            for index, _, status, code, summary in ROW.findall(text)]
    closing = re.findall(r"^[#\s]*((?:ok|FAILED|launch failed): .*?) *$", text, re.M)
    return rows, closing[-1] if closing else None


def shown(path, after):
    """The table ``path`` shows after the text ``after``."""
    text = path.read_text()
    assert after in text, f"{path.name} no longer says {after!r}"
    rest = text[text.index(after):]
    end = re.search(r"^[#\s]*(ok|FAILED): .*$", rest, re.M)
    return table(rest[:end.end()])


def _assert_documented(out, path, after):
    """What ran is what ``path`` shows (the pid, host and seconds aside)."""
    ran = table(out)
    assert ran == shown(path, after), (
        f"{path.relative_to(ROOT)} shows another table than this run printed; "
        f"update it (after {after!r}) to the run's:\n" + "\n".join(
            line for line in out.splitlines()
            if ROW.match(line) or line.startswith(("ok:", "FAILED:"))))


ONE_PROCESS = "interpret mode simulates the devices of one process"
"""Why a kernel recipe's row is skipped across processes (and only why)."""


def _assert_every_recipe_agrees(out):
    summaries = re.findall(r"(\d+) agree, (\d+) disagree", out)
    assert summaries and all(bad == "0" for _, bad in summaries), out[-3000:]
    # Nothing is skipped but the kernel recipes, whose Pallas interpret mode
    # runs the devices of one process: each of their rows says so.
    tail = out.split("recipe ")[-1]
    skipped = [line for line in tail.splitlines()
               if " skipped (" in line and " agree, " not in line]
    kernels = {name for name, recipe in RECIPES.items() if recipe.family == "kernel"}
    for line in skipped:
        name = re.sub(r"^\[p\d+\] ", "", line).split()[0]
        assert name in kernels and ONE_PROCESS in line, line
    assert len(skipped) == len(re.findall(
        rf"^(?:\[p\d+\] )?(?:{'|'.join(kernels)}) ", tail, re.M)), tail[-3000:]
    counts = {int(n) for n in re.findall(r"disagree, (\d+) skipped", tail)}
    assert counts <= {len(skipped)}, tail[-3000:]
    for name in RECIPES:
        assert re.search(rf"^(\[p0\] )?{name} ", out, re.M), f"{name} did not run"


TWO_BY_FOUR = pytest.mark.xdist_group("every recipe on 2 ranks x 4 devices")
"""The runs of every recipe on 2 ranks of 4 devices (launch, mpirun, srun)
compile the same programs: CI runs them one after another on one worker
(``--dist loadgroup``), so that the later ones read the first one's programs
from JAX's compilation cache."""


@pytest.mark.launchers
@pytest.mark.multiprocess
@pytest.mark.parametrize("n,devices", [pytest.param(2, 4, marks=TWO_BY_FOUR), (4, 2)])
def test_every_recipe_agrees_under_launch(request, job, n, devices):
    _selected(request)
    code, out = job(command("launch", n, devices, ["check"])).wait(900)
    assert code == 0, out[-5000:]
    _assert_every_recipe_agrees(out)
    assert f"ok: {n} processes x {devices} devices finished" in out
    if (n, devices) == (2, 4):
        _assert_documented(out, DOCS, "at the end the launcher prints one line")


def _run_template(launcher, job, tmp_path):
    """Start examples/cluster's template for ``launcher`` on this machine, as
    each template says, with 2 ranks x 4 CPU devices."""
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                    os.environ["PATH"]])}
    if launcher == "mpirun":
        env.update(NP="2", HOSTS="localhost:2", IFACE="lo", CPU_DEVICES="4",
                   LOG_DIR=str(tmp_path / "logs"))
        if os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        started = job(["bash", str(TEMPLATES / "mpirun.sh")], env)
        code, out = started.wait(900)
        return code, out
    output = tmp_path / "slurm.out"
    started = job(["sbatch", "--wait", "--nodes=1", "--ntasks-per-node=2",
                   "--export=ALL,CPU_DEVICES=4", f"--chdir={tmp_path}",
                   f"--output={output}", str(TEMPLATES / "slurm.sbatch")], env)
    code, out = started.wait(900)
    return code, out + (output.read_text() if output.exists() else "")


@TWO_BY_FOUR
@pytest.mark.launchers
@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher,template", [("mpirun", "mpirun.sh"),
                                               ("srun", "slurm.sbatch")])
def test_the_cluster_templates_run_every_recipe(request, job, tmp_path, launcher,
                                                template):
    _selected(request)
    _need(launcher)
    code, out = _run_template(launcher, job, tmp_path)
    assert code == 0, out[-5000:]
    _assert_every_recipe_agrees(out)
    assert "ok: all 2 ranks passed" in out, out[-3000:]
    _assert_documented(out, TEMPLATES / template, "Expected output")
    if launcher == "srun":
        _assert_documented(out, DOCS, "rank 0 prints one table")
    # the guide names the versions CI ran
    slurmd = shutil.which("slurmd", path=f"{os.environ['PATH']}{os.pathsep}/usr/sbin")
    version = subprocess.run(["mpirun", "--version"] if launcher == "mpirun"
                             else [slurmd, "-V"], capture_output=True, text=True,
                             timeout=30).stdout
    number = re.search(r"(\d+\.\d+\.\d+)", version).group(1)
    name = "Open MPI" if launcher == "mpirun" else "SLURM"
    assert f"{name} {number}" in DOCS.read_text().replace("\n", " "), (
        f"docs/multi_process.md should name the {name} CI ran: {number}")


@pytest.mark.launchers
@pytest.mark.multiprocess
def test_mpirun_with_one_rank_runs_as_one_process(request, job):
    _selected(request)
    _need("mpirun")
    code, out = job(command("mpirun", 1, 8, ["check", "psum", "fsdp_tp_mlp"])
                    ).wait(300)
    assert code == 0, out
    assert "rank 0 of 1 (ompi:" in out
    assert re.search(r"\d+ agree, 0 disagree", out), out


@pytest.mark.launchers
@pytest.mark.multiprocess
def test_salloc_without_srun_fails_naming_the_variables(request, job):
    _selected(request)
    _need("srun")
    worker = [sys.executable, "-m", "collectives", "worker", "--cpu-devices", "4",
              "--", "check", "psum"]
    code, out = job(["salloc", "-n", "2", *worker]).wait(120)
    assert code == _cluster.EXIT_NOT_JOINED, out
    assert "SLURM_NTASKS=2" in out and "under SLURM start the ranks with `srun`" in (
        out.replace("\n", " "))


@pytest.mark.launchers
@pytest.mark.multiprocess
def test_the_bench_runs_under_mpirun_with_4_mib_scatter_chunks(request, job):
    _selected(request)
    _need("mpirun")
    code, out = job(command("mpirun", 2, 4, [
        "bench", "-b", "4M", "-e", "4M", "-c", "psum_scatter", "psum", "-r", "2",
        "--scatter-chunk", "4M", "--scatter-iters", "20"])).wait(600)
    assert code == 0, out[-4000:]
    for collective in ("psum_scatter", "psum"):
        rows = re.findall(rf"^ +{collective} +(\w+) +4194304 .* (\d+)/(\d+)$", out,
                          re.M)
        assert {form for form, *_ in rows} >= {"shard_map", "jit"}, out[-4000:]
        assert all((a, b) == ("0", "0") for _, a, b in rows), out[-4000:]
    assert re.search(r"psum_scatter stress .* 4194304 B per chunk, 20 checked "
                     r"repetitions on 8 devices; #wrong per rank: 0/0", out), out
    assert "ok: all 2 ranks passed" in out


# -- faults ----------------------------------------------------------------------

LOOP = textwrap.dedent("""
    import os, sys, time
    import jax
    from jax.experimental import multihost_utils
    path = os.path.join(sys.argv[1], f"pid-{jax.process_index()}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    while True:  # in and out of collectives until a rank is stopped
        multihost_utils.sync_global_devices("tick")
        time.sleep(0.01)
""")


def _start_two(job, launcher, tmp_path, name, source, *argv, markers):
    """Start 2 ranks of 2 devices running ``source`` (saved as ``name`` in
    ``tmp_path``, given ``tmp_path`` and ``argv``) and wait until every file
    of ``markers`` exists in ``tmp_path``; the started job."""
    script = tmp_path / name
    script.write_text(source)
    started = job(command(launcher, 2, 2,
                          ["python", str(script), str(tmp_path), *argv],
                          "--timeout", "300"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
            (tmp_path / marker).exists() for marker in markers):
        assert started.proc.poll() is None, started.output()
        time.sleep(0.1)
    assert all((tmp_path / marker).exists() for marker in markers), started.output()
    return started


def _signal_rank(request, tmp_path, job, launcher, signum, rank=1):
    """Start a job of 2 ranks looping over collectives, send ``signum`` to
    ``rank`` from outside (as a scheduler would); (seconds to the job's end,
    exit code, output, the rank's pid)."""
    if launcher != "launch":
        _selected(request)
    _need(launcher)
    started = _start_two(job, launcher, tmp_path, "loop.py", LOOP,
                         markers=["pid-0", "pid-1"])
    time.sleep(1.0)  # well inside the loop
    pid = int((tmp_path / f"pid-{rank}").read_text())
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"{RANK_VARIABLE[launcher]}={rank}".encode() in environ
    os.kill(pid, signum)
    sent = time.monotonic()
    code, out = started.wait(120)
    return time.monotonic() - sent, code, out, pid


LAUNCHERS = ["launch", pytest.param("mpirun", marks=pytest.mark.launchers),
             pytest.param("srun", marks=pytest.mark.launchers)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_killed_rank_fails_the_job_naming_it(request, tmp_path, job, launcher):
    seconds, code, out, pid = _signal_rank(request, tmp_path, job, launcher,
                                           signal.SIGKILL)
    assert seconds < KILL_BOUND, out
    assert code != 0, out
    if launcher == "launch":
        assert f"launch failed: process 1 (pid {pid}) was killed by signal SIGKILL" in (
            out), out
    else:
        assert (f"error: rank 1 (host {os.uname().nodename}, pid {pid}) ended "
                "without reporting a result") in out, out
        assert f"(exit {_watch.EXIT_PEER_LOST})" in out


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_sigtermed_rank_stops_at_once_naming_the_signal(request, tmp_path, job,
                                                          launcher):
    seconds, code, out, pid = _signal_rank(request, tmp_path, job, launcher,
                                           signal.SIGTERM)
    assert seconds < TERM_BOUND, out
    assert code != 0, out
    assert "error: rank 1 was stopped by SIGTERM after" in out, out
    if launcher == "launch":
        assert (f"launch failed: process 1 (pid {pid}) was stopped by SIGTERM "
                "(exit 143)") in out, out
    else:
        assert f"rank 1 (host {os.uname().nodename}, pid {pid}) was stopped by " \
               "SIGTERM. Rank 0 stops too" in out, out


# Rank 1 fails on its own: it sleeps (stuck outside JAX) or exits 3 where
# rank 0 goes on into the next collective.
FAULTS = textwrap.dedent("""
    import os, sys, time
    import jax
    from jax.experimental import multihost_utils
    rank = jax.process_index()
    multihost_utils.sync_global_devices("up")
    path = os.path.join(sys.argv[1], f"pid-{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    if rank == 1 and sys.argv[2] == "stuck":
        time.sleep(600)  # stuck outside JAX: never enters the collective below
    if rank == 1 and sys.argv[2] == "exit":
        sys.exit(3)
    while True:
        multihost_utils.sync_global_devices("tick")
        time.sleep(0.01)
""")

FAULT_BOUND = 30  # every fault below ends the job within this (seconds)
CPP_TRACE = re.compile(r"Begin stack trace|Check failed|^F\d{4} ", re.M)


def _fault(request, tmp_path, job, launcher, how):
    """Start 2 ranks of FAULTS, fault rank 1 (or 0) as ``how`` says; (seconds
    from the fault to the job's end, exit code, output, the faulty rank's pid)."""
    if how == "sigstop":
        return _signal_rank(request, tmp_path, job, launcher, signal.SIGSTOP)
    if how == "kill rank 0":
        return _signal_rank(request, tmp_path, job, launcher, signal.SIGKILL, rank=0)
    _need(launcher)
    started = _start_two(job, launcher, tmp_path, "faults.py", FAULTS, how,
                         markers=["pid-1"])
    faulted = time.monotonic()
    code, out = started.wait(120)
    return time.monotonic() - faulted, code, out, int((tmp_path / "pid-1").read_text())


FAULT_CASES = ["sigstop", "stuck", "exit", "kill rank 0"]


@pytest.mark.faults
@pytest.mark.launchers
@pytest.mark.multiprocess
@pytest.mark.parametrize("how", FAULT_CASES)
@pytest.mark.parametrize("launcher", ["launch", "mpirun", "srun"])
def test_each_fault_names_the_rank_that_failed_first(request, tmp_path, job,
                                                     launcher, how):
    _selected(request)
    seconds, code, out, pid = _fault(request, tmp_path, job, launcher, how)
    assert code != 0, out
    assert seconds < FAULT_BOUND, f"{seconds:.1f} s:\n{out}"
    assert "stack trace" not in out, out
    if not (how in ("kill rank 0", "sigstop") and launcher != "launch"):
        assert not CPP_TRACE.search(out), out
    # (Rank 0 hosts JAX's coordination service. When it is killed, or exits
    # after naming a stopped rank 1 that srun or mpirun then resumes to end
    # it, rank 1's JAX client may log one fatal line, "Terminating process
    # because the JAX distributed service detected fatal errors", racing
    # the watch; the watch's message, asserted below, names the right rank.)
    host = os.uname().nodename
    expected = {
        "sigstop": "stopped responding: no heartbeat for",
        "stuck": "has been idle outside JAX for",
        "exit": "exited with code 3" if launcher == "launch" else "failed (exit 3",
        "kill rank 0": ("was killed by signal SIGKILL" if launcher == "launch" else
                        "ended without reporting a result"),
    }[how]
    if launcher == "launch":
        rank = 0 if how == "kill rank 0" else 1
        head = f"launch failed: process {rank} (pid {pid}) "
        assert re.search(re.escape(head) + r".*" + re.escape(expected), out), out
    elif how == "kill rank 0":
        assert f"error: rank 0 (the coordinator) {expected}" in out, out
    else:
        assert f"error: rank 1 (host {host}, pid {pid}) {expected}" in out, out
    if how == "stuck":
        assert "faults.py:12 (<module>)" in out, out  # where it sat


WAITS = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P
    rank, how = jax.process_index(), sys.argv[2]
    mesh = jax.make_mesh((jax.device_count(),), ("i",))
    total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))
    multihost_utils.sync_global_devices("up")
    for step in range(10**6):
        if rank == 1 and step == 3:
            with open(os.path.join(sys.argv[1], "asleep"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)  # asleep outside JAX: never enters the sum below
        out = total(jax.make_array_from_process_local_data(
            NamedSharding(mesh, P("i")),
            np.ones((jax.local_device_count(), 4), np.float32)))
        if how == "method":
            out.block_until_ready()  # C++ in JAX 0.10: no JAX frame on the stack
        elif how == "function":
            jax.block_until_ready(out)
        elif how == "asarray":
            np.asarray(out)
        else:
            multihost_utils.sync_global_devices("tick")
""")


@pytest.mark.faults
@pytest.mark.launchers
@pytest.mark.multiprocess
@pytest.mark.parametrize("wait", ["method", "function", "asarray", "sync"])
@pytest.mark.parametrize("launcher", ["launch", "mpirun", "srun"])
def test_a_rank_asleep_is_named_however_the_others_wait(request, tmp_path, job,
                                                       launcher, wait):
    # rank 0 waits for a sum rank 1 never joins: with out.block_until_ready(),
    # jax.block_until_ready(out), np.asarray(out) or sync_global_devices
    _selected(request)
    _need(launcher)
    started = _start_two(job, launcher, tmp_path, "waits.py", WAITS, wait,
                         markers=["asleep"])
    asleep = time.monotonic()
    code, out = started.wait(120)
    seconds = time.monotonic() - asleep
    pid = int((tmp_path / "asleep").read_text())
    assert code != 0 and seconds < FAULT_BOUND, f"{seconds:.1f} s:\n{out}"
    assert not CPP_TRACE.search(out) and "stack trace" not in out, out
    named = (f"launch failed: process 1 (pid {pid}) has been idle outside JAX"
             if launcher == "launch" else
             f"error: rank 1 (host {os.uname().nodename}, pid {pid}) has been "
             "idle outside JAX")
    assert named in out and "waits.py:15 (<module>)" in out, out


MISMATCH = textwrap.dedent("""
    import os, sys
    import numpy as np
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((jax.device_count(),), ("i",))
    total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))
    twice = jax.jit(lambda a: 2 * a, out_shardings=NamedSharding(mesh, P()))
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("i")), np.ones((jax.local_device_count(), 4), np.float32))
    multihost_utils.sync_global_devices("up")
    open(os.path.join(sys.argv[1], f"in-{jax.process_index()}"), "w").close()
    if jax.process_index() == 0:
        total(x).block_until_ready()  # an all-reduce
    else:
        twice(x).block_until_ready()  # an all-gather: the two never meet
""")


SHAPES = textwrap.dedent("""
    import os, sys
    import numpy as np
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((jax.device_count(),), ("i",))
    cols = 4 + jax.process_index()  # rank 1's rows are one longer
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("i")), np.ones((jax.local_device_count(), cols),
                                             np.float32), (jax.device_count(), cols))
    total = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "i"), mesh=mesh,
                                  in_specs=P("i"), out_specs=P()))
    multihost_utils.sync_global_devices("up")
    open(os.path.join(sys.argv[1], f"in-{jax.process_index()}"), "w").close()
    print(np.asarray(total(x).addressable_shards[0].data))  # one line, two shapes
""")


MISMATCHES = {
    # a sum on rank 0, a gather on rank 1: each line names its rank
    "collectives": ("mismatch.py", MISMATCH, ["rank 0 at mismatch.py:15 (<module>)",
                                              "rank 1 at mismatch.py:17 (<module>)"]),
    # the same sum, another shape on each rank: rank 0's sum ends and it waits
    # further on; rank 1 waits for its value in C++ (no JAX frame on the
    # stack), and the call's array says so
    "shapes": ("shapes.py", SHAPES, [
        "rank 0 at ", "rank 1 at shapes.py:16 (<module>) in np.asarray() of total",
        "the same shapes"]),
}


@pytest.mark.faults
@pytest.mark.launchers
@pytest.mark.multiprocess
@pytest.mark.parametrize("case", list(MISMATCHES))
@pytest.mark.parametrize("launcher", ["launch", "mpirun", "srun"])
def test_ranks_in_different_collectives_are_named_each_where_it_waits(
        request, tmp_path, job, launcher, case):
    # gloo would wait its 120 s and end in a C++ stack trace under srun
    _selected(request)
    _need(launcher)
    name, source, places = MISMATCHES[case]
    started = _start_two(job, launcher, tmp_path, name, source,
                         markers=["in-0", "in-1"])
    entered = time.monotonic()
    code, out = started.wait(120)
    seconds = time.monotonic() - entered
    assert code != 0 and seconds < FAULT_BOUND, f"{seconds:.1f} s:\n{out}"
    assert not CPP_TRACE.search(out) and "stack trace" not in out, out
    lines = out.strip().splitlines()
    said = ([lines[-1]] if launcher == "launch" else  # the launcher's verdict
            [line for line in lines if line.startswith("error: the ranks wait")])
    assert said and all(
        "the ranks wait in different collectives" in line
        and all(place in line for place in places) for line in said), out


SILENCE = textwrap.dedent("""
    import sys, time
    import jax
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("up")
    if sys.argv[1] == "busy":
        end = time.monotonic() + 12
        while time.monotonic() < end:  # works on, past --timeout
            sum(range(10000))
    else:
        time.sleep(600)  # every rank idle: no progress anywhere
    multihost_utils.sync_global_devices("done")
""")


@pytest.mark.faults
@pytest.mark.launchers
@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["launch", "srun"])
def test_timeout_bounds_silence_not_the_whole_run(request, tmp_path, job, launcher):
    _selected(request)
    _need(launcher)
    script = tmp_path / "silence.py"
    script.write_text(SILENCE)
    code, out = job(command(launcher, 2, 1, ["python", str(script), "busy"],
                            "--timeout", "5")).wait(120)
    assert code == 0, out  # 12 s of work under --timeout 5
    code, out = job(command(launcher, 2, 1, ["python", str(script), "idle"],
                            "--timeout", "5")).wait(60)
    assert code != 0 and "error: no rank made progress for 5 s (--timeout" in out, out
    assert "rank 0 idle outside JAX at silence.py:11 (<module>)" in out, out


SIGINT_DEFAULT = [sys.executable, "-c", "import os, signal, sys; signal.signal("
                  "signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"]
"""Runs the command after it with SIGINT's default action, as a terminal's
foreground job has it. A shell without job control (a CI script's ``cmd &``)
starts background commands with SIGINT ignored; Python then keeps ignoring
it, and so would every process started from there."""


@pytest.mark.multiprocess
def test_ctrl_c_on_the_launcher_ends_it_and_its_ranks_in_one_line(tmp_path, job):
    # Ctrl-C in a terminal signals the whole foreground group; here only the
    # launcher gets SIGINT, so its ranks end because it stops them.
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    started = job([*SIGINT_DEFAULT, *command(
        "launch", 2, 2, ["python", str(script), str(tmp_path)], "--timeout", "300")])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
            (tmp_path / f"pid-{r}").exists() for r in range(2)):
        assert started.proc.poll() is None, started.output()
        time.sleep(0.2)
    pids = [int((tmp_path / f"pid-{r}").read_text()) for r in range(2)]
    started.proc.send_signal(signal.SIGINT)
    code, out = started.wait(TERM_BOUND + 10)
    assert code == 130, out
    assert out.strip().splitlines()[-1] == "launch: interrupted", out
    assert "Traceback" not in out, out
    for pid in pids:  # the ranks ended with the launcher, not left to the test
        assert not Path(f"/proc/{pid}").exists() or (
            Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"), pid


def test_every_documented_worker_table_is_the_one_ci_runs():
    # CI runs the Open MPI and SLURM templates and checks their tables; the
    # Kubernetes template (no cluster here) and the guide must show the same.
    checked = shown(TEMPLATES / "mpirun.sh", "Expected output")
    assert checked == shown(TEMPLATES / "slurm.sbatch", "Expected output")
    assert checked == shown(TEMPLATES / "k8s-indexed-job.yaml", "Expected")
    assert checked == shown(DOCS, "rank 0 prints one table")
    assert checked[1] == "ok: all 2 ranks passed"
