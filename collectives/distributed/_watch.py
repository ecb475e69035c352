"""Ranks watch each other, and a signal stops a rank at once, saying so.

Three ways a rank of a job fails without a word from this package:

* **it is killed** (``SIGKILL``, the out-of-memory killer, a crash inside
  XLA): its peers would wait in their next collective, until JAX's heartbeat
  declares it dead and aborts them with a C++ stack trace (30 s and more);
* **it is sent SIGTERM** (``scancel``, ``kubectl delete``, ``mpirun`` ending
  the job, a preemption): JAX's preemption notifier catches the signal and
  the rank carries on as if nothing happened;
* **it stalls**: it is stopped (``SIGSTOP``, a debugger) or it waits outside
  JAX (a deadlock, a sleep, a read that never returns) while the others wait
  for it in a collective. Its peers would wait until the collective timeout
  (minutes), then fail with errors that name no one.

:class:`PeerWatch` keeps one TCP connection from every rank to rank 0 (its
address travels through the coordination service's key-value store). The
kernel closes a process's connections when it dies, however it dies, so a
rank that ends without saying goodbye (``end``) is seen at once: rank 0 tells
the others, and every rank stops with a message naming the rank that went
and :data:`EXIT_PEER_LOST`. A rank that ends with a failed result says so
first; its peers stop if they are still running their target (they would
wait for it in a collective).

Over the same connections every rank sends a heartbeat each second: how long
it has been idle (no CPU used, the main thread in one place) and where, inside
a JAX call or outside one. Rank 0 decides from that evidence, not from who
complains first: a rank whose heartbeat stops for :data:`SILENT_SECONDS` is
stopped; a rank idle outside JAX for the stall timeout while another rank
waits idle inside a JAX call is the one the job waits for. Either way it is
named, and every rank stops. A rank that uses CPU or moves on is never
called stuck, however long it runs.

:func:`stop_on_signals` makes SIGTERM and SIGINT end the rank within a
moment, even while it waits inside a collective (a thread reads the signal
from Python's wakeup file descriptor, so the main thread need not return to
Python), with a message naming the signal and exit code 128 + its number.
"""

from __future__ import annotations

import ast
import contextlib
import dis
import functools
import linecache
import os
import select
import signal
import socket
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from collectives import _compat

EXIT_PEER_LOST = 4
"""Exit code of a rank stopped because another rank ended without a result."""

EXIT_NO_PROGRESS = 124
"""Exit code of a rank that made no progress for its ``--timeout``."""

EXIT_MISMATCH = 5
"""Exit code of the ranks stopped because they wait in different
collectives (each idle inside a JAX call at another line)."""

EVERY_RANK = -1
"""The rank a verdict names where no one rank is to blame (a mismatch)."""

PEERS_GONE_SECONDS = 3.0
"""How long rank 0, stopping, waits for the other ranks to end first."""

BEAT_SECONDS = 1.0
"""How often every rank sends its heartbeat."""

SILENT_SECONDS = 8.0
"""A rank whose heartbeat stops this long is stopped (``SIGSTOP``, a
debugger) or frozen. A Python thread sends it, so a loaded machine delays it
by well under a second; JAX's own heartbeat declares a rank dead after 20 to
30 s, with a C++ stack trace."""

STALL_SECONDS = 15.0
"""Default bound (``--stall-timeout``) on a rank idle outside JAX while the
others wait for it idle inside a JAX call."""

IDLE_CPU = 0.05
"""CPU seconds per second under which a process counts as idle (a rank that
waits in a CPU collective uses well under 0.01)."""

_ANNOUNCE_KEY = "collectives/watch/rank0"
_KILLED = ("ended without reporting a result: it was killed (SIGKILL, the "
           "out-of-memory killer) or crashed outside Python")
_RANK0 = "rank 0 (the coordinator)"


def say_and_exit(message: str, code: int) -> None:
    """Print ``message`` to stderr and end the process at once (no JAX
    shutdown barrier: peers may be stuck waiting for this process)."""
    try:
        if message:
            print(message, file=sys.stderr, flush=True)
        sys.stdout.flush()
    finally:
        os._exit(code)


