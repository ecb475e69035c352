"""One rank of a multi-process run: join JAX's runtime, run the target, report.

Two ways in, one code path after joining:

* under ``python -m collectives launch`` the launcher starts ``python -m
  collectives worker -- TARGET...`` once per process, with its settings in
  ``COLLECTIVES_*`` environment variables (:class:`WorkerEnv`); the worker
  simulates its CPU devices, joins on 127.0.0.1 and leaves marker files the
  launcher watches (``started-<i>``, ``ready-<i>``, ``result-<i>.json``);
* under a cluster (``srun``, ``mpirun``, a Kubernetes Job) the user starts
  ``python -m collectives worker -- TARGET...`` in every rank; the worker finds
  the job the way ``jax.distributed.initialize()`` does, or fails with the
  cluster variables it saw (:mod:`._cluster`), never running alone.

Then it runs ``check``, ``run``, ``bench`` or a Python script, shares its result
with every rank (:mod:`._ranks`), and rank 0 prints one table. Every rank
exits non-zero if any rank failed. A failing rank leaves at once
(``os._exit``), without JAX's shutdown barrier, which would wait for peers
that are stuck waiting for it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import runpy
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from collectives import _compat
from collectives._devices import use_cpu_devices
from collectives.distributed import _bench
from collectives.distributed import _check as _process_check
from collectives.distributed import _cluster
from collectives.distributed import _ranks
from collectives.distributed import _watch
from collectives.distributed._results import LOOPBACK

PREFIX = "COLLECTIVES_"
RESULT_WAIT = 3600.0
"""Seconds a rank that finished waits for the others' results (the peer
watch stops the job sooner where a rank died or stalled)."""


@dataclasses.dataclass(frozen=True)
class WorkerEnv:
    """What the launcher tells each worker, as environment variables.

    Attributes:
      coordinator: ``127.0.0.1:PORT`` of the coordination service.
      num_processes: how many processes take part.
      process_id: this process's index.
      devices_per_process: simulated CPU devices in each process.
      launch_dir: where the worker leaves its marker and result files.
      startup_timeout: seconds to wait for every process to connect.
      heartbeat_timeout: seconds without a heartbeat before a process counts
        as dead.
      shutdown_timeout: seconds the shutdown barrier waits (JAX 0.8.1+).
      launcher_pid: the launcher's pid; the worker ends itself (and its
        children) if the launcher goes away.
      stall_timeout: seconds a process may sit idle outside JAX while another
        waits for it inside a JAX call (0: no bound).
      timeout: seconds a process may make no progress at all.
    """

    coordinator: str
    num_processes: int
    process_id: int
    devices_per_process: int
    launch_dir: str
    startup_timeout: int
    heartbeat_timeout: int
    shutdown_timeout: int
    launcher_pid: int
    stall_timeout: int
    timeout: int

    def to_env(self) -> dict[str, str]:
        """The environment variables that carry these settings."""
        return {PREFIX + field.name.upper(): str(getattr(self, field.name))
                for field in dataclasses.fields(self)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WorkerEnv | None:
        """The settings from the environment; ``None`` outside a launch."""
        if PREFIX + "COORDINATOR" not in environ:
            return None
        values = {}
        for field in dataclasses.fields(cls):
            raw = environ.get(PREFIX + field.name.upper())
            if raw is None:
                raise RuntimeError(
                    f"environment variable {PREFIX + field.name.upper()} is missing, "
                    f"but {PREFIX}COORDINATOR is set. Fix: start workers with "
                    "`python -m collectives launch`, which sets all of them.")
            values[field.name] = raw if field.type == "str" else int(raw)
        return cls(**values)

    def marker(self, what: str) -> Path:
        """The path of this worker's marker file ``what``."""
        return Path(self.launch_dir) / f"{what}-{self.process_id}"

    def plan(self) -> _cluster.Plan:
        """Whom to join: the launcher's processes on 127.0.0.1."""
        return _cluster.Plan("launch", self.coordinator, self.num_processes,
                             self.process_id, None, {})


def join(settings: WorkerEnv) -> None:
    """Simulate the devices and join the distributed runtime (127.0.0.1 only)."""
    use_cpu_devices(settings.devices_per_process)
    # The launcher watches start-up itself and reports first; the watchdog
    # here is the backstop.
    _cluster.join(settings.plan(), startup_timeout=settings.startup_timeout + 5,
                  heartbeat_timeout=settings.heartbeat_timeout,
                  shutdown_timeout=settings.shutdown_timeout, say=False)


def _watch_launcher(launcher_pid: int) -> None:
    """End this worker's process group if the launcher goes away."""

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != launcher_pid:
                if os.getpgrp() == os.getpid():
                    os.killpg(os.getpgrp(), signal.SIGKILL)
                os._exit(70)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


