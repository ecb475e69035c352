"""``python -m collectives launch``: the options, and running them."""

from __future__ import annotations

import argparse
import signal
import sys

from collectives.distributed import _launcher
from collectives.distributed._results import LaunchError


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m collectives launch``."""
    parser.add_argument("-n", "--num-processes", type=int, default=2, metavar="N",
                        help="processes to start (default: %(default)s)")
    parser.add_argument("--devices-per-process", type=int, default=4, metavar="M",
                        help="simulated CPU devices per process (default: "
                             "%(default)s)")
    parser.add_argument("--port", type=int,
                        help="coordinator port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--timeout", type=float, default=900.0, metavar="S",
                        help="stop everything after S seconds (default: "
                             "%(default)g)")
    parser.add_argument("--startup-timeout", type=float, default=60.0, metavar="S",
                        help="seconds for all processes to connect (default: "
                             "%(default)g)")
    parser.add_argument("--collective-timeout", type=int, default=120, metavar="S",
                        help="seconds a collective waits for its peers (default: "
                             "%(default)s)")
    parser.add_argument("--echo", choices=("first", "all", "none"), default="first",
                        help="whose output to show live (default: %(default)s)")
    parser.add_argument("target", nargs=argparse.REMAINDER,
                        help="after --: check [NAMES] [--dtype ...] [--exact], "
                             "run NAME, or python SCRIPT.py [ARGS]")


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
            collective_timeout=args.collective_timeout, echo=args.echo)
    except (ValueError, LaunchError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(result.report(), file=sys.stdout if result.ok else sys.stderr)
    return result.returncode