class PeerWatch:
    """Every rank's liveness, watched over one TCP connection per rank to rank 0.

    Args:
      rank: this process's index.
      num_processes: the number of ranks.
      address: where rank 0 listens (the coordinator's host: 127.0.0.1 for a
        job on one machine).
      timeout: seconds for every rank to connect.
      stall: seconds a rank may sit idle outside JAX while another waits for
        it idle inside a JAX call (0: never stop for that).
      progress: seconds the job may make no progress at all (no rank uses
        CPU or moves on) before every rank stops with
        :data:`EXIT_NO_PROGRESS` (``None``: no bound). A rank waiting for a
        busy peer is not stopped, however long it waits.
      on_stop: called as ``on_stop(rank, how)`` just before this rank stops
        because of rank ``rank`` (``how``: what that rank did, e.g. "stopped
        responding: ..."); the launcher reads it as evidence.
    """

    def __init__(self, rank: int, num_processes: int, address: str,
                 timeout: float, *, stall: float = STALL_SECONDS,
                 progress: float | None = None,
                 on_stop: Callable[[int, str], None] | None = None):
        self.rank = rank
        self.num_processes = num_processes
        self.address = address
        self.timeout = timeout
        self.stall = stall
        self.progress = progress
        self.on_stop = on_stop
        self.in_target = True  # False once this rank is reporting its result
        self._stopping = False  # True once this rank is on its way out
        self.pulse = Pulse()
        self._lock = threading.Lock()
        self._peers: dict[int, socket.socket] = {}  # rank 0: one per other rank
        self._who: dict[int, str] = {}
        self._reported: set[int] = set()  # ranks that said how they ended
        self._upstream: socket.socket | None = None  # other ranks: to rank 0
        # the last heartbeat heard from each rank (rank 0: every rank, its own
        # included; the others: rank 0's): (when, idle seconds, in JAX, where)
        self._beats: dict[int, tuple[float, float, bool, str]] = {}

    # -- start-up ------------------------------------------------------------

    def start(self) -> None:
        """Connect the ranks (needs ``jax.distributed.initialize`` first).

        Where rank 0 cannot listen on ``address`` the watch stays off (a
        note says so) and a lost rank is found by JAX's heartbeat instead.
        """
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()
        if self.num_processes < 2:
            return
        if self.rank == 0:
            try:
                server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                server.bind((self.address, 0))
                server.listen(self.num_processes)
            except OSError as err:
                _compat.key_value_set(_ANNOUNCE_KEY, "off")
                self._off(f"rank 0 cannot listen on {self.address} ({err})")
                return
            host, port = server.getsockname()[:2]
            _compat.key_value_set(_ANNOUNCE_KEY, f"{host}:{port}")
            try:
                self._accept(server)
                heard = time.monotonic()
                self._beats.update((rank, (heard, 0.0, False, "?"))
                                   for rank in self._peers)
            except (OSError, ValueError) as err:
                self._off(f"not every rank connected within {self.timeout:g} s "
                          f"({err})")
                return
            finally:
                server.close()
            threading.Thread(target=self._watch_peers, name="peer-watch",
                             daemon=True).start()
        else:
            where = _compat.key_value_get(_ANNOUNCE_KEY, self.timeout)
            if where == "off":
                return
            host, port = where.rsplit(":", 1)
            try:
                upstream = socket.create_connection((host, int(port)),
                                                    timeout=self.timeout)
                upstream.settimeout(None)
                upstream.sendall(f"hello {self.rank} {socket.gethostname()} "
                                 f"{os.getpid()}\n".encode())
            except OSError as err:
                self._off(f"rank 0's watch at {where} cannot be reached ({err})")
                return
            self._beats[0] = (time.monotonic(), 0.0, False, "?")
            self._upstream = upstream
            threading.Thread(target=self._watch_rank0, name="peer-watch",
                             daemon=True).start()

    def _off(self, why: str) -> None:
        self._broadcast("off")
        for conn in self._peers.values():
            conn.close()
        self._peers.clear()
        print(f"note: rank {self.rank}: the peer watch is off: {why}; a rank that "
              "dies is found by JAX's heartbeat (--heartbeat-timeout) instead.",
              file=sys.stderr, flush=True)

    def _accept(self, server: socket.socket) -> None:
        deadline = time.monotonic() + self.timeout
        while len(self._peers) < self.num_processes - 1:
            server.settimeout(max(0.1, deadline - time.monotonic()))
            conn, _ = server.accept()  # socket.timeout past the deadline
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            line = _read_line(conn)
            conn.settimeout(None)
            _, rank, host, pid = line.split()
            self._peers[int(rank)] = conn
            self._who[int(rank)] = f"rank {rank} (host {host}, pid {pid})"

    # -- rank 0: watch every other rank ---------------------------------------

    def _watch_peers(self) -> None:
        buffers = {rank: b"" for rank in self._peers}
        open_ = dict(self._peers)
        while open_:
            ready, _, _ = select.select(list(open_.values()), [], [])
            for conn in ready:
                rank = next(r for r, c in open_.items() if c is conn)
                try:
                    data = conn.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    del open_[rank]
                    if rank not in self._reported:
                        self._lost(rank, self._who[rank], _KILLED)
                    continue
                lines, buffers[rank] = _split_lines(buffers[rank] + data)
                for line in lines:
                    self._heard(rank, line)

    def _heard(self, rank: int, line: str) -> None:
        what, *rest = line.split(" ", 1)
        if what == "beat":
            self._beats[rank] = _parse_beat(rest[0])
        elif what == "end":
            code = int(rest[0])
            self._reported.add(rank)
            if code != 0:
                self._broadcast(f"failed {rank} {code}")
                self._peer_failed(rank, self._who[rank], code)
        elif what == "signal":
            self._reported.add(rank)
            self._lost(rank, self._who[rank], f"was stopped by {rest[0]}")

    def _broadcast(self, line: str) -> None:
        for conn in self._peers.values():
            with contextlib.suppress(OSError):
                conn.sendall(f"{line}\n".encode())

    def _lost(self, rank: int, who: str, how: str) -> None:
        """Rank ``rank`` went, or stalled, without a result: tell the others,
        then stop."""
        if self.rank == 0:
            self._broadcast(f"lost {rank} {who}: {how}")
        if rank == self.rank:
            then = ("It stops now, and every other rank with it (exit "
                    f"{EXIT_PEER_LOST}).")
        else:
            then = (f"Rank {self.rank} stops too, so the job fails now instead of "
                    f"waiting in a collective (exit {EXIT_PEER_LOST}).")
        self._stop(rank, how, f"error: {who} {how}. {then}", EXIT_PEER_LOST)

    def _peer_failed(self, rank: int, who: str, code: int) -> None:
        """A peer reported a failure: a rank still in its target would wait
        for it in a collective; stop it, naming the peer."""
        if self.in_target:
            self._stop(rank, f"failed (exit {code})",
                       f"error: {who} failed (exit {code}; its error is in its "
                       f"own output). Rank {self.rank} stops too: it would wait "
                       "for that rank in its next collective.", 1)

    def _stop(self, rank: int | None, how: str, message: str, code: int) -> None:
        """Stop this rank with ``message`` (once, whichever verdict comes
        first), after recording that rank ``rank`` caused it (``None``: no
        one rank did)."""
        with self._lock:
            if self._stopping:
                return  # this rank already stops (a signal, or another verdict)
            self._stopping = True
        if self.on_stop is not None and rank is not None:
            with contextlib.suppress(Exception):  # the evidence is a courtesy
                self.on_stop(rank, how)
        if self.rank == 0 and self._peers:
            # Rank 0 hosts JAX's coordination service: a peer still alive as
            # it vanishes has its JAX client log a fatal line ("Terminating
            # process because the JAX distributed service detected fatal
            # errors"). The peers, told, end first.
            with contextlib.suppress(Exception):
                print(message, file=sys.stderr, flush=True)
            self._await_peers_gone(PEERS_GONE_SECONDS)
            say_and_exit("", code)
        say_and_exit(message, code)

    def _await_peers_gone(self, seconds: float) -> None:
        """Wait up to ``seconds`` for every peer's connection to close (each
        closes as its process ends); only peeks, so the thread reading the
        peers reads on."""
        deadline = time.monotonic() + seconds
        open_ = list(self._peers.values())
        while open_ and time.monotonic() < deadline:
            ready, _, _ = select.select(open_, [], [], 0.05)
            for conn in ready:
                try:
                    data = conn.recv(1, socket.MSG_PEEK)
                except OSError:
                    data = b""
                if not data:
                    open_.remove(conn)
            if ready and open_:
                time.sleep(0.01)  # unread lines: the other thread takes them

    # -- every rank: a heartbeat each second; rank 0 judges them all -----------

    def _beat(self) -> None:
        while True:
            time.sleep(BEAT_SECONDS)
            try:
                idle = self.pulse.sample()
            except Exception:  # the heartbeat must never stop
                idle = 0.0
            inside, place = self.pulse.inside_jax, self.pulse.place
            beat = f"beat {idle:.1f} {int(inside)} {place}"
            if self._upstream is not None:
                self._send(beat)
                self._judge_rank0()
                continue
            self._beats[0] = (time.monotonic(), idle, inside, place)
            if self.rank == 0 and self._peers:
                self._broadcast(beat)
                self._judge()
            self._judge_progress()

    def _judge_progress(self) -> None:
        """Rank 0 (or a rank alone): stop if no rank made progress for
        ``progress`` seconds."""
        beats = self._live_beats()
        if self.progress is None or not beats or min(
                idle for _, idle, _, _ in beats.values()) < self.progress:
            return
        where = "; ".join(
            f"rank {rank} idle {'inside a JAX call' if inside else 'outside JAX'} "
            f"at {place}" for rank, (_, _, inside, place) in sorted(beats.items()))
        message = (f"error: no rank made progress for {self.progress:g} s "
                   f"(--timeout; no CPU used, each where it was): {where}. "
                   "Every rank stops.")
        self._broadcast(f"stop {EXIT_NO_PROGRESS} {message}")
        self._stop(None, "", message, EXIT_NO_PROGRESS)

    def _live_beats(self) -> dict[int, tuple[float, float, bool, str]]:
        """The last heartbeat of each rank that has not yet said how it ended."""
        return {rank: beat for rank, beat in self._beats.items()
                if rank not in self._reported}

    def _judge(self) -> None:
        """Rank 0: stop the job if a rank is silent, idle outside JAX while
        another rank waits for it inside a JAX call, or every rank waits
        inside a JAX call but not all at one place (different collectives)."""
        now = time.monotonic()
        beats = self._live_beats()
        for rank, (heard, *_) in beats.items():
            if rank != 0 and now - heard > SILENT_SECONDS:
                self._lost(rank, self._who[rank], _silent(now - heard))
        if not self.stall:
            return
        waiting = [rank for rank, (_, idle, inside, _) in beats.items()
                   if inside and idle >= self.stall]
        stuck = [rank for rank, (_, idle, inside, _) in beats.items()
                 if not inside and idle >= self.stall]
        places = {beats[r][3] for r in waiting}
        if len(beats) > 1 and len(waiting) == len(beats) and len(places) > 1:
            self._mismatch(beats)
            return
        if waiting and stuck:
            rank = max(stuck, key=lambda r: beats[r][1])
            _, idle, _, place = beats[rank]
            others = ", ".join(f"rank {r} (at {beats[r][3]})" for r in waiting)
            who = self._who.get(rank, f"rank {rank}")
            self._lost(rank, who, (
                f"has been idle outside JAX for {idle:.0f} s, at {place}, while "
                f"{others} waited for it inside a JAX call: it never entered the "
                "collective they wait in (a deadlock, a sleep, a read that never "
                f"returns; --stall-timeout {self.stall:g} s)"))

    def _mismatch(self, beats: dict[int, tuple[float, float, bool, str]]) -> None:
        """Every rank idle inside a JAX call, not all at one line: they wait in
        different collectives, which never meet. Named, and every rank stops."""
        idle = min(beat[1] for beat in beats.values())
        where = "; ".join(f"rank {rank} at {place}" for rank, (_, _, _, place)
                          in sorted(beats.items()))
        how = (f"the ranks wait in different collectives, each idle inside a "
               f"JAX call for {idle:.0f} s: {where}. Every rank must run the same "
               "collectives in the same order with the same shapes (look for a "
               "branch on the rank or a shape that depends on the data; "
               f"--stall-timeout {self.stall:g} s)")
        message = f"error: {how}. Every rank stops (exit {EXIT_MISMATCH})."
        self._broadcast(f"stop {EXIT_MISMATCH} {message}")
        if self.on_stop is not None:
            with contextlib.suppress(Exception):  # the launcher's evidence
                self.on_stop(EVERY_RANK, how)
        self._stop(None, "", message, EXIT_MISMATCH)

    def _judge_rank0(self) -> None:
        heard = self._beats[0][0]
        if time.monotonic() - heard > SILENT_SECONDS:
            self._lost(0, _RANK0, _silent(time.monotonic() - heard))

    # -- other ranks: watch rank 0, which speaks for the rest -----------------

    def _watch_rank0(self) -> None:
        assert self._upstream is not None
        buffer = b""
        rank0_ended = False
        while True:
            try:
                data = self._upstream.recv(4096)
            except OSError:
                data = b""
            if not data:
                if not rank0_ended:
                    self._lost(0, _RANK0, _KILLED)
                return
            lines, buffer = _split_lines(buffer + data)
            for line in lines:
                what, _, rest = line.partition(" ")
                if what == "off":
                    return
                if what == "beat":
                    self._beats[0] = _parse_beat(rest)
                elif what == "stop":
                    code, _, message = rest.partition(" ")
                    say_and_exit(message, int(code))
                elif what == "lost":
                    rank, _, rest = rest.partition(" ")
                    who, _, how = rest.partition(": ")
                    self._lost(int(rank), who, how)
                elif what == "failed":
                    rank, code = rest.split()
                    if int(rank) != self.rank:
                        self._peer_failed(int(rank), f"rank {rank}", int(code))
                elif what == "end":
                    rank0_ended = True
                    self._beats[0] = (float("inf"), 0.0, False, "?")  # no more beats
                    if int(rest) != 0:
                        self._peer_failed(0, _RANK0, int(rest))
                elif what == "signal":
                    rank0_ended = True
                    self._lost(0, _RANK0, f"was stopped by {rest}")

    # -- this rank's own end ----------------------------------------------------

    def let_a_lost_peer_speak_first(self, grace: float = 2.0) -> None:
        """Wait up to ``grace`` seconds before this rank reports a failure.

        A collective that lost its peer fails here ("Connection closed by
        peer") at about the moment the watch sees that peer's connection
        close; the watch then ends this rank naming the peer, which is the
        cause. Without a connection to watch, return at once.
        """
        if self._upstream is None and not self._peers:
            return
        time.sleep(grace)

    def end(self, code: int) -> None:
        """Say this rank ended with ``code`` (after publishing its result)."""
        self.in_target = False
        self._send(f"end {code}")

    def signalled(self, name: str) -> None:
        """Say this rank is stopping because of signal ``name``."""
        with self._lock:
            self._stopping = True
        self._send(f"signal {name}")

    def _send(self, line: str) -> None:
        with self._lock:
            if self._upstream is not None:
                with contextlib.suppress(OSError):
                    self._upstream.sendall(f"{line}\n".encode())
            elif self.rank == 0:
                self._broadcast(line)


