"""What a launch reports, and the checks made before anything starts.

:class:`LaunchResult` and :class:`ProcessResult` describe how a launch and
each of its processes ended; :func:`worker_argv`, :func:`free_port` and
:func:`check_port` validate a launch before any process starts (a bad target
or a busy port is an error, never a hang).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import socket
from collections.abc import Sequence
from typing import Any

from collectives import _check
from collectives._registry import RECIPES
from collectives._registry import no_recipe
from collectives.distributed import _bench
from collectives.distributed import _check as _process_check

LOOPBACK = "127.0.0.1"
_TARGETS = ("check", "run", "bench", "python")


class LaunchError(RuntimeError):
    """The launch could not start (e.g. its port is in use); nothing is running."""


@dataclasses.dataclass(frozen=True)
class ProcessResult:
    """How one worker process ended.

    Attributes:
      index: the process index (``jax.process_index()`` in the worker).
      pid: its operating-system process id.
      status: ``"ok"``, ``"failed"`` (it raised, exited non-zero or was
        killed), ``"stopped"`` (the launcher stopped it after another failed),
        ``"timed out"``, ``"not started"`` (no sign of life before the
        start-up timeout) or ``"not connected"`` (it started but the runtime
        did not come up: some peer never connected).
      returncode: its exit code; negative for a signal, as in ``subprocess``.
      seconds: from start to exit.
      summary: the worker's one-line result (e.g. ``"40 agree, 0 disagree"``).
      output: its last lines of combined stdout and stderr.
    """

    index: int
    pid: int
    status: str
    returncode: int | None
    seconds: float
    summary: str
    output: str

    def tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of output, ending at the Python traceback
        where the process printed one.

        What the runtime logs after a traceback (a peer's closed socket,
        the coordination service going away) follows it, its last few
        lines with a count of the rest, so that noise never pushes the
        error, or what the process printed before it, out of the window.
        """
        text = self.output.splitlines()
        end = _traceback_end(text)
        if end is None:
            return "\n".join(text[-lines:])
        shown = text[max(0, end + 1 - lines):end + 1]
        after = text[end + 1:]
        keep = max(1, lines // 4)
        if len(after) > keep:
            shown.append(f"... {len(after) - keep} more lines after the "
                         f"traceback; the last {keep}:")
            after = after[-keep:]
        return "\n".join(shown + after)


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """The outcome of :func:`~collectives.distributed.launch`.

    Attributes:
      ok: every process finished with exit code 0.
      returncode: 0 if ``ok``, else 1.
      message: one sentence: what happened, naming the failed process.
      processes: one :class:`ProcessResult` per process, by index.
      coordinator: the ``127.0.0.1:PORT`` address the processes used.
      devices_per_process: simulated CPU devices in each process.
      culprit: the index of the process that failed first (the one the
        message names), or ``None``.
    """

    ok: bool
    returncode: int
    message: str
    processes: tuple[ProcessResult, ...]
    coordinator: str
    devices_per_process: int
    culprit: int | None = None

    @property
    def failed(self) -> tuple[ProcessResult, ...]:
        """The processes that did not finish well by themselves (not those the
        launcher stopped), the culprit first."""
        bad = [p for p in self.processes
               if p.status in ("failed", "not started", "not connected",
                               "timed out")]
        return tuple(sorted(bad, key=lambda p: p.index != self.culprit))

    def report(self, lines: int = 20) -> str:
        """A per-process table, the message and the failed processes' output."""
        out = [f"{'process':<8} {'pid':<8} {'status':<12} {'exit':>5} "
               f"{'seconds':>8}  summary"]
        for p in self.processes:
            code = "-" if p.returncode is None else str(p.returncode)
            out.append(f"{p.index:<8} {p.pid:<8} {p.status:<12} {code:>5} "
                       f"{p.seconds:>8.1f}  {p.summary}")
        for p in self.failed:
            shown = lines if p.index == self.culprit else max(1, lines // 3)
            out.append(f"--- last {shown} lines of process {p.index} (pid {p.pid}) "
                       "---")
            out.append(p.tail(shown) or "(no output)")
        out.append(self.message)
        return "\n".join(out)


_LOG_LINE = re.compile(r"^([EWIF]\d{4} |\d{4}-\d\d-\d\d[ T])")
"""A line the runtime logs (glog's ``E1202 15:04:05...`` or a timestamp)."""


def _traceback_end(text: list[str]) -> int | None:
    """The index of the last line of the last Python traceback in ``text``:
    its exception line and any notes under it, up to the runtime's next log
    line. ``None`` where there is no traceback."""
    starts = [i for i, line in enumerate(text)
              if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    i = starts[-1] + 1
    while i < len(text) and text[i][:1] in (" ", "\t"):
        i += 1
    if i == len(text):
        return None
    while (i + 1 < len(text) and text[i + 1].strip()
           and not _LOG_LINE.match(text[i + 1])):
        i += 1
    return i


def worker_argv(target: Sequence[str]) -> list[str]:
    """Validate a launch target and turn it into the worker's arguments.

    Raises:
      ValueError: the target is empty or not one of ``check``, ``run NAME``,
        ``python ...``.
    """
    target = [str(t) for t in target]
    if target and target[0] == "--":
        target = target[1:]
    if not target:
        raise ValueError(
            "target: nothing to run. Fix: give one after `--`, e.g. `-- check`, "
            "`-- run psum` or `-- python my_script.py`.")
    head = target[0]
    if re.fullmatch(r"python[0-9.]*", os.path.basename(head)):
        script = target[1] if len(target) > 1 else ""
        if script.endswith(".py") and not os.path.isfile(script):
            raise ValueError(
                f"target {' '.join(target)!r}: no script {script!r} (from "
                f"{os.getcwd()}). Fix: give the script's path, relative to "
                "where you run the launcher, or an absolute one.")
        return ["python", *target[1:]]
    if head in _TARGETS:
        _check_arguments(target)
        return target
    raise ValueError(
        f"target {' '.join(target)!r}: unknown command {head!r}. Fix: use `check "
        "[NAMES]`, `run NAME`, `bench [...]` or `python SCRIPT.py [ARGS]` (the "
        "script runs with "
        "this interpreter).")


def _check_arguments(target: list[str]) -> None:
    """Parse a ``check``, ``run`` or ``bench`` target here, so that a typo fails
    at once instead of in every worker after start-up."""
    if target[0] == "bench":
        _parse_quietly(target, lambda: _bench.parse(target[1:]))
        return
    parser = (_process_check.check_parser() if target[0] == "check"
              else _process_check.run_parser())
    args = _parse_quietly(target, lambda: parser.parse_args(target[1:]))
    names = args.names if target[0] == "check" else [args.name]
    unknown = [name for name in names if name not in RECIPES]
    if unknown:
        raise ValueError(
            f"target {' '.join(target)!r}: {no_recipe(unknown[0])}")
    if target[0] == "check" and (args.mesh or args.axis):  # (no device query:
        try:                                                # JAX must not start)
            _check.configs_from_args(args)
        except ValueError as err:
            raise ValueError(f"target {' '.join(target)!r}: {err}") from None


def _parse_quietly(target: list[str], parse: Any) -> Any:
    """``parse()``, with argparse's complaints turned into a ValueError."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            return parse()
    except SystemExit:
        raise ValueError(f"target {' '.join(target)!r}: "
                         f"{said.getvalue().strip()}") from None
    except ValueError as err:
        raise ValueError(f"target {' '.join(target)!r}: {err}") from None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def check_port(port: int) -> None:
    """Raise :class:`LaunchError` if ``port`` on 127.0.0.1 cannot be bound."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port: expected an int from 1 to 65535, got {port!r}. "
                         "Fix: pass a free port, or None to pick one.")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError as err:
            raise LaunchError(
                f"port {port} on {LOOPBACK} is not free ({err.strerror}), so the "
                "coordinator cannot listen there. Fix: choose another port, or "
                "leave the port out to pick a free one.") from None
