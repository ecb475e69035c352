"""Ranks watch each other, and a signal stops a rank at once, saying so.

Two ways a rank of a cluster job ends without a word from this package:

* **it is killed** (``SIGKILL``, the out-of-memory killer, a crash inside
  XLA): its peers would wait in their next collective, until JAX's heartbeat
  declares it dead and aborts them with a C++ stack trace (30 s and more);
* **it is sent SIGTERM** (``scancel``, ``kubectl delete``, ``mpirun`` ending
  the job, a preemption): JAX's preemption notifier catches the signal and
  the rank carries on as if nothing happened.

:class:`PeerWatch` keeps one TCP connection from every rank to rank 0 (its
address travels through the coordination service's key-value store). The
kernel closes a process's connections when it dies, however it dies, so a
rank that ends without saying goodbye (``end``) is seen at once: rank 0 tells
the others, and every rank stops with a message naming the rank that went
and :data:`EXIT_PEER_LOST`. A rank that ends with a failed result says so
first; its peers stop if they are still running their target (they would
wait for it in a collective).

:func:`stop_on_signals` makes SIGTERM and SIGINT end the rank within a
moment, even while it waits inside a collective (a thread reads the signal
from Python's wakeup file descriptor, so the main thread need not return to
Python), with a message naming the signal and exit code 128 + its number.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

from collectives import _compat

EXIT_PEER_LOST = 4
"""Exit code of a rank stopped because another rank ended without a result."""

_ANNOUNCE_KEY = "collectives/watch/rank0"
_KILLED = ("ended without reporting a result: it was killed (SIGKILL, the "
           "out-of-memory killer) or crashed outside Python")
_RANK0 = "rank 0 (the coordinator)"


def say_and_exit(message: str, code: int) -> None:
    """Print ``message`` to stderr and end the process at once (no JAX
    shutdown barrier: peers may be stuck waiting for this process)."""
    try:
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
    """

    def __init__(self, rank: int, num_processes: int, address: str,
                 timeout: float):
        self.rank = rank
        self.num_processes = num_processes
        self.address = address
        self.timeout = timeout
        self.in_target = True  # False once this rank is reporting its result
        self._lock = threading.Lock()
        self._peers: dict[int, socket.socket] = {}  # rank 0: one per other rank
        self._who: dict[int, str] = {}
        self._reported: set[int] = set()  # ranks that said how they ended
        self._upstream: socket.socket | None = None  # other ranks: to rank 0

    # -- start-up ------------------------------------------------------------

    def start(self) -> None:
        """Connect the ranks (needs ``jax.distributed.initialize`` first).

        Where rank 0 cannot listen on ``address`` the watch stays off (a
        note says so) and a lost rank is found by JAX's heartbeat instead.
        """
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
                        self._lost(self._who[rank], _KILLED)
                    continue
                lines, buffers[rank] = _split_lines(buffers[rank] + data)
                for line in lines:
                    self._heard(rank, line)

    def _heard(self, rank: int, line: str) -> None:
        what, *rest = line.split(" ", 1)
        if what == "end":
            code = int(rest[0])
            self._reported.add(rank)
            if code != 0:
                self._broadcast(f"failed {rank} {code}")
                self._peer_failed(self._who[rank], code)
        elif what == "signal":
            self._reported.add(rank)
            self._lost(self._who[rank], f"was stopped by {rest[0]}")

    def _broadcast(self, line: str) -> None:
        for conn in self._peers.values():
            with contextlib.suppress(OSError):
                conn.sendall(f"{line}\n".encode())

    def _lost(self, who: str, how: str) -> None:
        """A peer went without a result: tell the others, then stop."""
        if self.rank == 0:
            self._broadcast(f"lost {who}: {how}")
        say_and_exit(
            f"error: {who} {how}. Rank {self.rank} stops too, so the job "
            f"fails now instead of waiting in a collective (exit "
            f"{EXIT_PEER_LOST}).", EXIT_PEER_LOST)

    def _peer_failed(self, who: str, code: int) -> None:
        """A peer reported a failure: a rank still in its target would wait
        for it in a collective; stop it, naming the peer."""
        if self.in_target:
            say_and_exit(
                f"error: {who} failed (exit {code}; its error is in its own "
                f"output). Rank {self.rank} stops too: it would wait for that "
                "rank in its next collective.", 1)

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
                    self._lost(_RANK0, _KILLED)
                return
            lines, buffer = _split_lines(buffer + data)
            for line in lines:
                what, _, rest = line.partition(" ")
                if what == "off":
                    return
                if what == "lost":
                    who, _, how = rest.partition(": ")
                    self._lost(who, how)
                elif what == "failed":
                    rank, code = rest.split()
                    if int(rank) != self.rank:
                        self._peer_failed(f"rank {rank}", int(code))
                elif what == "end":
                    rank0_ended = True
                    if int(rest) != 0:
                        self._peer_failed(_RANK0, int(rest))
                elif what == "signal":
                    rank0_ended = True
                    self._lost(_RANK0, f"was stopped by {rest}")

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