def _split_lines(data: bytes) -> tuple[list[str], bytes]:
    """The whole lines in ``data``, and the rest (a line still arriving)."""
    *lines, rest = data.split(b"\n")
    return [line.decode() for line in lines], rest


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(256)
        if not chunk:
            raise ConnectionError("peer closed the connection during start-up")
        data += chunk
    return data.decode().strip()


def _parse_beat(text: str) -> tuple[float, float, bool, str]:
    idle, inside, place = text.split(" ", 2)
    return time.monotonic(), float(idle), inside == "1", place


def _silent(seconds: float) -> str:
    return (f"stopped responding: no heartbeat for {seconds:.0f} s (stopped by "
            "SIGSTOP or a debugger, or frozen)")


class Pulse:
    """Where this process's main thread is, and how long it has been idle.

    Idle: the process used less than :data:`IDLE_CPU` CPU seconds per second
    and the main thread stayed in one place, inside a JAX call (waiting for
    peers in a collective, or for the coordination service) or outside one.
    """

    def __init__(self) -> None:
        self._main = threading.main_thread().ident
        self._cpu = time.process_time()
        self._when = time.monotonic()
        self._since = self._when
        self.inside_jax = False
        self.place = "?"

    def sample(self) -> float:
        """Look again; the seconds this process has been idle."""
        now, cpu = time.monotonic(), time.process_time()
        where = _where(self._main)
        inside, place = where if where is not None else (self.inside_jax, self.place)
        busy = cpu - self._cpu >= IDLE_CPU * (now - self._when)
        if busy or where is None or (inside, place) != (self.inside_jax, self.place):
            self._since = now  # (an unreadable stack counts as moving)
        self._cpu, self._when = cpu, now
        self.inside_jax, self.place = inside, place
        return now - self._since


