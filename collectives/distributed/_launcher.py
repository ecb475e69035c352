"""The launcher: start N worker processes on 127.0.0.1, watch them, report.

Every worker runs in its own process group, so stopping it also stops
anything it started. The launcher

* picks a free loopback port for JAX's coordination service (or checks the
  one it is given) and retries once if another program takes it first;
* waits a bounded time for every worker to join the runtime;
* stops all workers as soon as one fails (raises, exits non-zero, is killed,
  or its peers stop because of it: stopped, stuck outside JAX) or none has
  made progress for the time limit: SIGTERM to each process group, then
  SIGKILL after a short grace period;
* names the process that failed first, from the peers' evidence (the
  workers watch each other, ``_watch``) and then the order of the exits;
* reports each process: status, exit code, time, a summary and its last
  output.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from collectives import _args
from collectives import _compat
from collectives import _interrupt
from collectives.distributed import _watch
from collectives.distributed._results import LOOPBACK
from collectives.distributed._results import LaunchResult
from collectives.distributed._results import ProcessResult
from collectives.distributed._results import check_port
from collectives.distributed._results import free_port
from collectives.distributed._results import worker_argv
from collectives.distributed._worker import WorkerEnv

GRACE_SECONDS = 2.0
SETTLE_SECONDS = 1.0
OUTPUT_LINES = 400
_POLL = 0.05
_NOISE = re.compile(r"\[Gloo\] Rank|is connected to \d+ peer ranks")
_BIND_FAILED = "Failed to add port to server"  # the coordinator's port was taken
_PEER_DIED = "distributed service detected fatal errors"  # JAX ends a process


class _Worker:
    """One started worker: its process, its output and its markers."""

    def __init__(self, index: int, proc: subprocess.Popen, settings: WorkerEnv,
                 echo: IO[str] | None, lock: threading.Lock):
        self.index = index
        self.proc = proc
        self.settings = settings
        self.lines: collections.deque[str] = collections.deque(maxlen=OUTPUT_LINES)
        self.ended: float | None = None
        self.stopped = False
        self._echo = echo
        self._lock = lock
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"launch-output-{index}")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if _NOISE.search(line):
                continue  # gloo's connection chatter
            self.lines.append(line)
            if self._echo is not None:
                with self._lock:
                    self._echo.write(f"[p{self.index}] {line}\n")
                    self._echo.flush()

    def has(self, marker: str) -> bool:
        return self.settings.marker(marker).exists()

    def failed(self) -> bool:
        """Whether it ended by itself with an error (or before joining)."""
        code = self.proc.poll()
        return not self.stopped and code is not None and (
            code != 0 or not self.has("ready"))

    def failure_order(self) -> tuple[int, float]:
        """Sort key: who failed first. A process that died without reporting
        (killed, crashed) comes first, since the peers of a dead process report
        errors of their own a moment later; then reported errors by time; last
        processes JAX ended because another one died."""
        record = self.result()
        if record.get("code") == 0 or self.blame() is not None:
            return (3, self.ended or 0.0)  # its target passed, or a peer stopped it
        if record.get("time") is not None:
            return (1, float(record["time"]))
        if any(_PEER_DIED in line for line in self.lines):
            return (2, self.ended or 0.0)
        return (0, self.ended or 0.0)

    def blame(self) -> tuple[int, str] | None:
        """(the rank this one stopped because of, what that rank did), from
        the peer watch; ``None`` if it did not stop because of a peer."""
        record = self._record("blame")
        try:
            return int(record["rank"]), str(record["how"])
        except (KeyError, TypeError, ValueError):
            return None

    def result(self) -> dict:
        return self._record("result")

    def _record(self, what: str) -> dict:
        """The JSON file ``what`` this worker left; ``{}`` if none (yet)."""
        path = self.settings.marker(what).with_suffix(".json")
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def output(self) -> str:
        """What it printed so far; all of it once it has ended."""
        self._drain()
        return "\n".join(self.lines)

    def _drain(self) -> None:
        # Once the process has ended, its pipe ends too when the reader has
        # read it all, which on a loaded machine takes more than a moment (a
        # fixed 2 s wait lost the last lines); a still-open pipe (a child that
        # outlived it) is not waited for past READ_GRACE.
        if self.proc.poll() is not None:
            self._reader.join(timeout=READ_GRACE)

    def close(self) -> None:
        """Collect the rest of the output and close the pipe."""
        self._drain()
        if self.proc.stdout is not None and not self._reader.is_alive():
            self.proc.stdout.close()


def _cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` used so far (Linux's /proc); 0 where
    unknown, so that elsewhere ``--timeout`` bounds the whole run."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


BACKSTOP_SECONDS = 10.0
"""The launcher stops every process this long after ``timeout`` without
progress, should the processes not have stopped themselves."""

READ_GRACE = 10.0
"""Seconds to wait, after a process ended, for the rest of its output."""


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == 128 + signal.SIGTERM or code == 128 + signal.SIGINT:
        # the worker's own handler: it says which signal, and stops at once
        return f"was stopped by {signal.Signals(code - 128).name} (exit {code})"
    return f"exited with code {code}"


class _Launch:
    """One attempt: start the workers, watch them, stop them, report."""

    def __init__(self, argv: list[str], *, num_processes: int,
                 devices_per_process: int, port: int, timeout: float,
                 startup_timeout: float, heartbeat_timeout: int,
                 collective_timeout: int, stall_timeout: float,
                 env: Mapping[str, str] | None,
                 cwd: str | None, echo: str, stream: IO[str]):
        self.argv = argv
        self.n = num_processes
        self.m = devices_per_process
        self.coordinator = f"{LOOPBACK}:{port}"
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.collective_timeout = collective_timeout
        self.stall_timeout = stall_timeout
        self.extra_env = dict(env or {})
        self.cwd = cwd
        self.echo = echo
        self.stream = stream
        self.workers: list[_Worker] = []
        self.bind_failed = False

    def _env(self, settings: WorkerEnv) -> dict[str, str]:
        env = {**os.environ, **self.extra_env, **settings.to_env()}
        package_root = str(Path(__file__).resolve().parent.parent)
        paths = [package_root, *env.get("PYTHONPATH", "").split(os.pathsep)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
        env["PYTHONUNBUFFERED"] = "1"
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_NUM_CPU_DEVICES"] = str(self.m)
        flags = _compat.cpu_collective_timeout_flags(self.collective_timeout)
        env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), *flags]).strip()
        return env

    def start(self, launch_dir: str) -> None:
        lock = threading.Lock()
        for index in range(self.n):
            settings = WorkerEnv(
                coordinator=self.coordinator, num_processes=self.n,
                process_id=index, devices_per_process=self.m, launch_dir=launch_dir,
                startup_timeout=max(1, int(self.startup_timeout)),
                heartbeat_timeout=self.heartbeat_timeout,
                shutdown_timeout=max(10, self.heartbeat_timeout),
                launcher_pid=os.getpid(), stall_timeout=math.ceil(self.stall_timeout),
                timeout=math.ceil(self.timeout))
            proc = subprocess.Popen(
                [sys.executable, "-m", "collectives", "worker", "--", *self.argv],
                env=self._env(settings), cwd=self.cwd, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                errors="replace", bufsize=1, start_new_session=True)
            echo = (self.stream if self.echo == "all"
                    or (self.echo == "first" and index == 0) else None)
            self.workers.append(_Worker(index, proc, settings, echo, lock))

    def watch(self) -> tuple[str, _Worker | None, str]:
        """Wait for the end; returns (kind, culprit, message)."""
        start = time.monotonic()
        progress = (start, 0.0)  # (when CPU was last used, the CPU seconds then)
        while True:
            time.sleep(_POLL)
            self._note_exits(start)
            if any(w.failed() for w in self.workers):
                # Peers of a failed process often fail a moment later (their
                # collective lost its partner): let them, then blame the first.
                settle = time.monotonic() + SETTLE_SECONDS
                while (time.monotonic() < settle
                       and any(w.proc.poll() is None for w in self.workers)):
                    time.sleep(_POLL)
                    self._note_exits(start)
                return "failed", *self._culprit()
            if all(w.proc.poll() is not None for w in self.workers):
                return "ok", None, (f"ok: {self.n} processes x {self.m} devices "
                                    "finished")
            elapsed = time.monotonic() - start
            waiting = [w for w in self.workers if not w.has("ready")]
            if waiting and elapsed > self.startup_timeout:
                silent = [w for w in waiting if not w.has("started")]
                return "startup", (silent or waiting)[0], self._startup_failure(
                    waiting)
            cpu = sum(_cpu_seconds(w.proc.pid) for w in self.workers)
            if cpu - progress[1] >= _watch.IDLE_CPU * (time.monotonic() - progress[0]):
                progress = (time.monotonic(), cpu)
            # (the workers stop themselves after --timeout without progress,
            # naming where each sat; this is the backstop for a process that
            # cannot: frozen, or without the peer watch)
            if time.monotonic() - progress[0] > self.timeout + BACKSTOP_SECONDS:
                running = [w.index for w in self.workers if w.proc.poll() is None]
                return "timeout", None, (
                    f"launch stopped: no process made progress (used CPU) for "
                    f"{self.timeout:g} s, with processes {running} still running; "
                    "stopped them. Fix: look for a process that skipped a "
                    "collective the others entered, or raise --timeout.")

    def _culprit(self) -> tuple[_Worker, str]:
        """Who failed first, and how: the peers' evidence first (the rank
        they stopped because of, which may still be running: stopped or
        stuck), then the order of the exits."""
        blames = {w.index: w.blame() for w in self.workers}
        every = [blame[1] for blame in blames.values()
                 if blame is not None and blame[0] == _watch.EVERY_RANK]
        if every:  # no one rank: the verdict names each
            return self.workers[0], (f"launch failed: {every[0]}; the launcher "
                                     "stopped them all.")
        named = collections.Counter(
            blame for i, blame in blames.items()
            if blame is not None and 0 <= blame[0] < self.n and blame[0] != i)
        if named:
            (index, how), _ = named.most_common(1)[0]
            culprit = self.workers[index]
            if culprit.failed() and blames[index] is None:
                return culprit, self._failure(culprit)  # its own exit says how
            if blames[index] is not None and blames[index][0] == index:
                # The verdict on it that reached it (idle, stopped) beats a
                # peer's guess from seeing it end first ("ended without
                # reporting a result"), which wins a race under load.
                how = blames[index][1]
            others = [i for i, blame in blames.items()
                      if i != index and blame is not None and blame[0] == index]
            return culprit, (
                f"launch failed: process {index} (pid {culprit.proc.pid}) {how}; "
                f"process(es) {others} stopped because of it; the launcher "
                "stopped the rest.")
        culprit = min((w for w in self.workers if w.failed()),
                      key=_Worker.failure_order)
        return culprit, self._failure(culprit)

    def _note_exits(self, start: float) -> None:
        for w in self.workers:
            if w.ended is None and w.proc.poll() is not None:
                w.ended = time.monotonic() - start

    def _failure(self, w: _Worker) -> str:
        code = w.proc.returncode
        during = "" if w.has("ready") else " during start-up"
        what = _describe_exit(code) if code else "exited before joining the runtime"
        record = w.result()
        raised = record.get("error") or (record.get("summary") if code else "")
        because = f" ({raised})" if raised else ""
        if w.index == 0 and not w.has("ready") and _BIND_FAILED in w.output():
            self.bind_failed = True
        return (f"launch failed: process {w.index} (pid {w.proc.pid}) {what}"
                f"{during}{because} after {w.ended or 0:.1f} s; the launcher "
                "stopped the rest.")

    def _startup_failure(self, waiting: list[_Worker]) -> str:
        silent = [w.index for w in waiting if not w.has("started")]
        if silent:
            return (f"launch failed: start-up timed out after "
                    f"{self.startup_timeout:g} s: process(es) {silent} never started "
                    "(no sign of life: a slow import, or an environment problem); "
                    "stopped them all.")
        return (f"launch failed: start-up timed out after {self.startup_timeout:g} s:"
                f" processes {[w.index for w in waiting]} started but did not all "
                f"connect to the coordinator at {self.coordinator}; stopped them all.")

    def kill(self) -> None:
        """SIGKILL every process group now (a Ctrl-C the main thread did not
        take: the launcher ends at once)."""
        for w in self.workers:
            w.signal_group(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM every process group, SIGKILL after the grace period, reap."""
        for w in self.workers:
            if w.proc.poll() is None:
                w.stopped = True
                w.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        while (time.monotonic() < deadline
               and any(w.proc.poll() is None for w in self.workers)):
            time.sleep(_POLL)
        for w in self.workers:  # also children that outlived their worker
            w.signal_group(signal.SIGKILL)
        for w in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=10)
            w.close()

    def execute(self) -> LaunchResult:
        """Start the workers, watch them and stop them; report the launch."""
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="collectives-launch-") as launch_dir:
            kind, culprit, message = "failed", None, "launch interrupted"
            try:
                with _interrupt.on_hard_exit(self.kill):
                    self.start(launch_dir)
                    kind, culprit, message = self.watch()
            finally:
                self.stop()
            results = self.results(kind, time.monotonic() - start)
        ok = kind == "ok" and all(p.status == "ok" for p in results)
        if kind == "ok" and not ok:
            bad = [p.index for p in results if p.status != "ok"]
            message = f"launch failed: processes {bad} exited non-zero."
        return LaunchResult(ok=ok, returncode=0 if ok else 1, message=message,
                            processes=results, coordinator=self.coordinator,
                            devices_per_process=self.m,
                            culprit=None if culprit is None else culprit.index)

    def results(self, kind: str, elapsed: float) -> tuple[ProcessResult, ...]:
        out = []
        for w in self.workers:
            code = w.proc.returncode
            record = w.result()
            if kind == "startup" and not w.has("ready"):
                status = "not connected" if w.has("started") else "not started"
            elif w.stopped and (code is None or code < 0
                                or code == 128 + signal.SIGTERM):
                status = "timed out" if kind == "timeout" else "stopped"
            else:
                status = "ok" if code == 0 and w.has("ready") else "failed"
            summary = record.get("summary", "")
            if status != "ok" and record.get("error"):
                summary = record["error"].splitlines()[0][:80]
            blame = w.blame()
            if status == "failed" and blame is not None:
                if blame[0] in (w.index, _watch.EVERY_RANK):  # it is to blame
                    summary = blame[1][:80]
                else:
                    status = "stopped"
                    summary = f"stopped because process {blame[0]} {blame[1]}"[:80]
            out.append(ProcessResult(
                index=w.index, pid=w.proc.pid, status=status, returncode=code,
                seconds=w.ended if w.ended is not None else elapsed,
                summary=summary, output=w.output()))
        return tuple(out)


