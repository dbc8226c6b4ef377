"""``burstsched serve --workers N``: N router processes on one port, each the whole router.

The parent binds the listening sockets once, then starts N worker processes (``burstsched serve`` again, with
internal flags naming the inherited socket descriptors and a link back to the parent). Each worker runs the
full app: its own pool, scheduler, prefix index and metrics; the workers share nothing and never talk. They
place a new prefix alike when their config says so (the ``rendezvous-scorer``), by the same rule as separate
routers do.

Sockets (``--worker-sockets``):

- ``reuseport`` (default): one listening socket per worker on the same port, each with ``SO_REUSEPORT``; the
  kernel spreads new connections over them by a hash of the connection's addresses, so the workers get even
  shares of connections whatever their speed. The parent keeps every worker's socket open: connections
  hashed to a worker that died wait in its socket's backlog for its replacement (none is refused).
- ``shared``: one listening socket that every worker accepts from. A worker accepts as it can, so a busy
  worker leaves new connections to idle ones, but connections are not spread evenly (one worker often takes
  most of a burst's connections).

The admin port (``auth.admin_port``), when set, is per worker: worker ``i`` serves ``/metrics`` and
``/admin/*`` on ``admin_port + i``, so a monitoring system can scrape each worker's metrics. Through the
shared API port a scrape reaches whichever worker the kernel picks.

Supervision: the parent forwards SIGTERM and SIGINT to every worker as SIGTERM (each drains its in-flight
requests), waits for them within the drain timeout plus a margin, then kills what is left. A worker that
exits while the parent is not stopping is started again after a backoff (doubling per quick failure). If
any worker fails to start at first, the parent stops the others and exits 1. A worker whose parent is gone
(its link closes) shuts down as on SIGTERM. SIGHUP to the parent is forwarded to every worker: each reloads
its config (``burstsched.server.reload``).
"""

from __future__ import annotations

import logging
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Literal

log = logging.getLogger(__name__)

SocketMode = Literal["reuseport", "shared"]
SOCKET_MODES: tuple[SocketMode, ...] = ("reuseport", "shared")
WORKER_HEADER = "x-burstsched-worker"
BACKLOG = 2048  # uvicorn's default

_READY = b"r"

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before starting a worker again: ``base_s`` doubled per quick failure, at most ``max_s``; a
    worker that stayed up ``stable_s`` after it was ready counts as a success (the next failure is the first).
    """

    base_s: float = 0.5
    max_s: float = 30.0
    stable_s: float = 10.0

    def delay(self, failures: int) -> float:
        return float(min(self.max_s, self.base_s * 2 ** max(0, failures - 1)))


# --- sockets ---------------------------------------------------------------------------------------------


def listen_socket(host: str, port: int, *, reuseport: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port``, listening, inheritable."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def worker_sockets(
    host: str, port: int, admin_port: int | None, workers: int, mode: SocketMode
) -> list[list[socket.socket]]:
    """Each worker's listening sockets: the API's (shared or its own ``SO_REUSEPORT`` one), then its admin
    socket on ``admin_port + i`` when there is an admin port. Raises ``OSError`` (every socket closed)."""
    made: list[socket.socket] = []
    try:
        if mode == "shared":
            shared = listen_socket(host, port)
            made.append(shared)
            api = [shared] * workers
        else:
            first = listen_socket(host, port, reuseport=True)
            made.append(first)
            bound = first.getsockname()[1]  # port 0: the others join the one the first was given
            for _ in range(workers - 1):
                made.append(listen_socket(host, bound, reuseport=True))
            api = list(made)
        per_worker = [[sock] for sock in api]
        if admin_port is not None:
            for i, sockets in enumerate(per_worker):
                admin = listen_socket(host, admin_port + i if admin_port else 0)
                made.append(admin)
                sockets.append(admin)
    except OSError:
        for sock in made:
            sock.close()
        raise
    return per_worker


def adopt_sockets(fds: Sequence[int]) -> list[socket.socket]:
    """The listening sockets a worker inherited (their family and type read from the descriptors)."""
    return [socket.socket(fileno=fd) for fd in fds]


# --- the worker's side -----------------------------------------------------------------------------------


class WorkerLink:
    """A worker's end of the socket pair to its parent: it says "ready" once serving, and sees the parent go
    (end of file) so that an orphaned worker shuts down."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=fd)

    def ready(self) -> None:
        try:
            self._sock.sendall(_READY)
        except OSError:
            log.warning("the supervising process is gone")

    def watch_parent(self, on_gone: Callable[[], None]) -> threading.Thread:
        """Call ``on_gone`` (from a daemon thread) when the parent's end closes."""

        def watch() -> None:
            while True:
                try:
                    data = self._sock.recv(64)
                except OSError:
                    data = b""
                if not data:
                    on_gone()
                    return

        thread = threading.Thread(target=watch, name="burstsched-parent-link", daemon=True)
        thread.start()
        return thread


