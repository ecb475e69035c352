"""One worker of a launch: join JAX's distributed runtime, run the target.

The launcher starts ``python -m collectives.distributed TARGET...`` once
per process, with the settings in ``COLLECTIVES_*`` environment variables
(:class:`WorkerEnv`). The worker simulates its CPU devices, joins the runtime
on 127.0.0.1 with bounded timeouts, leaves marker files the launcher watches
(``started-<i>``, ``ready-<i>``, ``result-<i>.json``) and runs ``check``,
``run`` or a Python script. A failing worker leaves at once (``os._exit``),
without JAX's shutdown barrier, which would wait for peers that are stuck
waiting for it; the launcher then stops the others.
"""

from __future__ import annotations

import dataclasses
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

PREFIX = "COLLECTIVES_"


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
      shutdown_timeout: seconds the shutdown barrier waits (JAX 0.10+).
      launcher_pid: the launcher's pid; the worker ends itself (and its
        children) if the launcher goes away.
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


def join(settings: WorkerEnv) -> None:
    """Simulate the devices and join the distributed runtime (127.0.0.1 only)."""
    import jax

    from collectives import _compat
    from collectives._devices import use_cpu_devices

    use_cpu_devices(settings.devices_per_process)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    _compat.use_loopback_gloo()
    _compat.initialize_distributed(
        settings.coordinator, settings.num_processes, settings.process_id,
        bind_address=settings.coordinator,
        initialization_timeout=settings.startup_timeout,
        heartbeat_timeout=settings.heartbeat_timeout,
        shutdown_timeout=settings.shutdown_timeout)


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
    from collectives.distributed import _check as _process_check

    target, rest = argv[0], argv[1:]
    if target == "check":
        return _process_check.cmd_check(rest)
    if target == "run":
        return _process_check.cmd_run(rest)
    if target == "python":
        return _run_python(rest)
    raise ValueError(f"unknown target {target!r}: expected check, run or python.")


def _finish(settings: WorkerEnv, code: int, summary: str, error: str = "",
            when: float | None = None) -> None:
    record = {"ok": code == 0, "code": code, "summary": summary, "error": error,
              "time": time.time() if when is None else when}
    settings.marker("result").with_suffix(".json").write_text(json.dumps(record))
    sys.stdout.flush()
    sys.stderr.flush()
    if code != 0:
        os._exit(code)  # no shutdown barrier: the peers may be stuck on us


def main(argv: Sequence[str] | None = None) -> int:
    """Worker entry point; ``argv`` is the target, e.g. ``["check", "psum"]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    settings = WorkerEnv.from_env(os.environ)
    if settings is None or not argv:
        print("collectives.distributed is started by `python -m collectives "
              "launch`; run that instead.", file=sys.stderr)
        return 2
    _watch_launcher(settings.launcher_pid)
    settings.marker("started").touch()
    join(settings)
    settings.marker("ready").touch()
    try:
        code, summary = _dispatch(argv)
    except SystemExit as stop:
        when = time.time()
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None
                                                             else 1)
        if stop.code not in (None, 0) and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        summary = f"SystemExit({code})"
        _finish(settings, code, summary, when=when)
        return code
    except BaseException as err:  # reported, then the worker leaves at once
        when = time.time()
        if _second_initialize(err):
            err.add_note(_DOUBLE_INIT_HINT)
        traceback.print_exc()
        _finish(settings, 1, "raised", f"{type(err).__name__}: {err}", when=when)
        return 1
    _finish(settings, code, summary)
    return code

