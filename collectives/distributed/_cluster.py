"""Join the processes a cluster started (SLURM, Open MPI, Kubernetes), or fail.

A cluster starts one process per host (or per accelerator) and leaves its
facts in environment variables; ``jax.distributed.initialize()`` reads them.
This module does the same search first (:func:`collectives._compat.
detect_cluster`), so that it can say what it is about to do, bound every
wait, and turn each way of failing into an error that names the variables it
saw and the likely fix:

* cluster variables are present but JAX finds no cluster it can join (Open
  MPI 5 on JAX < 0.11.2, a SLURM allocation without ``srun``...): an error,
  never a quiet single-process run;
* a rank waits for peers that never arrive: JAX would abort the process after
  its ``initialization_timeout``; a watchdog first prints which ranks were
  missing and exits with :data:`EXIT_NOT_JOINED`.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import threading
from collections.abc import Mapping

import jax

from collectives import _compat

EXIT_NOT_JOINED = 3
"""Exit code of a rank that could not join the other ranks in time."""

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")

CLUSTER_VARIABLES: tuple[str, ...] = (
    # SLURM (srun)
    "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
    "SLURM_LOCALID",
    # Open MPI: ORTE (< 5) and PRRTE (5)
    "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_VERSION",
    # other MPI launchers (MPICH, Intel MPI)
    "PMI_SIZE", "PMI_RANK",
    # Kubernetes Indexed Job / JobSet
    "JOB_COMPLETION_INDEX",
    # set by hand
    "JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT",
)
"""The variables reported when joining fails (those that are set)."""

_SIZE_VARIABLES = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_PRESENCE_VARIABLES = ("OMPI_MCA_orte_hnp_uri", "JOB_COMPLETION_INDEX",
                       "JAX_COORDINATOR_ADDRESS")


class ClusterError(RuntimeError):
    """This process was started by a cluster but cannot join the others."""


def cluster_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The cluster variables set in ``environ`` (default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in CLUSTER_VARIABLES if name in environ}


def expects_several_processes(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment says this process is one of several.

    True if a process count (``SLURM_NTASKS``, ``OMPI_COMM_WORLD_SIZE``,
    ``PMI_SIZE``) above 1 is set, or a variable only a multi-process launch
    sets (Open MPI's ``OMPI_MCA_orte_hnp_uri``, Kubernetes'
    ``JOB_COMPLETION_INDEX``, ``JAX_COORDINATOR_ADDRESS``).
    """
    environ = os.environ if environ is None else environ
    for name in _SIZE_VARIABLES:
        try:
            if int(environ.get(name, "1")) > 1:
                return True
        except ValueError:
            return True  # set, but not a number: worth an error, not a guess
    return any(name in environ for name in _PRESENCE_VARIABLES)


def describe(variables: Mapping[str, str]) -> str:
    """``NAME=value, ...`` or a note that none is set."""
    if not variables:
        return "no cluster variables are set"
    return ", ".join(f"{name}={value}" for name, value in variables.items())