# --- the parent's side -----------------------------------------------------------------------------------


@dataclass
class _Slot:
    index: int
    sockets: list[socket.socket]
    proc: subprocess.Popen[bytes] | None = None
    link: socket.socket | None = None
    started_at: float = 0.0
    ready_at: float | None = None
    reload_pending: bool = False
    """SIGHUP came while it was starting: forwarded once it is serving (its handler is installed by then)."""
    failures: int = 0
    restart_at: float | None = None
    pids: list[int] = field(default_factory=list)


WorkerCommand = Callable[[int, Sequence[int], int], list[str]]
"""(worker index, its listening socket descriptors, its link descriptor) -> the worker's command line."""


class Supervisor:
    """Starts ``workers`` processes, keeps them running, stops them on SIGTERM/SIGINT (see the module doc).

    ``command`` builds a worker's command line; ``sockets[i]`` are worker ``i``'s listening sockets (kept
    open here for its replacements). ``ready_timeout_s``: a worker not serving by then is a failed start.
    ``stop_timeout_s``: how long stopping workers may take to drain before they are killed.
    """

    def __init__(
        self,
        command: WorkerCommand,
        sockets: Sequence[Sequence[socket.socket]],
        *,
        ready_timeout_s: float = 60.0,
        stop_timeout_s: float = 30.0,
        backoff: Backoff | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._command = command
        self._slots = [_Slot(i, list(s)) for i, s in enumerate(sockets)]
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._backoff = backoff if backoff is not None else Backoff()
        self._clock = clock
        self._selector = selectors.DefaultSelector()
        self._stop_signal: int | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    # public ------------------------------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until a stop signal (0) or a failed first start (1)."""
        previous = self._install_signals()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            for slot in self._slots:
                self._spawn(slot)
            if not self._wait_all_ready():
                self._stop_all()
                return 0 if self._stop_signal is not None else 1
            log.info("%d workers serving", len(self._slots))
            self._supervise()
            self._stop_all()
            return 0
        except BaseException:
            self._stop_all()
            raise
        finally:
            self._restore_signals(previous)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def stop(self) -> None:
        """Ask :meth:`run` to stop the workers and return (as SIGTERM does); safe from any thread."""
        self._stop_signal = signal.SIGTERM
        self._wake()

    # signals ------------------------------------------------------------------------------------------

    def _install_signals(self) -> dict[int, object]:
        previous: dict[int, object] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous  # tests drive a supervisor in a thread: they call stop()
        previous[-1] = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, self._on_stop_signal)
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._on_child)
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_hangup)
        return previous

    def _restore_signals(self, previous: dict[int, object]) -> None:
        for signum, handler in previous.items():
            if signum == -1:
                assert isinstance(handler, int)
                signal.set_wakeup_fd(handler)
            else:
                signal.signal(signum, handler)  # type: ignore[arg-type]

    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = signum

    def _on_hangup(self, signum: int, frame: FrameType | None) -> None:
        """SIGHUP: each serving worker reloads its config (see burstsched.server.reload); one still starting
        gets it once it is serving (it may have read the config before the change)."""
        for slot in self._slots:
            if slot.ready_at is None:
                slot.reload_pending = True
            else:
                self._hang_up(slot)

    def _hang_up(self, slot: _Slot) -> None:
        slot.reload_pending = False
        proc = slot.proc
        if proc is not None and proc.returncode is None:
            try:
                proc.send_signal(signal.SIGHUP)
            except OSError:
                pass  # it just exited: its replacement reads the config afresh

    def _on_child(self, signum: int, frame: FrameType | None) -> None:
        pass  # the wakeup descriptor wakes the selector

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    # workers ------------------------------------------------------------------------------------------

    def _spawn(self, slot: _Slot) -> None:
        parent_end, child_end = socket.socketpair()
        fds = [s.fileno() for s in slot.sockets]
        args = self._command(slot.index, fds, child_end.fileno())
        try:
            slot.proc = subprocess.Popen(args, pass_fds=[*fds, child_end.fileno()], stdin=subprocess.DEVNULL)
        except OSError:
            parent_end.close()
            raise
        finally:
            child_end.close()
        slot.link = parent_end
        slot.started_at = self._clock()
        slot.ready_at = None
        slot.reload_pending = False  # it reads the config as it starts
        slot.restart_at = None
        slot.pids.append(slot.proc.pid)
        self._selector.register(parent_end, selectors.EVENT_READ, slot)
        log.info("worker %d started: pid %d", slot.index, slot.proc.pid)

    def _drop_link(self, slot: _Slot) -> None:
        if slot.link is not None:
            self._selector.unregister(slot.link)
            slot.link.close()
            slot.link = None

    def _poll_events(self, timeout: float) -> None:
        for key, _ in self._selector.select(max(0.0, timeout)):
            slot = key.data
            if slot is None:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except (BlockingIOError, InterruptedError):
                    pass
                continue
            assert isinstance(slot, _Slot) and slot.link is not None
            try:
                data = slot.link.recv(64)
            except OSError:
                data = b""
            if _READY in data and slot.ready_at is None:
                slot.ready_at = self._clock()
                log.info("worker %d ready", slot.index)
                if slot.reload_pending:
                    self._hang_up(slot)
            if not data:
                self._drop_link(slot)  # it is exiting: the next poll of its process reaps it

    def _wait_all_ready(self) -> bool:
        deadline = self._clock() + self._ready_timeout_s
        while self._stop_signal is None:
            for slot in self._slots:
                assert slot.proc is not None
                if slot.proc.poll() is not None:
                    log.error("worker %d exited with %s before serving", slot.index, slot.proc.returncode)
                    return False
            if all(slot.ready_at is not None for slot in self._slots):
                return True
            now = self._clock()
            if now >= deadline:
                log.error("workers not serving after %.0f s", self._ready_timeout_s)
                return False
            self._poll_events(min(0.5, deadline - now))
        return False

    def _supervise(self) -> None:
        while self._stop_signal is None:
            now = self._clock()
            for slot in self._slots:
                if slot.proc is not None and slot.proc.poll() is None and slot.ready_at is None:
                    if now - slot.started_at > self._ready_timeout_s:
                        log.error(
                            "worker %d not serving after %.0f s: killed", slot.index, now - slot.started_at
                        )
                        slot.proc.kill()
                if slot.proc is not None and slot.proc.poll() is not None:
                    self._exited(slot, now)
                if slot.restart_at is not None and now >= slot.restart_at:
                    self._spawn(slot)
            waits = [s.restart_at - now for s in self._slots if s.restart_at is not None]
            self._poll_events(min([1.0, *waits]))

    def _exited(self, slot: _Slot, now: float) -> None:
        assert slot.proc is not None
        code = slot.proc.returncode
        stable = slot.ready_at is not None and now - slot.ready_at >= self._backoff.stable_s
        slot.failures = 1 if stable else slot.failures + 1
        delay = self._backoff.delay(slot.failures)
        log.warning(
            "worker %d (pid %d) exited with %s; starting it again in %.1f s",
            slot.index,
            slot.proc.pid,
            code,
            delay,
        )
        self._drop_link(slot)
        slot.proc = None
        slot.restart_at = now + delay

    def _stop_all(self) -> None:
        live = [s for s in self._slots if s.proc is not None and s.proc.poll() is None]
        for slot in live:
            assert slot.proc is not None
            try:
                slot.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = self._clock() + self._stop_timeout_s
        for slot in live:
            assert slot.proc is not None
            try:
                slot.proc.wait(timeout=max(0.0, deadline - self._clock()))
            except subprocess.TimeoutExpired:
                log.error("worker %d (pid %d) did not stop in time: killed", slot.index, slot.proc.pid)
                slot.proc.kill()
                slot.proc.wait()
        for slot in self._slots:
            self._drop_link(slot)
            slot.restart_at = None

    @property
    def pids(self) -> list[list[int]]:
        """Every process each worker slot has run, oldest first."""
        return [list(s.pids) for s in self._slots]


def close_all(sockets: Sequence[Sequence[socket.socket]]) -> None:
    seen: set[int] = set()
    for group in sockets:
        for sock in group:
            if id(sock) not in seen:
                seen.add(id(sock))
                sock.close()
