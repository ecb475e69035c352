"""Multi-process runs on JAX's distributed runtime, simulated on one machine.

When one process is not enough, JAX runs one process per host, joined by
``jax.distributed.initialize``; a mesh then spans the devices of every process
and the same collectives cross process boundaries. On CPU, several processes
on one machine (gloo collectives over 127.0.0.1) stand in for several hosts.

* :func:`launch` starts N processes with M simulated CPU devices each and runs
  ``check``, ``run NAME`` or a Python script in every one of them, stopping
  them all if one fails (``python -m collectives launch -n 2
  --devices-per-process 4 -- check``).
* :func:`initialize` joins a process to the runtime: the launcher's settings
  if it was started by :func:`launch`, else JAX's cluster auto-detection
  (SLURM, Open MPI, Kubernetes, Cloud TPU); cluster variables without a
  cluster to join raise :class:`ClusterError` instead of running alone.
* ``python -m collectives worker -- check`` (also ``run``, ``bench``,
  ``python SCRIPT``) runs in each rank a cluster starts (``srun``,
  ``mpirun``, a Kubernetes Indexed Job); see ``examples/cluster/``.
* :func:`process_slice`, :func:`gather` and :func:`process_forms` run a
  recipe's forms on process-local data and bring results to every process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from collections.abc import Sequence
from typing import IO

from collectives.distributed import _cluster
from collectives.distributed import _launcher
from collectives.distributed import _worker
from collectives.distributed._cluster import ClusterError
from collectives.distributed._forms import gather
from collectives.distributed._forms import process_forms
from collectives.distributed._forms import process_slice
from collectives.distributed._results import LaunchError
from collectives.distributed._results import LaunchResult
from collectives.distributed._results import ProcessResult

__all__ = [
    "ClusterError",
    "LaunchError",
    "LaunchResult",
    "ProcessResult",
    "gather",
    "initialize",
    "launch",
    "process_forms",
    "process_slice",
]


def launch(target: Sequence[str], *, num_processes: int = 2,
           devices_per_process: int = 4, port: int | None = None,
           timeout: float = 900.0, startup_timeout: float = 60.0,
           heartbeat_timeout: int = 30, collective_timeout: int = 120,
           env: Mapping[str, str] | None = None, cwd: str | None = None,
           echo: str = "first", stream: IO[str] | None = None) -> LaunchResult:
    """Run ``target`` in ``num_processes`` local processes joined by JAX.

    Each process simulates ``devices_per_process`` CPU devices, joins JAX's
    distributed runtime through a coordinator on 127.0.0.1 (gloo collectives,
    loopback only) and runs the target. If any process fails, the others are
    stopped at once: SIGTERM to each process group, SIGKILL after 2 s, so
    nothing they started outlives the launch.

    Args:
      target: what every process runs: ``["check", *names_and_options]``
        (every recipe vs the oracle on meshes spanning all processes),
        ``["run", name]``, or ``["python", script, *args]`` (also ``-m
        MODULE`` / ``-c CODE``; run with this interpreter after the process
        joined the runtime, so the script must not call
        ``jax.distributed.initialize()`` unguarded).
      num_processes: how many processes.
      devices_per_process: simulated CPU devices in each.
      port: the coordinator's port on 127.0.0.1; default a free one.
      timeout: seconds for the whole run before every process is stopped.
      startup_timeout: seconds for every process to start and connect.
      heartbeat_timeout: seconds without a heartbeat before JAX declares a
        process dead.
      collective_timeout: seconds a CPU collective waits for its peers
        (XLA flags; gloo's reduce-scatter keeps its own 30 s).
      env: extra environment variables for the workers.
      cwd: the workers' working directory (default: this one).
      echo: whose output to echo live, prefixed ``[pI]``: ``"first"``
        (process 0), ``"all"`` or ``"none"``. All output is kept either way.
      stream: where to echo (default ``sys.stdout``).

    Returns:
      A :class:`LaunchResult`: ``ok``, a message naming any failed process,
      and per process its status, exit code, summary and last output.

    Raises:
      ValueError: the target or an argument is invalid.
      LaunchError: the port is not free; nothing was started.

    Examples:
      >>> from collectives import distributed
      >>> result = distributed.launch(
      ...     ["python", "-c", "import jax; print(jax.device_count())"],
      ...     num_processes=2, devices_per_process=1, echo="none")
      >>> result.ok, [p.tail(1) for p in result.processes]
      (True, ['2', '2'])
    """
    return _launcher.launch(
        target, num_processes=num_processes, devices_per_process=devices_per_process,
        port=port, timeout=timeout, startup_timeout=startup_timeout,
        heartbeat_timeout=heartbeat_timeout, collective_timeout=collective_timeout,
        env=env, cwd=cwd, echo=echo, stream=stream)


def initialize(*, startup_timeout: int = 300, heartbeat_timeout: int = 100
               ) -> bool:
    """Join this process to JAX's distributed runtime, once; never run alone by
    mistake.

    Under :func:`launch` the launcher's settings are used (127.0.0.1, bounded
    timeouts, its device count); elsewhere the cluster is detected as
    ``jax.distributed.initialize()`` does it (SLURM, Open MPI, Kubernetes,
    Cloud TPU). If cluster variables say this process is one of several but
    no cluster JAX can join is found (Open MPI 5 before JAX 0.11.2, a SLURM
    allocation without ``srun``...), that is an error, not a single-process
    run. Call it first, before any other JAX operation.

    Args:
      startup_timeout: seconds to wait for every process to join; then the
        process ends with a message naming the missing ranks and the cluster
        variables (exit code 3).
      heartbeat_timeout: seconds without a heartbeat before JAX declares a
        process dead.

    Returns:
      ``True`` if this call joined the process to the runtime; ``False`` if it
      was joined already, or if there is no launcher and no cluster (a single
      process).

    Raises:
      RuntimeError: JAX already started its backends in this process.
      ClusterError: cluster variables are set but no cluster can be joined;
        the message names the variables and the fix.

    Examples:
      Here JAX has already run (as in any test), so it is too late, and says so:

      >>> import jax
      >>> from collectives import distributed
      >>> _ = jax.devices()
      >>> distributed.initialize()
      Traceback (most recent call last):
      ...
      RuntimeError: distributed.initialize() came too late: ...
    """
    import jax

    from collectives import _compat

    if jax.distributed.is_initialized():
        return False
    if _compat.backends_initialized():
        raise RuntimeError(
            "distributed.initialize() came too late: JAX's backends already "
            "started in this process, so it can no longer join other processes. "
            "Fix: call it right after the imports, before any JAX operation "
            "(jax.devices() and jax.device_put count).")
    settings = _worker.WorkerEnv.from_env(os.environ)
    if settings is not None:
        _worker.join(settings)
        return True
    target = _cluster.plan(timeout=startup_timeout)
    if target is None:
        return False  # no launcher, no cluster variables: a single process
    _cluster.join(target, startup_timeout=startup_timeout,
                  heartbeat_timeout=heartbeat_timeout,
                  shutdown_timeout=max(10, heartbeat_timeout))
    return True