_FIXES = (
    "Fix: under SLURM start the ranks with `srun` (one task per process: "
    "SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID and "
    "SLURM_LOCALID must all be set); under Open MPI 5 use JAX >= 0.11.2 with "
    "mpi4py installed (older JAX detects only Open MPI < 5, through "
    "OMPI_MCA_orte_hnp_uri); on Kubernetes install jax[k8s] or pass "
    "--coordinator HOST:PORT --num-processes N --process-id I (see "
    "examples/cluster/); anywhere, those three options name the job by hand.")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Whom to join, as found in the environment or given by hand.

    Attributes:
      source: ``"slurm"``, ``"ompi"``, ... (JAX's cluster name) or
        ``"options"`` when given by hand.
      coordinator: ``HOST:PORT`` of process 0's coordination service.
      num_processes: how many processes take part.
      process_id: this process's rank.
      local_device_ids: the accelerators this process uses (JAX's default
        under a cluster: the one of its local rank), or ``None`` for all.
      variables: the cluster variables seen, for messages.
    """

    source: str
    coordinator: str
    num_processes: int
    process_id: int
    local_device_ids: tuple[int, ...] | None
    variables: dict[str, str]

    @property
    def loopback(self) -> bool:
        """Whether every process runs on this machine (a loopback coordinator)."""
        return self.coordinator.rsplit(":", 1)[0] in LOOPBACK_HOSTS

    def watch_address(self) -> str:
        """Where rank 0 listens for the other ranks' watch connections: its
        own address as the coordinator's host name resolves (127.0.0.1 for a
        loopback coordinator)."""
        if self.loopback:
            return "127.0.0.1"
        host = self.coordinator.rsplit(":", 1)[0].strip("[]")
        try:
            return socket.gethostbyname(host)
        except OSError:
            return host

    def where(self) -> str:
        return (f"rank {self.process_id} of {self.num_processes} "
                f"({self.source}: {describe(self.variables)}), coordinator "
                f"{self.coordinator}")


def missing_options(coordinator: str | None, num_processes: int | None,
                    process_id: int | None) -> str | None:
    """Why options that name the job by hand are incomplete (some of the
    three given, not all), or ``None``."""
    given = {"--coordinator": coordinator, "--num-processes": num_processes,
             "--process-id": process_id}
    missing = [flag for flag, value in given.items() if value is None]
    if not 0 < len(missing) < len(given):
        return None
    return (f"{', '.join(missing)} missing: naming the job by hand needs "
            "--coordinator HOST:PORT, --num-processes N and --process-id I "
            "together (the same on every process but the id). Fix: give all "
            "three, or none where a launcher (srun, mpirun) names the job.")


def plan(*, coordinator: str | None = None, num_processes: int | None = None,
         process_id: int | None = None, timeout: int = 60) -> Plan | None:
    """Whom this process should join; ``None`` if it runs alone.

    Options given by hand win; otherwise JAX's cluster auto-detection decides.

    Raises:
      ClusterError: cluster variables say this is one of several processes,
        but no cluster JAX can join was found (or it cannot be read); or the
        options are incomplete.
    """
    seen = cluster_variables()
    missing = missing_options(coordinator, num_processes, process_id)
    if missing:
        raise ClusterError(missing)
    if coordinator is not None:  # all three given
        assert num_processes is not None and process_id is not None
        if not 0 <= process_id < num_processes:
            raise ClusterError(
                f"--process-id: expected 0 <= id < --num-processes "
                f"({num_processes}), got {process_id}.")
        return Plan("options", coordinator, num_processes, process_id, None, seen)
    try:
        found = _compat.detect_cluster(timeout)
    except (RuntimeError, KeyError, ValueError) as err:
        raise ClusterError(
            f"JAX recognised a cluster but could not read it ({err}); "
            f"{describe(seen)}. {_FIXES}") from err
    if found is None:
        if expects_several_processes():
            raise ClusterError(
                f"this process looks like one of several ({describe(seen)}), but "
                f"JAX {jax.__version__} detects no cluster it can join, so it "
                f"would run alone instead of with the others. {_FIXES}")
        return None
    return Plan(found.name, found.coordinator_address, found.num_processes,
                found.process_id, found.local_device_ids, seen)


def join(target: Plan, *, startup_timeout: int, heartbeat_timeout: int,
         shutdown_timeout: int, say: bool = True) -> None:
    """Join JAX's distributed runtime as ``target`` says, within bounds.

    On a loopback coordinator the coordinator and gloo listen on 127.0.0.1
    only; elsewhere JAX picks the addresses. A watchdog ends the process with
    :data:`EXIT_NOT_JOINED` and a message naming the missing ranks and the
    cluster variables if the others have not all arrived after
    ``startup_timeout`` seconds (JAX itself would abort a few seconds later
    with ``DEADLINE_EXCEEDED``).
    """
    if say:
        print(f"joining: {target.where()}; waiting up to {startup_timeout} s "
              "for every rank", flush=True)
    if target.loopback:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        _compat.use_loopback_gloo()
    _cache_off_if_it_hangs(target)
    joined = threading.Event()
    _start_watchdog(target, startup_timeout, joined)
    _compat.initialize_distributed(
        target.coordinator, target.num_processes, target.process_id,
        bind_address=target.coordinator if target.loopback else None,
        initialization_timeout=startup_timeout + 10,
        heartbeat_timeout=heartbeat_timeout, shutdown_timeout=shutdown_timeout,
        local_device_ids=target.local_device_ids)
    joined.set()


def _cache_off_if_it_hangs(target: Plan) -> None:
    """Turn JAX's persistent compilation cache off for a multi-process CPU job
    on the releases where a program read back from it hangs
    (:data:`collectives._compat.CACHED_PROGRAM_HANGS_ACROSS_PROCESSES`),
    saying so in one line."""
    cache = jax.config.jax_compilation_cache_dir
    on_cpu = target.loopback or jax.config.jax_platforms == "cpu"
    if not (_compat.CACHED_PROGRAM_HANGS_ACROSS_PROCESSES and cache and on_cpu
            and target.num_processes > 1 and jax.config.jax_enable_compilation_cache):
        return
    jax.config.update("jax_enable_compilation_cache", False)
    print(f"note: the persistent compilation cache ({cache}) is off for this job: "
          f"on JAX {jax.__version__} a multi-process CPU program that rank 0 "
          "reads back from it waits forever in its first collective.", flush=True)


def not_joined_message(target: Plan, seconds: float) -> str:
    """Why a rank gave up waiting: which ranks were missing, and the fix."""
    if target.process_id == 0:
        others = list(range(1, target.num_processes))
        missing = (f"rank(s) {others} did not all connect to this rank's "
                   f"coordinator at {target.coordinator}")
    else:
        missing = (f"rank 0 (the coordinator, {target.coordinator}) could not be "
                   "reached, or it is still waiting for other ranks")
    return (f"error: {target.where()} waited {seconds:g} s and gave up: {missing}. "
            f"Every rank of the job must start (here: {target.num_processes}) and "
            "reach the coordinator. Fix: check that all ranks were started (a "
            "lone rank of a multi-rank job waits for the rest), that the "
            "coordinator's host and port are reachable from every rank (set "
            "JAX_COORDINATOR_PORT to pick another port), or raise "
            "--startup-timeout.")


def _start_watchdog(target: Plan, seconds: int, joined: threading.Event) -> None:
    def watch() -> None:
        if joined.wait(seconds):
            return
        print(not_joined_message(target, seconds), file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_NOT_JOINED)

    threading.Thread(target=watch, name="join-watchdog", daemon=True).start()
