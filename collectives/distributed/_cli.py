"""``python -m collectives launch`` and ``worker``: the options, and running them."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from collectives import _args
from collectives.distributed import _cluster
from collectives.distributed import _launcher
from collectives.distributed import _worker
from collectives.distributed._results import LaunchError
from collectives.distributed._results import worker_argv

_SECONDS = _args.whole("a whole number of seconds, 1 or more", low=1)
_PORT = _args.whole("a port from 1 to 65535", low=1, high=65535)


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m collectives launch``."""
    parser.add_argument("-n", "--num-processes", type=_args.at_least_one, default=2,
                        metavar="N",
                        help="processes to start (default: %(default)s)")
    parser.add_argument("--devices-per-process", type=_args.devices, default=4,
                        metavar="M",
                        help="simulated CPU devices per process (default: "
                             "%(default)s)")
    parser.add_argument("--port", type=_PORT,
                        help="coordinator port on 127.0.0.1 (default: a free one)")
    add_timeout_arguments(parser, "stop every process")
    parser.add_argument("--echo", choices=("first", "all", "none"), default="first",
                        help="whose output to show live (default: %(default)s)")
    parser.add_argument("target", nargs=argparse.REMAINDER,
                        help="after --: check [NAMES] [--dtype ...] [--exact], "
                             "run NAME, bench [...], or python SCRIPT.py [ARGS]")


def add_timeout_arguments(parser: argparse.ArgumentParser, stop: str) -> None:
    """The bounds on every wait, one definition for ``launch`` and ``worker``;
    ``stop`` says what ``--timeout`` ends. The defaults are
    :class:`WorkerOptions`'s (and :func:`collectives.distributed.launch`'s)."""
    defaults = _worker.WorkerOptions()
    parser.add_argument("--startup-timeout", type=_SECONDS,
                        default=defaults.startup_timeout, metavar="S",
                        help="seconds for every process to join (default: "
                             "%(default)s)")
    parser.add_argument("--heartbeat-timeout", type=_SECONDS,
                        default=defaults.heartbeat_timeout, metavar="S",
                        help="seconds without a heartbeat before a process "
                             "counts as dead (default: %(default)s)")
    parser.add_argument("--collective-timeout", type=_SECONDS,
                        default=defaults.collective_timeout, metavar="S",
                        help="seconds a CPU collective waits for its peers "
                             "(default: %(default)s)")
    parser.add_argument("--stall-timeout", type=_args.real(
                            "a number of seconds, 0 or more (0: no bound)", low=0),
                        default=defaults.stall_timeout, metavar="S",
                        help="seconds a process may sit idle outside JAX while "
                             "another waits for it inside a JAX call, before the "
                             "job stops naming it; 0: no bound (default: "
                             "%(default)g)")
    parser.add_argument("--timeout", type=_args.real("a positive number of seconds",
                                                     above=0),
                        default=defaults.timeout, metavar="S",
                        help=f"{stop} after S seconds in which no process made "
                             "progress (used CPU or moved on): a bound on "
                             "silence, not on the whole run (default: "
                             "%(default)g)")


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_launch_command(args: argparse.Namespace) -> int:
    """Run ``python -m collectives launch`` from parsed arguments; the exit code."""
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        result = _launcher.launch(
            args.target, num_processes=args.num_processes,
            devices_per_process=args.devices_per_process, port=args.port,
            timeout=args.timeout, startup_timeout=args.startup_timeout,
            heartbeat_timeout=args.heartbeat_timeout,
            collective_timeout=args.collective_timeout,
            stall_timeout=args.stall_timeout, echo=args.echo)
    except (ValueError, LaunchError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(result.report(), file=sys.stdout if result.ok else sys.stderr)
    return result.returncode


def add_worker_command(sub: Any) -> None:
    """Register ``python -m collectives worker`` on the CLI's subparsers."""
    p = sub.add_parser(
        "worker", help="run check, bench, a recipe or a script in one rank that a "
                       "cluster started (srun, mpirun, a Kubernetes Job)",
        description="Join the ranks of a cluster job the way "
                    "jax.distributed.initialize() detects them (SLURM, Open MPI, "
                    "Kubernetes), or fail naming the cluster variables; run the "
                    "target; rank 0 prints one table; every rank exits non-zero "
                    "if any rank failed. e.g. srun python -m collectives worker -- "
                    "check")
    p.add_argument("--cpu-devices", type=_args.devices, metavar="M",
                   help="simulate M CPU devices in this rank (CPU-only runs; "
                        "leave out on GPU and TPU hosts)")
    p.add_argument("--log-dir", metavar="DIR",
                   help="also write each rank's output to DIR/rank-<i>.log")
    add_timeout_arguments(p, "stop this rank")
    p.add_argument("--coordinator", metavar="HOST:PORT", type=_args.coordinator,
                   help="rank 0's address, when no cluster is detected (with "
                        "--num-processes and --process-id)")
    p.add_argument("--num-processes", type=_args.at_least_one, metavar="N")
    p.add_argument("--process-id", metavar="I",
                   type=_args.whole("a rank of 0 or more", low=0))
    p.add_argument("--on-sigterm", choices=("stop", "jax"), default="stop",
                   help="stop: end the rank at once on SIGTERM, naming the "
                        "signal (default); jax: leave SIGTERM to JAX's "
                        "preemption notifier, for a script that checkpoints at "
                        "multihost_utils.reached_preemption_sync_point(step)")
    p.add_argument("target", nargs=argparse.REMAINDER,
                   help="after --: check [NAMES] [...], run NAME, bench [...], or "
                        "python SCRIPT.py [ARGS]")
    p.set_defaults(func=run_worker_command)


def run_worker_command(args: argparse.Namespace) -> int:
    """Run ``python -m collectives worker`` from parsed arguments; the exit code."""
    try:
        target = worker_argv(args.target)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    missing = _cluster.missing_options(args.coordinator, args.num_processes,
                                       args.process_id)
    if missing:  # a usage error: refused as parsed
        raise _args.Refused(missing)
    if args.process_id is not None and not args.process_id < args.num_processes:
        raise _args.Refused(
            f"--process-id {args.process_id}: expected a rank from 0 to "
            f"{args.num_processes - 1} (--num-processes {args.num_processes}). "
            "Fix: number the ranks 0 to N-1.")
    options = _worker.WorkerOptions(
        cpu_devices=args.cpu_devices, log_dir=args.log_dir,
        startup_timeout=args.startup_timeout,
        heartbeat_timeout=args.heartbeat_timeout,
        collective_timeout=args.collective_timeout, timeout=args.timeout,
        stall_timeout=args.stall_timeout, coordinator=args.coordinator,
        num_processes=args.num_processes, process_id=args.process_id,
        on_sigterm=args.on_sigterm)
    return _worker.main(target, options)