_DOUBLE_INIT_HINT = (
    "The launcher already joined this process to JAX's distributed runtime. "
    "Fix: guard the call, `if not jax.distributed.is_initialized(): "
    "jax.distributed.initialize()`, so the script runs under any launcher.")


def _second_initialize(err: BaseException) -> bool:
    """Whether ``err`` came from a script calling jax.distributed.initialize()
    although the launcher had joined the runtime already."""
    tb = err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if (code.co_name == "initialize"
                and code.co_filename.replace(os.sep, "/").endswith(
                    "jax/_src/distributed.py")):
            return True
        tb = tb.tb_next
    return False


def _run_python(argv: Sequence[str]) -> tuple[int, str]:
    """Run ``python SCRIPT ARGS``, ``python -m MODULE ARGS`` or ``python -c CODE``."""
    argv = list(argv)
    if not argv:
        raise ValueError("python: expected a script, -m MODULE or -c CODE, got "
                         "nothing. Fix: e.g. `-- python my_script.py`.")
    if argv[0] == "-m" and len(argv) > 1:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c" and len(argv) > 1:
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    elif argv[0].startswith("-"):
        raise ValueError(
            f"python: option {argv[0]!r} is not supported under the launcher (only "
            "a script, -m MODULE or -c CODE; output is already unbuffered).")
    else:
        script = os.path.abspath(argv[0])
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")
    return 0, "script finished"


def _dispatch(argv: Sequence[str]) -> tuple[int, str]:
    target, rest = argv[0], argv[1:]
    if target == "check":
        return _process_check.cmd_check(rest)
    if target == "run":
        return _process_check.cmd_run(rest)
    if target == "python":
        return _run_python(rest)
    if target == "bench":
        return _bench.cmd_bench(rest)
    raise ValueError(f"unknown target {target!r}: expected check, run, bench or "
                     "python.")


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """How a worker started by a cluster joins and runs (``worker`` options).

    Attributes:
      cpu_devices: simulate this many CPU devices (CPU-only runs, such as
        tests on one machine); ``None`` leaves the devices to JAX (GPUs and
        TPUs are found by themselves).
      log_dir: also write this rank's output to ``DIR/rank-<i>.log``.
      startup_timeout: seconds to wait for every rank to join.
      heartbeat_timeout: seconds without a heartbeat before JAX declares a
        rank dead (and ends the others).
      collective_timeout: seconds a CPU collective waits for its peers.
      timeout: seconds this rank may make no progress at all (no CPU used,
        the program where it was), after which it stops; a bound on silence,
        not on the whole run.
      stall_timeout: seconds a rank may sit idle outside JAX while another
        rank waits for it inside a JAX call before the job stops naming it
        (0: no bound).
      coordinator: ``HOST:PORT`` of rank 0, when no cluster is detected.
      num_processes: the number of ranks, with ``coordinator``.
      process_id: this rank, with ``coordinator``.
      on_sigterm: ``"stop"`` ends the rank at once on SIGTERM, naming the
        signal; ``"jax"`` leaves SIGTERM to JAX's preemption notifier, for a
        script that checkpoints at
        ``multihost_utils.reached_preemption_sync_point(step)`` and exits.
    """

    cpu_devices: int | None = None
    log_dir: str | None = None
    startup_timeout: int = 60
    heartbeat_timeout: int = 30
    collective_timeout: int = 120
    timeout: float = 900.0
    stall_timeout: float = _watch.STALL_SECONDS
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    on_sigterm: str = "stop"


class _Tee:
    """A text stream that writes to two streams (the console and a log file)."""

    def __init__(self, first: Any, second: Any):
        self._streams = (first, second)

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._streams[0], name)


def _log_to(log_dir: str | None, rank: int, console: bool) -> None:
    """Write this rank's output to ``log_dir``/rank-<rank>.log too, where
    given; with ``console`` False, its standard output goes only there (its
    errors still reach the console)."""
    log: Any = open(os.devnull, "w")  # noqa: SIM115 (open for the process)
    if log_dir:
        path = Path(log_dir) / f"rank-{rank}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        log = open(path, "w", buffering=1)  # noqa: SIM115 (open for the process)
        sys.stderr = _Tee(sys.stderr, log)
    sys.stdout = _Tee(sys.stdout, log) if console else log


TABLE_TARGETS = ("check", "run", "bench")
"""Targets whose table rank 0 alone prints under a cluster launcher: every
rank runs every row, and each rank's result is in rank 0's closing table."""


def _run_target(argv: Sequence[str]) -> tuple[int, str, str]:
    """Run the target; (exit code, summary, error), never raising."""
    try:
        code, summary = _dispatch(argv)
        return code, summary, ""
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None
                                                             else 1)
        if stop.code not in (None, 0) and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        return code, f"SystemExit({code})", ""
    except BaseException as err:  # reported, then the worker leaves at once
        if _second_initialize(err):
            err.add_note(_DOUBLE_INIT_HINT)
        traceback.print_exc()
        return 1, "raised", f"{type(err).__name__}: {err}"


