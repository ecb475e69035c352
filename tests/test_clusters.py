"""`worker` under faked clusters: SLURM and Open MPI variables on 127.0.0.1.

JAX's cluster auto-detection reads environment variables, so two processes on
this machine with SLURM's (or Open MPI's) variables are a two-rank cluster
job as far as JAX can tell. Each test starts its ranks in their own process
groups and kills whatever is left at the end; `ranks` checks that nothing
outlives the test. Tests marked ``slow`` (the full ``check``) run with
``-m slow``.
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collectives import _compat
from collectives.distributed import _cluster
from helpers import RECIPES_DIR
from helpers import ROOT

BOUND_SECONDS = 120  # a failing rank must be gone within this
FAST = ("psum", "all_gather", "psum_scatter", "ppermute_ring", "dp_grads")

needs_port_override = pytest.mark.skipif(
    _compat.JAX_VERSION < (0, 8, 1),
    reason="JAX_COORDINATOR_PORT overrides a cluster's port from JAX 0.8.1")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _base_env():
    env = {name: value for name, value in os.environ.items()
           if name not in _cluster.CLUSTER_VARIABLES
           and not name.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_"))}
    env.pop("JAX_NUM_CPU_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["JAX_PLATFORMS"] = "cpu"
    return env


def slurm_env(rank, n, port):
    """What `srun` sets in each task (a one-node step on 127.0.0.1)."""
    return {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "127.0.0.1",
            "SLURM_NTASKS": str(n), "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank), "JAX_COORDINATOR_PORT": str(port)}


def ompi_env(rank, n, port):
    """What Open MPI < 5's `mpirun` sets (ORTE), its launcher on 127.0.0.1."""
    return {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://127.0.0.1:35001",
            "OMPI_COMM_WORLD_SIZE": str(n), "OMPI_COMM_WORLD_RANK": str(rank),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
            "JAX_COORDINATOR_PORT": str(port)}


CLUSTERS = {"slurm": slurm_env, "ompi": ompi_env}


