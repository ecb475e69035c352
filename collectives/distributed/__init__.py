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
* :func:`place`, :func:`process_slice`, :func:`gather` and
  :func:`process_forms` run a recipe's forms on process-local data (any
  sharding) and bring results to every process.
"""

from __future__ import annotations

import os

import jax

from collectives import _compat
from collectives.distributed import _cluster
from collectives.distributed import _worker
from collectives.distributed._cluster import ClusterError
from collectives.distributed._forms import gather
from collectives.distributed._forms import place
from collectives.distributed._forms import process_forms
from collectives.distributed._forms import process_slice
from collectives.distributed._launcher import launch
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
    "place",
    "process_forms",
    "process_slice",
]


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
