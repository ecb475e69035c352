"""Argument types for the command line: every value is checked when the
command line is parsed, before any work, and a bad one is refused with one
line naming the flag, the value and the fix (argparse's exit code 2).

Each factory returns a callable for ``add_argument(type=...)``; argparse
prefixes the message with the flag itself (``argument --seed: ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import numbers
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from typing import TextIO

from collectives import _interrupt


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose refusal is one line on stderr, naming the
    command, the flag, the value and the fix (exit code 2); ``--help`` still
    shows the usage."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


class Refused(ValueError):
    """A value the command line cannot take, found after parsing but before
    any work (e.g. a mesh bigger than the devices): ``main`` prints its
    message as one line and exits 2."""


MAX_CPU_DEVICES = 2048
"""XLA's CPU client simulates at most this many devices in one process (more
fail with "Multiprocess computations aren't implemented on the CPU
backend"); each takes threads and memory, so big counts are for compiling
(``plan``), not for running."""

def memory_bytes() -> int:
    """This machine's memory in bytes (a terabyte where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return 2**40



def counts(value: Any, *, label: str, unit: str, each: str, fix: str) -> list[int]:
    """``value`` as a list of whole numbers of ``unit``, each 1 or more (an
    API argument such as ``bench.run(sizes=...)``), checked before any work.

    Raises:
      TypeError: ``value`` is no list, or an item is no whole number.
      ValueError: the list is empty, or an item is below 1; each message
        names ``label``, the value, and ends with ``fix``.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{label}={value!r}: expected a list of {each}s. {fix}")
    items = list(value)
    if not items:
        raise ValueError(f"{label}={value!r}: no {each}. {fix}")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, numbers.Integral):
            raise TypeError(
                f"{label}: {item!r} is not a whole number of {unit}. {fix}")
        if item < 1:
            raise ValueError(f"{label}: {item} {unit} is no {each}. {fix}")
    return [int(item) for item in items]

MAX_SEED = 2**32 - 1
"""NumPy's and JAX's seeds are unsigned 32-bit integers."""


def _refuse(text: str, expected: str, fix: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{text!r}: expected {expected}. Fix: {fix}")


def whole(expected: str = "a whole number", *, low: int | None = None,
          high: int | None = None, fix: str = "") -> Callable[[str], int]:
    """An int in ``[low, high]`` (either bound optional)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or (low is not None and value < low) or (
                high is not None and value > high):
            raise _refuse(text, expected, fix or f"pass {expected}")
        return value
    return parse


def real(expected: str, *, low: float | None = None, above: float | None = None,
         fix: str = "") -> Callable[[str], float]:
    """A finite float, at least ``low`` or greater than ``above``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or (low is not None and value < low) or (
                above is not None and value <= above):
            raise _refuse(text, expected, fix or f"pass {expected}")
        return value
    return parse


at_least_one = whole("a count of 1 or more", low=1)
"""Counts of processes, iterations, rounds."""

devices = whole(f"a device count from 1 to {MAX_CPU_DEVICES}", low=1,
                high=MAX_CPU_DEVICES,
                fix=f"simulate 1 to {MAX_CPU_DEVICES} CPU devices (XLA's CPU client "
                    "refuses more; e.g. --devices 8)")
"""``--devices``/``--cpu-devices``: 1 to :data:`MAX_CPU_DEVICES`."""

seed = whole(f"a seed from 0 to {MAX_SEED}", low=0, high=MAX_SEED,
             fix="pass a non-negative seed, e.g. --seed 0")
"""``--seed``: an unsigned 32-bit integer."""


def dtype(text: str) -> str:
    """A NumPy or JAX dtype name (``float32``, ``bfloat16``, ``int8``...)."""
    import jax.numpy as jnp

    try:
        jnp.dtype(text)
    except TypeError:
        raise _refuse(text, "a dtype name such as float32, bfloat16 or int32",
                      "pass one of NumPy's or JAX's dtype names") from None
    return text


STDOUT = "-"
"""An output file named ``-``: standard output (the command's own table
then goes to standard error, so that the data can be piped)."""


def _special(path: Path) -> bool:
    """An existing device or FIFO (``/dev/null``, ``/dev/stdout``, a named
    pipe): written in place, never replaced by a rename."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def output_file(text: str) -> str:
    """A file to write at the end, checked now so that a long run does not
    fail only at its last step: ``-`` (standard output), an existing device
    or FIFO it may write to (written in place, never replaced), or a file in
    a folder where one can be created now."""
    if text == STDOUT:
        return text
    if not text.strip():
        raise _refuse(text, "a file name, not an empty one",
                      "name a file, e.g. out.json, or - for standard output")
    path = Path(text)
    if text.endswith(("/", os.sep)) or path.is_dir():
        raise _refuse(text, "a file name, not a folder",
                      f"name a file inside it, e.g. {path / 'out.json'}")
    if path.exists() and not path.is_file():
        if not _special(path):
            raise _refuse(text, "a file, a device or a FIFO to write to (this is "
                          "neither: a socket or a block device)",
                          "name a file, or - for standard output")
        if not os.access(path, os.W_OK):
            raise _refuse(text, "a device or FIFO you can write to",
                          "write elsewhere, or - for standard output")
        return text
    folder = path.parent
    if not folder.is_dir():
        raise _refuse(text, "a file in an existing folder",
                      f"create {folder} first, or write elsewhere")
    try:  # what the end of the run does: a file created beside it
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".collectives-"):
            pass
    except OSError as err:
        raise _refuse(text, "a file in a folder where files can be created",
                      f"{folder}: {err.strerror or err}; write elsewhere") from None
    return text


