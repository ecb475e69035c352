"""Ctrl-C at any moment of ``python -m collectives``: one line on stderr,
exit status 130, no half-written output file and no process left behind.

Python turns SIGINT into a ``KeyboardInterrupt`` wherever the main thread
runs Python next, and four places lose it:

* an import half done: an extension module's initialisation (numpy's,
  jaxlib's) turns it into an ``ImportError`` and a long traceback, or the
  exception escapes before the command's own ``except`` exists;
* a garbage-collection callback (JAX's ``_xla_gc_callback``): Python prints
  "Exception ignored" and the command runs on to exit 0, files written;
* a JAX host callback (``pure_callback``, ``io_callback``, Pallas's
  interpret mode), which XLA:CPU may run on the main thread: the exception
  becomes the computation's runtime error;
* a wait inside C++ (a computation, ``block_until_ready``): no Python runs
  on the main thread, so the interrupt waits for the wait.

So, from the first line of the package's import when run as ``python -m
collectives``: during start-up a Ctrl-C ends the process at once (nothing
has been written or started yet); during the command it raises
``KeyboardInterrupt`` in the main thread where unwinding is safe (the
command's ``finally`` blocks remove temporary files and stop child
processes), never inside a callback: a thread reading Python's wakeup file
descriptor sees the Ctrl-C whatever the main thread does, raises it again
every few milliseconds until the main thread takes it outside any callback
(an exception a ``__del__`` swallows comes back through
``sys.unraisablehook``). Where that has not happened within
:data:`GRACE_SECONDS`, or the exception has not unwound to the command's
end within :data:`UNWIND_SECONDS` (code with a bare ``except:`` caught it),
the thread removes the temporary files :func:`temporary` registered, runs
the :func:`on_hard_exit` cleanups (a launcher's children) and ends the
process itself.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

GRACE_SECONDS = 2.0
"""How long the main thread has to take a Ctrl-C (raise ``KeyboardInterrupt``
outside any callback) before the watching thread ends the process itself."""

UNWIND_SECONDS = 15.0
"""How long the command then has to unwind to its end (a launcher stopping
its children) before the watching thread ends the process itself: code
that catches every exception (JAX's plugin start-up has a bare ``except:``)
would otherwise swallow the interrupt and run on."""

_command = "collectives"
_declined = threading.Event()  # the handler ran inside a callback: ask again
_taken = threading.Event()  # the main thread raised KeyboardInterrupt
_unwound = threading.Event()  # ... and it reached the end of the command
_temporaries: set[Path] = set()
_cleanups: list[Callable[[], None]] = []
_sockets: tuple[socket.socket, socket.socket] | None = None


def run_as_command(argv: list[str]) -> bool:
    """Whether this interpreter runs ``python [options] -m collectives``
    (``sys.orig_argv``), not a program that imports the package."""
    return any(arg == "-m" and argv[i + 1:i + 2] == ["collectives"]
               for i, arg in enumerate(argv))


def command_name(argv: list[str]) -> str:
    """The subcommand in ``python -m collectives [flags] NAME ...``, for the
    line a Ctrl-C prints before the arguments are parsed."""
    after = argv[argv.index("collectives") + 1:] if "collectives" in argv else []
    return next((arg for arg in after if not arg.startswith("-")), "collectives")


def say_and_exit(code: int = 130) -> None:
    """Remove the registered temporary files, run the cleanups, print the
    command's one line and end the process now (no Python shutdown: it
    could wait on the very threads a C++ wait holds)."""
    for path in list(_temporaries):
        with contextlib.suppress(OSError):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for cleanup in list(_cleanups):
        with contextlib.suppress(Exception):
            cleanup()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os.write(2, f"\n{_command}: interrupted\n".encode())
    os._exit(code)


def _at_startup(signum: int, frame: FrameType | None) -> None:
    say_and_exit()


_JAX_CALLBACKS = os.path.join("jax", "_src", "callback.py")


def _in_callback(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside a garbage-collection callback (Python
    drops an exception raised there) or a JAX host callback (XLA turns it
    into a runtime error of the computation)."""
    gc_codes = {getattr(fn, "__code__", None) for fn in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code in gc_codes or code.co_filename.endswith(_JAX_CALLBACKS):
            return True
        frame = frame.f_back
    return False


def _during_command(signum: int, frame: FrameType | None) -> None:
    if _taken.is_set():  # a second Ctrl-C: the cleanup runs on, bounded
        return
    if _in_callback(frame):
        _declined.set()  # the watching thread asks again in a moment
        return
    _taken.set()
    raise KeyboardInterrupt


def _lost(unraisable: object) -> None:
    """``sys.unraisablehook`` during a command: a ``KeyboardInterrupt`` that
    a ``__del__`` or a callback swallowed is raised again at the main
    thread's next line; anything else as Python shows it."""
    if isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
        _taken.clear()
        signal.raise_signal(signal.SIGINT)
        return
    sys.__unraisablehook__(unraisable)


def _wait(event: threading.Event, seconds: float, reader: socket.socket) -> bool:
    """Wait for ``event``; each time the handler declined (inside a
    callback), raise SIGINT again, once: its handler runs at the main
    thread's next line, outside the callback or declining again."""
    deadline = time.monotonic() + seconds
    while not event.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
        if _declined.is_set():
            _declined.clear()
            signal.raise_signal(signal.SIGINT)
        with contextlib.suppress(BlockingIOError):  # the bytes it wrote
            while reader.recv(64, socket.MSG_DONTWAIT):
                pass
    return event.is_set()


def _watch(reader: socket.socket) -> None:
    while True:
        try:
            number = reader.recv(1)
        except OSError:
            return
        if not number or number[0] != signal.SIGINT:
            continue
        if signal.getsignal(signal.SIGINT) != _during_command:
            continue  # at start-up the handler itself ends the process
        # the main thread takes it outside any callback, and unwinds: else
        # it is in C++, in a callback, or something swallowed it
        if not (_wait(_taken, GRACE_SECONDS, reader)
                and _wait(_unwound, UNWIND_SECONDS, reader)):
            say_and_exit()


def _start_watching() -> int:
    """Python's wakeup file descriptor onto the watching thread's socket (one
    thread for the process); returns the previous descriptor."""
    global _sockets
    if _sockets is None:
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        _sockets = (reader, writer)
        threading.Thread(target=_watch, args=(reader,), name="ctrl-c-watch",
                         daemon=True).start()
    return signal.set_wakeup_fd(_sockets[1].fileno(), warn_on_full_buffer=False)


def at_startup(argv: list[str]) -> None:
    """From here until :func:`during_command`, a Ctrl-C ends the process at
    once with the command's one line. Call from the main thread, first thing."""
    global _command
    _command = command_name(argv)
    signal.signal(signal.SIGINT, _at_startup)
    _start_watching()


@contextlib.contextmanager
def during_command(command: str) -> Iterator[None]:
    """For the block: a Ctrl-C raises ``KeyboardInterrupt`` once, in the main
    thread, outside any callback; the watching thread ends the process where
    that has not happened within :data:`GRACE_SECONDS` or the exception has
    not reached the block's end :data:`UNWIND_SECONDS` later. A block that
    ends normally after a Ctrl-C (something caught the exception) raises it
    there. Restores the previous handler, unraisable hook and wakeup file
    descriptor afterwards (the suite calls commands in its own process). Off
    the main thread it changes nothing."""
    global _command
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _command = command
    for event in (_declined, _taken, _unwound):
        event.clear()
    # watched before the handler is ours: a Ctrl-C it declines in between
    # (in a callback) is still seen, and asked again
    previous_fd = _start_watching()
    previous_hook, sys.unraisablehook = sys.unraisablehook, _lost
    previous = signal.signal(signal.SIGINT, _during_command)
    try:
        yield
        if _taken.is_set():  # swallowed on the way, and the command ran on
            raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, previous)
        _unwound.set()
        sys.unraisablehook = previous_hook
        signal.set_wakeup_fd(previous_fd)


@contextlib.contextmanager
def temporary(path: Path) -> Iterator[Path]:
    """``path`` (a file or a folder) is removed if the process ends from a
    Ctrl-C while the block runs (the block's own ``finally`` does it
    otherwise)."""
    _temporaries.add(path)
    try:
        yield path
    finally:
        _temporaries.discard(path)


@contextlib.contextmanager
def on_hard_exit(cleanup: Callable[[], None]) -> Iterator[None]:
    """``cleanup()`` runs if the process ends from a Ctrl-C while the block
    runs (e.g. a launcher killing its children's process groups)."""
    _cleanups.append(cleanup)
    try:
        yield
    finally:
        _cleanups.remove(cleanup)