def _run_and_report(argv: Sequence[str], rank: int, num_processes: int,
                    settings: WorkerEnv | None, wait: float,
                    watch: _watch.PeerWatch | None = None) -> int:
    """Run the target, share the result with every rank; the exit code."""
    start = time.time()
    code, summary, error = _run_target(argv)
    ended = time.time()
    if watch is not None:
        watch.in_target = False
    mine = _ranks.RankResult(rank=rank, code=code, summary=summary, error=error,
                             seconds=ended - start, host=socket.gethostname())
    if settings is not None:
        record = {"ok": code == 0, "code": code, "summary": summary,
                  "error": error, "time": ended}
        settings.marker("result").with_suffix(".json").write_text(
            json.dumps(record))
    if code != 0:
        if watch is not None:
            watch.let_a_lost_peer_speak_first()
        _ranks.publish("result", rank, dataclasses.asdict(mine))
        if watch is not None:
            watch.end(code)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no shutdown barrier: the peers may be stuck on us
    results = _ranks.share_result(mine, num_processes, wait)
    if rank == 0 and num_processes > 1 and settings is None:
        print(_ranks.table(results, wait), flush=True)  # (launch prints its own)
    passed = all(r.status == "ok" for r in results)
    if watch is not None:
        watch.end(0 if passed else 1)
    if not passed:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # a peer failed: it will not reach the shutdown barrier
    return 0


def main(argv: Sequence[str] | None = None,
         options: WorkerOptions | None = None) -> int:
    """Worker entry point; ``argv`` is the target, e.g. ``["check", "psum"]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    settings = WorkerEnv.from_env(os.environ)
    if not argv:
        print("error: worker: nothing to run. Fix: give a target after `--`, e.g. "
              "`python -m collectives worker -- check`.", file=sys.stderr)
        return 2
    if settings is not None:
        _watch_launcher(settings.launcher_pid)
        settings.marker("started").touch()
        join(settings)

        def blame(rank: int, how: str) -> None:  # the launcher's evidence
            settings.marker("blame").with_suffix(".json").write_text(
                json.dumps({"rank": rank, "how": how}))
        watch = _watch.PeerWatch(
            settings.process_id, settings.num_processes, LOOPBACK,
            settings.startup_timeout, stall=settings.stall_timeout,
            progress=settings.timeout, on_stop=blame)
        watch.start()
        _watch.stop_on_signals(settings.process_id, time.monotonic(),
                               before_exit=watch.signalled)
        settings.marker("ready").touch()
        return _run_and_report(argv, settings.process_id, settings.num_processes,
                               settings, wait=RESULT_WAIT, watch=watch)
    return _main_in_cluster(argv, options or WorkerOptions())


def _main_in_cluster(argv: Sequence[str], options: WorkerOptions) -> int:
    if options.cpu_devices is not None:
        _simulate_cpu_devices(options.cpu_devices, options.collective_timeout)
    try:
        target = _cluster.plan(coordinator=options.coordinator,
                               num_processes=options.num_processes,
                               process_id=options.process_id,
                               timeout=options.startup_timeout)
    except _cluster.ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return _cluster.EXIT_NOT_JOINED
    if target is None:
        print("error: worker: no cluster found (no launcher, and "
              f"{_cluster.describe(_cluster.cluster_variables())}). `worker` runs "
              "inside each rank a cluster starts (srun, mpirun, a Kubernetes Job). "
              "Fix: on one machine use `python -m collectives launch -n 2 -- ...`; "
              "elsewhere name the job with --coordinator HOST:PORT --num-processes "
              "N --process-id I.", file=sys.stderr)
        return 2
    quiet = target.process_id != 0 and argv[0] in TABLE_TARGETS
    if options.log_dir or quiet:
        _log_to(options.log_dir, target.process_id, console=not quiet)
    _cluster.join(target, startup_timeout=options.startup_timeout,
                  heartbeat_timeout=options.heartbeat_timeout,
                  shutdown_timeout=max(10, options.heartbeat_timeout))
    watch = _watch.PeerWatch(target.process_id, target.num_processes,
                             target.watch_address(), options.startup_timeout,
                             stall=options.stall_timeout, progress=options.timeout)
    watch.start()
    _watch.stop_on_signals(
        target.process_id, time.monotonic(), before_exit=watch.signalled,
        signals=_watch.STOP_SIGNALS if options.on_sigterm == "stop"
        else (signal.SIGINT,))
    return _run_and_report(argv, target.process_id, target.num_processes, None,
                           wait=RESULT_WAIT, watch=watch)


def _simulate_cpu_devices(n: int, collective_timeout: int) -> None:
    """CPU only, ``n`` simulated devices, collectives bounded in time."""
    jax.config.update("jax_platforms", "cpu")
    use_cpu_devices(n)
    flags = _compat.cpu_collective_timeout_flags(collective_timeout)
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), *flags]).strip()