@functools.cache
def _jax_dirs() -> tuple[str, ...]:
    import jax
    import jaxlib
    here = os.path.dirname(os.path.abspath(_compat.__file__))
    return (*(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
              for m in (jax, jaxlib)), os.path.join(here, "_compat.py"))


JAX_WAITS = frozenset({"block_until_ready", "copy_to_host_async", "item",
                       "tolist", "addressable_data", "is_ready"})
"""Methods of a JAX array that wait for its value (or its peers) in C++ on
some releases: ``out.block_until_ready()`` puts no JAX Python frame on the
stack, so the line's own call says the rank waits inside JAX."""


def call_at(code: types.CodeType, at: int) -> ast.Call | None:
    """The call code ``code`` stopped at instruction offset ``at`` (a
    frame's ``f_lasti``) is making: ``out.block_until_ready()``, or
    ``np.asarray(out)`` in ``print(np.asarray(out))``; ``None`` where it is
    not in a call or the source is not at hand. Read from the call's own
    source span (``co_positions``). Reads the source file: call it outside
    :func:`_where`'s walk (I/O lets the watched thread run, for a whole
    raised switch interval)."""
    if at < 0 or not dis.opname[code.co_code[at]].startswith("CALL"):
        return None
    first, last, start, end = list(code.co_positions())[at // 2]
    lines = linecache.getlines(code.co_filename)
    if None in (first, last, start, end) or not lines or last > len(lines):
        return None
    text = "".join(lines[first - 1:last]).encode()
    cut = len(text) - len(lines[last - 1].encode()) + end
    source = text[start:cut].decode(errors="replace")
    try:
        call = ast.parse(source.strip(), mode="eval").body
    except SyntaxError:
        return None
    return call if isinstance(call, ast.Call) else None


def jax_in_call(call: ast.Call | None, frame: types.FrameType) -> str | None:
    """What makes ``call``, in ``frame``, a wait inside JAX with no JAX frame
    on the stack: its callee is a function JAX compiled and runs in C++
    (``step`` in ``y = step(x)``: ``jax.jit``'s), or an argument is a JAX
    array (``out`` in ``np.asarray(out)`` or ``print(out.sum())``: the call
    waits for its value). Names are looked up, and attributes of modules
    only (a property of another object could run code); ``None`` where
    nothing in the call is JAX's."""
    if call is None:
        return None
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)  # the frame's namespaces hold still meanwhile
    try:
        if _is_jax(_resolve(call.func, frame, modules_only=True)):
            return f"{ast.unparse(call.func)}()"
        for arg in (*call.args, *(k.value for k in call.keywords)):
            root = arg
            while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and _is_jax(
                    _resolve(root, frame, modules_only=True)):
                return f"{ast.unparse(call.func)}() of {root.id}"
    except Exception:  # a racing read: no evidence
        return None
    finally:
        sys.setswitchinterval(interval)
    return None


