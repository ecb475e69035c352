"""`worker` under faked clusters: SLURM and Open MPI variables on 127.0.0.1.

JAX's cluster auto-detection reads environment variables, so two processes on
this machine with SLURM's (or Open MPI's) variables are a two-rank cluster
job as far as JAX can tell. Each test starts its ranks in their own process
groups and kills whatever is left at the end; `ranks` checks that nothing
outlives the test. The real launchers, and every recipe across processes,
are in tests/test_launchers.py.
"""

import os
import random
import re
import shlex
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
from collectives.distributed import _watch
from helpers import ROOT
from helpers import rank_env

BOUND_SECONDS = 120  # a failing rank must be gone within this
FAST = ("psum", "all_gather", "psum_scatter", "ppermute_ring", "dp_grads")

# JAX derives a SLURM or Open MPI job's coordinator port from its job id, in
# [EPHEMERAL, 65535]; JAX_COORDINATOR_PORT overrides it from 0.8.1. The fakes
# pick a free port there and the job id that maps to it, so both agree on
# every supported release.
EPHEMERAL = 65535 - 2**12 + 1


def _free_port():
    for port in random.Random(os.getpid()).sample(range(EPHEMERAL, 65536), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{EPHEMERAL}, 65535] on 127.0.0.1")


def slurm_job_id(port):
    return str(port - EPHEMERAL + 2**12)