def plot_file(text: str) -> str:
    """``--plot FILE``: :func:`output_file` but not ``-`` (a picture is
    written to a file), and matplotlib is installed (an optional dependency:
    checked now, not after the run)."""
    import importlib.util

    if text == STDOUT:
        raise _refuse(text, "a picture's file name (- is standard output, for "
                      "--json and --csv)", "name a file, e.g. plot.png")
    output_file(text)
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError(
            f"{text!r}: drawing needs matplotlib, which is not installed. Fix: pip "
            "install matplotlib (jax-collectives' 'bench' extra), or drop --plot")
    return text


OUTPUT_FLAGS = ("json", "csv", "plot")
"""The attributes of a command's parsed arguments that name output files."""


def one_output_each(args: argparse.Namespace) -> None:
    """Refuse two output flags that name one file (the second would
    overwrite the first), ``-`` included.

    Raises:
      Refused: naming both flags and the file.
    """
    seen: dict[str, str] = {}
    for flag in OUTPUT_FLAGS:
        text = getattr(args, flag, None)
        if not text:
            continue
        key = text if text == STDOUT else os.path.realpath(text)
        if key in seen:
            raise Refused(
                f"--{seen[key]} and --{flag} both write {text!r}: the second would "
                "overwrite the first. Fix: give each its own file.")
        seen[key] = flag


_DATA_OUT: list[TextIO] = []
"""The standard output that ``-`` writes to while :func:`tables_to_stderr`
is in force."""


@contextlib.contextmanager
def tables_to_stderr(args: argparse.Namespace) -> Iterator[None]:
    """Where an output flag is ``-``, the command's printing goes to standard
    error and only the data to standard output."""
    if not any(getattr(args, flag, None) == STDOUT for flag in OUTPUT_FLAGS):
        yield
        return
    _DATA_OUT.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _DATA_OUT.pop()


def coordinator(text: str) -> str:
    """``HOST:PORT`` with a port from 1 to 65535."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _refuse(text, "HOST:PORT with a port from 1 to 65535",
                      "pass rank 0's address, e.g. 10.0.0.1:1234")
    return text


def write_atomic(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """``write(temporary)`` into a file beside ``path``, then rename it onto
    ``path``: an interrupted run leaves the old file or none, never half of
    one. ``-`` (:data:`STDOUT`) and an existing device or FIFO get the
    finished file's bytes written in place."""
    if str(path) == STDOUT or _special(Path(path)):
        with tempfile.TemporaryDirectory() as folder, \
                _interrupt.temporary(Path(folder)):
            temporary = Path(folder) / Path(str(path)).name.replace(STDOUT, "out")
            write(temporary)
            _copy_in_place(str(path), temporary)
        return
    target = Path(path)
    # the same suffix: writers such as matplotlib's choose the format by it
    temporary = target.with_name(f".{target.stem}.{os.getpid()}.tmp{target.suffix}")
    try:
        with _interrupt.temporary(temporary):
            write(temporary)
            os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _copy_in_place(path: str, finished: Path) -> None:
    if path == STDOUT:
        out: Any = _DATA_OUT[-1] if _DATA_OUT else sys.stdout
        out.write(finished.read_text())
        out.flush()
        return
    with open(finished, "rb") as source, open(path, "wb") as target:
        shutil.copyfileobj(source, target)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """``text`` into ``path`` (:func:`write_atomic`)."""
    write_atomic(path, lambda temporary: temporary.write_text(text))
