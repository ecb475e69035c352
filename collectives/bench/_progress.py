"""The progress line on stderr: rows done, the current row, elapsed, time left.

On a terminal the line is rewritten in place (``\\r``) and cleared before
each table line goes to stdout, so the two never mix even when both are the
same terminal. Written elsewhere (``bench --progress`` into a log), each
update is a line of its own.

Examples:
  >>> import io
  >>> stream = io.StringIO()
  >>> clock = iter([0.0, 0.0, 30.0, 30.0]).__next__
  >>> bar = Progress(stream, total=4, clock=clock)
  >>> bar.begin("psum 1K")
  >>> bar.advance(1)
  >>> bar.begin("psum 4K")
  >>> print(stream.getvalue(), end="")
  # 0/4 rows | psum 1K | 0:00 elapsed, time left unknown
  # 1/4 rows | psum 4K | 0:30 elapsed, about 1:30 left
  >>> format_seconds(75.4), format_seconds(3725)
  ('1:15', '1:02:05')
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TextIO


def format_seconds(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


class Progress:
    """One progress line for ``total`` rows.

    Args:
      stream: where the line goes (stderr).
      total: the rows the run will produce.
      expected: seconds the whole run is expected to take (e.g. the sum of
        its time budgets), the estimate until a row is done; None: unknown
        until then.
      clock: seconds (tests pass a synthetic clock).
    """

    def __init__(self, stream: TextIO, total: int, *,
                 expected: float | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self._stream = stream
        self._total = total
        self._expected = expected
        self._clock = clock
        self._start = clock()
        self._done = 0
        self._label = ""
        self._shown = 0  # characters of the line now on the terminal
        isatty = getattr(stream, "isatty", None)
        self.in_place = bool(isatty and isatty())

    def begin(self, label: str) -> None:
        """Show that ``label`` (the rows now being measured) has started."""
        self._label = label
        self._draw()

    def advance(self, rows: int) -> None:
        """Count ``rows`` more rows done."""
        self._done += rows

    def echo(self, line: str, out: TextIO) -> None:
        """Print ``line`` to ``out`` with the progress line out of its way."""
        self._clear()
        print(line, file=out, flush=True)
        if self._label and self.in_place:
            self._draw()

    def finish(self) -> None:
        """Replace the line with the total rows and time, then a newline."""
        self._clear()
        elapsed = format_seconds(self._clock() - self._start)
        print(f"# {self._done} rows in {elapsed}", file=self._stream, flush=True)
        self._label = ""

    def line(self) -> str:
        """The text of the line: rows done / total, current rows, times."""
        elapsed = self._clock() - self._start
        left = self._total - self._done
        if self._done:
            eta = f"about {format_seconds(elapsed / self._done * left)} left"
        elif self._expected is not None and self._expected > elapsed:
            eta = f"about {format_seconds(self._expected - elapsed)} left"
        else:
            eta = "time left unknown"
        return (f"# {self._done}/{self._total} rows | {self._label} | "
                f"{format_seconds(elapsed)} elapsed, {eta}")

    def _draw(self) -> None:
        text = self.line()
        if not self.in_place:
            print(text, file=self._stream, flush=True)
            return
        # A line wider than the terminal wraps, and \r returns to its last part.
        text = text[:self._width() - 1]
        self._stream.write("\r" + text + " " * max(0, self._shown - len(text)))
        self._stream.flush()
        self._shown = len(text)

    def _width(self) -> int:
        """The terminal's columns; 80 where it does not say (0 on some ptys)."""
        try:
            return os.get_terminal_size(self._stream.fileno()).columns or 80
        except (AttributeError, OSError, ValueError):
            return 80

    def _clear(self) -> None:
        if self.in_place and self._shown:
            self._stream.write("\r" + " " * self._shown + "\r")
            self._stream.flush()
            self._shown = 0