def _resolve(expr: ast.expr, frame: types.FrameType, *, modules_only: bool
             ) -> Any:
    path = []
    while isinstance(expr, ast.Attribute):
        path.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return _MISSING
    found: Any = _MISSING
    for space in (frame.f_locals, frame.f_globals, frame.f_builtins):
        found = space.get(expr.id, _MISSING)
        if found is not _MISSING:
            break
    for name in reversed(path):
        if modules_only and not isinstance(found, types.ModuleType):
            return _MISSING
        found = getattr(found, name, _MISSING)
    return found


def _is_jax(value: Any) -> bool:
    """A JAX object implemented in C++: a jitted function, an array."""
    module = getattr(type(value), "__module__", None) or ""
    return value is not _MISSING and module.split(".")[0] in ("jax", "jaxlib")


_MISSING = object()


def _where(thread: int | None) -> tuple[bool, str] | None:
    """(whether thread ``thread`` is inside a JAX call, the innermost place
    outside JAX as ``file:line (function)``); ``None`` where its stack could
    not be read this time. The package's ``_compat`` counts as JAX: it only
    wraps JAX's runtime (the key-value store).

    Another thread's frames change under a reader whenever that thread runs
    (CPython 3.11 once handed back a ``str`` for ``f_back`` here), so the walk
    runs with the switch interval raised, every object is checked, and any
    error reads as "unknown": the caller then counts the rank as moving,
    never as stuck.
    """
    if thread is None:
        return None
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)  # no other thread runs Python during the walk
    try:
        frame = sys._current_frames().get(thread)
        jax_dirs = _jax_dirs()

        def in_jax(f: Any) -> bool:
            return isinstance(f, types.FrameType) and isinstance(
                f.f_code.co_filename, str) and f.f_code.co_filename.startswith(
                    jax_dirs)
        if not isinstance(frame, types.FrameType):
            return None
        inside = in_jax(frame)
        while in_jax(frame):
            frame = frame.f_back
        if frame is None:
            return inside, "?"
        if not isinstance(frame, types.FrameType):
            return None
        code, at = frame.f_code, frame.f_lasti
        place = (f"{os.path.basename(code.co_filename)}:{frame.f_lineno} "
                 f"({code.co_name})")
    except Exception:  # a racing read: unknown this time
        return None
    finally:
        sys.setswitchinterval(interval)
    if not inside:  # a wait JAX implements in C++ leaves no JAX frame
        try:
            call = call_at(code, at)
        except Exception:  # source changed or unreadable: no evidence
            call = None
        func = None if call is None else call.func
        if isinstance(func, ast.Attribute) and func.attr in JAX_WAITS:
            return True, f"{place} in .{func.attr}()"
        jax_part = jax_in_call(call, frame)
        if jax_part is not None:
            return True, f"{place} in {jax_part}"
    return inside, place


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(rank: int, started: float,
                    before_exit: Callable[[str], None] = lambda name: None,
                    signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
    """End this process at once on SIGTERM or SIGINT, naming the signal.

    The C-level handler Python installs writes each signal's number to the
    wakeup file descriptor, whatever the main thread is doing; a thread reads
    it, calls ``before_exit(signal name)`` and exits with 128 + the number.
    Installed after ``jax.distributed.initialize``, it replaces JAX's
    preemption notifier, which would otherwise swallow SIGTERM. Must be called
    from the main thread.
    """
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    for signum in signals:
        signal.signal(signum, lambda *_: None)  # the thread below does the work
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    stopping = {int(s) for s in signals}

    def watch() -> None:
        number = reader.recv(1)[0]
        while number not in stopping:  # another signal with a Python handler
            number = reader.recv(1)[0]
        name = signal.Signals(number).name
        before_exit(name)
        say_and_exit(
            f"error: rank {rank} was stopped by {name} after "
            f"{time.monotonic() - started:.1f} s (sent by the scheduler or the "
            "launcher: scancel, kubectl delete, mpirun or srun ending the job, "
            "a preemption). To checkpoint on preemption instead, run with "
            "--on-sigterm jax and call jax.experimental.multihost_utils."
            "reached_preemption_sync_point(step) in your loop.",
            128 + number)

    threading.Thread(target=watch, name="signal-watch", daemon=True).start()
    # keep the socketpair alive for the process's lifetime
    stop_on_signals.sockets = (reader, writer)  # type: ignore[attr-defined]