def slurm_env(rank, n, port):
    """What `srun` sets in each task (a one-node step on 127.0.0.1)."""
    return {"SLURM_JOB_ID": slurm_job_id(port), "SLURM_STEP_NODELIST": "127.0.0.1",
            "SLURM_NTASKS": str(n), "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank), "JAX_COORDINATOR_PORT": str(port)}


def ompi_env(rank, n, port):
    """What Open MPI < 5's `mpirun` sets (ORTE), its launcher on 127.0.0.1."""
    orte_job = (port - EPHEMERAL + 2**12) * 2**12
    return {"OMPI_MCA_orte_hnp_uri": f"{orte_job}.0;tcp://127.0.0.1:35001",
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
            env={**rank_env(), **env}, stdout=out, stderr=subprocess.STDOUT,
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


def _run_job(ranks, cluster, target, *options, n=2, bound=BOUND_SECONDS):
    port = _free_port()
    procs = [ranks.start(CLUSTERS[cluster](rank, n, port), "--cpu-devices", "4",
                         "--startup-timeout", "60", *options, "--", *target,
                         rank=rank)
             for rank in range(n)]
    return [ranks.wait(proc, bound) for proc in procs]


@pytest.mark.multiprocess
@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_two_ranks_of_a_faked_cluster_pass_check(ranks, cluster, tmp_path):
    logs = tmp_path / "logs"
    (code0, out0), (code1, out1) = _run_job(ranks, cluster, ["check", *FAST],
                                            "--log-dir", str(logs))
    assert (code0, code1) == (0, 0), out0 + out1
    assert f"rank 0 of 2 ({cluster}:" in out0
    assert "process 0 of 2: 4 local devices of 8" in out0
    assert "ok: all 2 ranks passed" in out0
    # rank 0 alone prints the rows and the table, so each line appears once;
    # every rank's whole output is in its log
    assert "rank  host" not in out1 and "psum " not in out1, out1
    assert "process 1 of 2: 4 local devices of 8" in (logs / "rank-1.log").read_text()
    for rank in range(2):
        assert "0 disagree" in (logs / f"rank-{rank}.log").read_text()


@pytest.mark.multiprocess
def test_a_job_run_again_with_a_warm_compilation_cache_passes(ranks, tmp_path):
    # JAX 0.12.1: rank 0 reading a program back from the persistent cache
    # waited forever in its first collective, so the second run hung; the
    # ranks now join with the cache off there (and use it elsewhere)
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    for attempt in range(2):
        port = _free_port()
        procs = [ranks.start({**slurm_env(rank, 2, port), **cache}, "--cpu-devices",
                             "4", "--", "check", "psum", rank=rank)
                 for rank in range(2)]
        (code0, out0), (code1, out1) = [ranks.wait(p, bound=60) for p in procs]
        assert (code0, code1) == (0, 0), (attempt, out0 + out1)
        assert "ok: all 2 ranks passed" in out0
        noted = "persistent compilation cache" in out0
        assert noted == _compat.CACHED_PROGRAM_HANGS_ACROSS_PROCESSES, out0

@pytest.mark.multiprocess
@pytest.mark.parametrize("rank", [0, 1])
def test_a_lone_rank_fails_in_bounded_time_naming_the_variables(ranks, rank):
    start = time.monotonic()
    port = _free_port()
    proc = ranks.start(slurm_env(rank, 2, port), "--cpu-devices", "4",
                       "--startup-timeout", "5", "--", "check", "psum", rank=rank)
    code, out = ranks.wait(proc)
    assert time.monotonic() - start < BOUND_SECONDS
    assert code == _cluster.EXIT_NOT_JOINED, out
    assert f"rank {rank} of 2 (slurm: SLURM_JOB_ID={slurm_job_id(port)}" in out
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


@pytest.mark.multiprocess
def test_a_killed_rank_fails_the_other_in_bounded_time(ranks, tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    start = time.monotonic()
    (code0, out0), (code1, _) = _run_job(
        ranks, "ompi", ["python", str(script)], "--heartbeat-timeout", "10",
        "--collective-timeout", "30")
    assert code1 == -signal.SIGKILL
    # the peer watch, not JAX's heartbeat (10 s here, with a C++ stack trace)
    assert code0 == _watch.EXIT_PEER_LOST, out0
    assert re.search(r"error: rank 1 \(host .*, pid \d+\) ended without reporting "
                     r"a result", out0), out0
    assert time.monotonic() - start < 30 + 15  # (+ start-up)


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
    # a usage error (exit 2, as parsed), not a job that could not be joined
    proc = ranks.start({}, "--coordinator", "127.0.0.1:1", "--", "check")
    code, out = ranks.wait(proc, bound=60)
    assert code == 2, out
    assert "--num-processes, --process-id missing" in out and "Fix:" in out


# -- the benchmark across processes ------------------------------------------

@pytest.mark.multiprocess
def test_bench_across_processes_reports_min_avg_max_and_wrong_per_rank():
    from collectives import distributed

    result = distributed.launch(
        ["bench", "-b", "256K", "-e", "256K", "-c", "psum_scatter", "--forms",
         "shard_map", "-r", "2", "-w", "0", "-q", "--scatter-chunk", "1M",
         "--scatter-iters", "2"],
        num_processes=2, devices_per_process=4, echo="none")
    assert result.ok, result.report()
    out = result.processes[0].output
    assert re.search(r"min\(us\) +avg\(us\) +max\(us\) +algbw +busbw +#wrong", out)
    row = re.search(r"psum_scatter +shard_map +262144 .* (\d+)/(\d+)$", out, re.M)
    assert row and row.groups() == ("0", "0"), out
    assert "pmap: skipped" not in out  # only named when asked for
    assert re.search(r"psum_scatter stress .* 1048576 B per chunk, 2 checked "
                     r"repetitions on 8 devices; #wrong per rank: 0/0", out), out
    assert "# Out of bounds values : 0 OK" in out


def _row(collective, form, time_us, wrong):
    return {"collective": collective, "kind": "reduce-scatter", "form": form,
            "size": 1 << 20, "count": 1 << 18, "type": "float32", "devices": 8,
            "iters": 4, "time_us": time_us, "wrong": wrong}


def test_bench_report_takes_min_avg_max_over_ranks_and_blames_the_rank():
    from collectives.distributed import _bench

    everyone = [{"rows": [_row("psum_scatter", "jit", 100.0, 0)], "stress": None},
                {"rows": [_row("psum_scatter", "jit", 300.0, 5)], "stress": None}]
    lines = _bench.report(everyone, skipped=["pmap"])
    (row,) = [line for line in lines if "psum_scatter" in line and "jit" in line]
    fields = row.split()
    assert fields[6:9] == ["100.0", "200.0", "300.0"]  # min, avg, max
    algbw = (1 << 20) / 300e-6 / 1e9  # the slowest rank sets the bandwidth
    assert fields[9] == f"{algbw:.3f}"
    assert fields[-1] == "0/5"
    assert any("pmap: skipped" in line for line in lines)
    assert lines[-1] == "# Out of bounds values : 5 FAILED"


@pytest.mark.parametrize("target,problem", [
    (["bench", "--overhead"], "bench --overhead: not available across processes"),
    (["bench", "--scatter-iters", "-1"], "--scatter-iters: expected 0 or more"),
    (["bench", "-b", "1Q"], "argument -b/--minbytes"),
])
def test_bad_bench_targets_are_refused_before_anything_starts(target, problem):
    from collectives.distributed._results import worker_argv

    with pytest.raises(ValueError, match=problem):
        worker_argv(target)


def test_iterations_are_the_same_on_every_rank_and_bounded():
    from collectives.distributed import _bench

    assert _bench.iterations_for(1 << 20) == 8
    assert _bench.iterations_for(1) == 64
    assert _bench.iterations_for(1 << 30) == 1


# -- the templates -----------------------------------------------------------

TEMPLATES = sorted((ROOT / "examples" / "cluster").iterdir())


def test_there_is_a_template_for_each_cluster():
    assert {p.name for p in TEMPLATES} >= {"slurm.sbatch", "mpirun.sh",
                                          "k8s-indexed-job.yaml"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_templates_use_options_the_worker_has(path):
    from collectives import _cli

    text = re.sub(r"\\\n|\n(?=\s)", " ", path.read_text())  # continuation lines
    match = re.search(r"python -m collectives worker (.*?)-- (check|bench|run)\b",
                      text)
    assert match, f"{path.name} runs no `collectives worker`"
    options = re.sub(r"\$\{\w+:\+([^}]*)\}", r"\1", match.group(1))  # ${V:+alt}
    options = shlex.split(re.sub(r"\$\{?\w+\}?", "1", options))
    args = _cli.build_parser().parse_args(["worker", *options, "--",
                                           match.group(2)])
    assert args.func.__name__ == "run_worker_command"
    assert "Expected" in path.read_text() and "Change:" in path.read_text()


def test_every_rank_times_the_same_number_of_calls():
    # Adaptive stopping (precision, budget) reads each rank's own clock: ranks
    # would then run different numbers of collectives and cross.
    from collectives.bench._stats import Stopping
    from collectives.bench._stats import median_interval
    from collectives.bench._stats import sample_adaptively
    from collectives.distributed import _bench

    args = _bench.parse(["-r", "3", "-b", "1M", "-e", "1M"])
    settings = _bench.sampling(args, 1 << 20)
    assert settings["samples"] == settings["max_samples"] == 3
    assert settings["budget"] == 0 and settings["iters"] == 8
    # without -r: the sweep's default rounds, still fixed
    default = _bench.sampling(_bench.parse([]), 1 << 20)
    assert default["samples"] == default["max_samples"] == 5
    # However wide a rank's intervals, and with a clock that never moves (an
    # adaptive budget would then sample to max_samples): 3 rounds.
    stopping = Stopping(precision=1e-9, budget=settings["budget"],
                        min_samples=settings["samples"],
                        max_samples=settings["max_samples"])
    noisy = iter(range(1, 1000))
    samples, _ = sample_adaptively(lambda: {"t": float(next(noisy))},
                                   lambda got: [median_interval(got["t"])],
                                   stopping, clock=lambda: 0.0)
    assert len(samples["t"]) == 3


PREEMPTED = textwrap.dedent("""
    import os, sys, time
    import jax
    from jax.experimental import multihost_utils
    with open(os.path.join(sys.argv[1], f"pid-{jax.process_index()}"), "w") as f:
        f.write(str(os.getpid()))
    step = 0
    while not multihost_utils.reached_preemption_sync_point(step):
        multihost_utils.sync_global_devices("step")
        step += 1
        time.sleep(0.01)
    print(f"rank {jax.process_index()}: checkpoint at step {step}", flush=True)
""")


@pytest.mark.multiprocess
def test_on_sigterm_jax_lets_every_rank_checkpoint_at_one_step(ranks, tmp_path):
    # What a training script that saves on preemption needs: SIGTERM to one
    # rank, and every rank reaches the same sync point, saves and exits 0.
    script = tmp_path / "preempted.py"
    script.write_text(PREEMPTED)
    port = _free_port()
    procs = [ranks.start(ompi_env(rank, 2, port), "--cpu-devices", "2",
                         "--on-sigterm", "jax", "--", "python", str(script),
                         str(tmp_path), rank=rank) for rank in range(2)]
    deadline = time.monotonic() + BOUND_SECONDS
    while not (tmp_path / "pid-1").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    os.kill(int((tmp_path / "pid-1").read_text()), signal.SIGTERM)
    (code0, out0), (code1, out1) = [ranks.wait(proc, 60) for proc in procs]
    assert (code0, code1) == (0, 0), out0 + out1
    steps = [re.search(r"rank \d: checkpoint at step (\d+)", out).group(1)
             for out in (out0, out1)]
    assert steps[0] == steps[1], out0 + out1