def _alive(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class Ranks:
    """Start ranks as a cluster would; wait for them with a bound; kill leftovers."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.procs = []

    def start(self, env, *worker_args, rank=0):
        out = open(self.tmp_path / f"rank-{rank}-{len(self.procs)}.out",  # noqa: SIM115
                   "w+")  # closed in close()
        proc = subprocess.Popen(
            [sys.executable, "-m", "collectives", "worker", *worker_args],
            env={**_base_env(), **env}, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, start_new_session=True, cwd=ROOT)
        proc.out = out
        self.procs.append(proc)
        return proc

    def wait(self, proc, bound=BOUND_SECONDS):
        """(exit code, output); fails the test if it takes longer than ``bound``."""
        try:
            code = proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank pid {proc.pid} still running after {bound} s")
        proc.out.seek(0)
        return code, proc.out.read()

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            proc.out.close()
        leftover = [p.pid for p in self.procs if _alive(p.pid)]
        assert not leftover, f"processes {leftover} outlived the test"


@pytest.fixture
def ranks(tmp_path):
    started = Ranks(tmp_path)
    yield started
    started.close()


def _run_job(ranks, cluster, target, *options, n=2):
    port = _free_port()
    procs = [ranks.start(CLUSTERS[cluster](rank, n, port), "--cpu-devices", "4",
                         "--startup-timeout", "60", *options, "--", *target,
                         rank=rank)
             for rank in range(n)]
    return [ranks.wait(proc) for proc in procs]


@needs_port_override
@pytest.mark.multiprocess
@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_two_ranks_of_a_faked_cluster_pass_check(ranks, cluster, tmp_path):
    logs = tmp_path / "logs"
    (code0, out0), (code1, out1) = _run_job(ranks, cluster, ["check", *FAST],
                                            "--log-dir", str(logs))
    assert (code0, code1) == (0, 0), out0 + out1
    assert f"rank 0 of 2 ({cluster}:" in out0
    assert "process 0 of 2: 4 local devices of 8" in out0
    assert "process 1 of 2: 4 local devices of 8" in out1
    assert "ok: all 2 ranks passed" in out0
    assert "rank  host" not in out1  # only rank 0 prints the table
    for rank in range(2):
        assert "0 disagree" in (logs / f"rank-{rank}.log").read_text()


@pytest.mark.slow
@needs_port_override
@pytest.mark.multiprocess
@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_every_recipe_under_a_faked_cluster(ranks, cluster, request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("slow: run with -m slow")
    (code0, out0), (code1, out1) = _run_job(ranks, cluster, ["check"])
    assert (code0, code1) == (0, 0), out0 + out1
    assert "ok: all 2 ranks passed" in out0


@needs_port_override
@pytest.mark.multiprocess
@pytest.mark.parametrize("rank", [0, 1])
def test_a_lone_rank_fails_in_bounded_time_naming_the_variables(ranks, rank):
    start = time.monotonic()
    proc = ranks.start(slurm_env(rank, 2, _free_port()), "--cpu-devices", "4",
                       "--startup-timeout", "10", "--", "check", "psum", rank=rank)
    code, out = ranks.wait(proc)
    assert time.monotonic() - start < BOUND_SECONDS
    assert code == _cluster.EXIT_NOT_JOINED, out
    assert f"rank {rank} of 2 (slurm: SLURM_JOB_ID=4242" in out
    assert "SLURM_NTASKS=2" in out and "gave up" in out
    assert ("rank(s) [1] did not all connect" if rank == 0
            else "rank 0 (the coordinator") in out


def test_the_default_start_up_bound_is_within_two_minutes():
    from collectives import _cli

    args = _cli.build_parser().parse_args(["worker", "--", "check"])
    assert args.startup_timeout + 10 < BOUND_SECONDS


KILLED = textwrap.dedent("""
    import os, signal
    import jax
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("both here")
    if jax.process_index() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    multihost_utils.sync_global_devices("rank 1 never gets here")
""")


@needs_port_override
@pytest.mark.multiprocess
def test_a_killed_rank_fails_the_other_in_bounded_time(ranks, tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    start = time.monotonic()
    (code0, out0), (code1, _) = _run_job(
        ranks, "ompi", ["python", str(script)], "--heartbeat-timeout", "10",
        "--collective-timeout", "30")
    assert code1 == -signal.SIGKILL
    assert code0 != 0, out0
    assert time.monotonic() - start < BOUND_SECONDS


@pytest.mark.parametrize("env,fragment", [
    # Open MPI 5 (PRRTE: no ORTE URI): JAX < 0.11.2 sees no cluster, newer JAX
    # needs mpi4py; either way the rank must not run alone.
    ({"OMPI_VERSION": "5.0.3", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
     "OMPI_COMM_WORLD_SIZE=2"),
    # A SLURM allocation, but not started by srun (no job step).
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"},
     "SLURM_NTASKS=2"),
])
def test_cluster_variables_without_a_joinable_cluster_are_an_error(ranks, env,
                                                                   fragment):
    proc = ranks.start(env, "--cpu-devices", "4", "--", "check", "psum")
    code, out = ranks.wait(proc, bound=60)
    assert code == _cluster.EXIT_NOT_JOINED, out
    assert fragment in out
    assert "Fix:" in out and "Open MPI 5 use JAX >= 0.11.2 with mpi4py" in out


def test_the_recipe_file_never_falls_back_silently():
    env = {**_base_env(), "OMPI_VERSION": "5.0.3", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    result = subprocess.run([sys.executable, str(RECIPES_DIR / "multi_process.py")],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0, result.stdout
    assert "OMPI_COMM_WORLD_SIZE=2" in result.stderr
    assert "ok:" not in result.stdout


@pytest.mark.multiprocess
def test_ranks_named_by_hand(ranks):
    port = _free_port()
    code = "import jax; print('devices', jax.device_count(), jax.process_index())"
    procs = [ranks.start({}, "--cpu-devices", "2", "--coordinator",
                         f"127.0.0.1:{port}", "--num-processes", "2",
                         "--process-id", str(rank), "--", "python", "-c", code,
                         rank=rank) for rank in range(2)]
    (code0, out0), (code1, out1) = [ranks.wait(p) for p in procs]
    assert (code0, code1) == (0, 0), out0 + out1
    assert "devices 4 0" in out0 and "devices 4 1" in out1


def test_incomplete_options_are_refused(ranks):
    proc = ranks.start({}, "--coordinator", "127.0.0.1:1", "--", "check")
    code, out = ranks.wait(proc, bound=60)
    assert code == _cluster.EXIT_NOT_JOINED
    assert "--num-processes, --process-id missing" in out