def launch(target: Sequence[str], *, num_processes: int = 2,
           devices_per_process: int = 4, port: int | None = None,
           timeout: float = 900.0, startup_timeout: float = 60.0,
           heartbeat_timeout: int = 30, collective_timeout: int = 120,
           stall_timeout: float = _watch.STALL_SECONDS,
           env: Mapping[str, str] | None = None, cwd: str | None = None,
           echo: str = "first", stream: IO[str] | None = None) -> LaunchResult:
    """Run ``target`` in ``num_processes`` local processes joined by JAX.

    Each process simulates ``devices_per_process`` CPU devices, joins JAX's
    distributed runtime through a coordinator on 127.0.0.1 (gloo collectives,
    loopback only) and runs the target. If any process fails, the others are
    stopped at once: SIGTERM to each process group, SIGKILL after 2 s, so
    nothing they started outlives the launch. The processes watch each other
    (heartbeats, as ``worker`` ranks do): one that dies, stops responding or
    sits idle outside JAX while the others wait for it is named as the cause,
    from that evidence, not from who reported first.

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
      timeout: seconds in which no process makes progress (uses CPU or
        moves on) before every process is stopped: a bound on silence, not on
        the whole run.
      startup_timeout: seconds for every process to start and connect.
      heartbeat_timeout: seconds without a heartbeat before JAX declares a
        process dead.
      collective_timeout: seconds a CPU collective waits for its peers
        (XLA flags; gloo's reduce-scatter keeps its own 30 s).
      stall_timeout: seconds a process may sit idle outside JAX while another
        waits for it inside a JAX call before it is named and the launch
        stops; 0: no bound.
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
    argv = worker_argv(target)
    _validate_launch_arguments(
        num_processes=num_processes, devices_per_process=devices_per_process,
        heartbeat_timeout=heartbeat_timeout, collective_timeout=collective_timeout,
        timeout=timeout, startup_timeout=startup_timeout, echo=echo, port=port,
        stall_timeout=stall_timeout)
    attempts = 1 if port is not None else 2
    for attempt in range(attempts):
        chosen = port if port is not None else free_port()
        run = _Launch(argv, num_processes=num_processes,
                      devices_per_process=devices_per_process, port=chosen,
                      timeout=timeout, startup_timeout=startup_timeout,
                      heartbeat_timeout=heartbeat_timeout,
                      collective_timeout=collective_timeout,
                      stall_timeout=stall_timeout, env=env, cwd=cwd,
                      echo=echo, stream=stream or sys.stdout)
        result = run.execute()
        if run.bind_failed and attempt + 1 < attempts:
            continue  # another program took the free port first: pick another
        return result
    raise AssertionError("unreachable")  # pragma: no cover


PROCESS_BYTES = 2**29
"""The least memory one launched process takes: a Python with JAX and its
CPU client (about 0.3 to 0.5 GiB)."""


def max_local_processes() -> int:
    """How many processes ``launch`` starts at most on this machine: its
    memory over :data:`PROCESS_BYTES` (at least 2)."""
    return max(2, _args.memory_bytes() // PROCESS_BYTES)


def _validate_launch_arguments(*, num_processes: int, devices_per_process: int,
                               heartbeat_timeout: int, collective_timeout: int,
                               timeout: float, startup_timeout: float, echo: str,
                               port: int | None, stall_timeout: float) -> None:
    """``launch``'s arguments, checked before anything starts.

    Raises:
      ValueError: a count, a time or ``echo`` is invalid.
      LaunchError: ``port`` is not free.
    """
    for name, value, low in (("num_processes", num_processes, 1),
                             ("devices_per_process", devices_per_process, 1),
                             ("heartbeat_timeout", heartbeat_timeout, 1),
                             ("collective_timeout", collective_timeout, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an int >= {low}, got {value!r}.")
    most = max_local_processes()
    if num_processes > most:
        raise ValueError(
            f"num_processes: {num_processes} processes on this machine, each a "
            f"Python with JAX (about {PROCESS_BYTES / 2**30:.1f} GiB), would need "
            f"more than its {_args.memory_bytes() / 2**30:.0f} GiB: at most "
            f"{most}. Fix: fewer processes with more devices each "
            "(devices_per_process), or a cluster (python -m collectives worker "
            "under srun or mpirun).")
    for name, value in (("timeout", timeout), ("startup_timeout", startup_timeout)):
        if not value > 0:
            raise ValueError(f"{name}: expected a positive number of seconds, got "
                             f"{value!r}.")
    if not stall_timeout >= 0:
        raise ValueError("stall_timeout: expected a number of seconds, 0 or more "
                         f"(0: no bound), got {stall_timeout!r}.")
    if echo not in ("first", "all", "none"):
        raise ValueError(f"echo: expected 'first', 'all' or 'none', got {echo!r}.")
    if port is not None:
        check_port(port)
