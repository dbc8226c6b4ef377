"""The traffic recorder: the event loop formats each request's line; a writer thread only writes them.

:meth:`Recorder.record` is the only call on a request's path, after the response has been sent (no client
waits on it): it formats the request's line (:func:`~burstsched.recording.line.format_line`, from the
request's primitives: ids, counts, times, the response's tail; the payload only with ``include_text``) and
appends the finished ``bytes`` to a deque, no lock, no I/O. A malformed entry never raises into the
request: it is counted in ``failed`` and logged. Every ``flush_interval_ms`` the writer thread takes the
queued lines off the deque (C calls only, no Python code per line) and appends them to the rotating file in
one write, whose syscall releases the GIL. The deque is unbounded: a burst is never dropped, it waits for
the next flush.

Why the loop formats: a thread doing Python work while the loop is busy pays for every GIL round trip
(about 1 ms of CPU each under load, measured) and for cold caches after each switch; formatting there cost
12-43 µs per line against 5-7 µs in a tight loop. On the loop, right after the request, ``record`` costs
14-20 µs; the writer now takes the GIL twice per flush, not once per 5 ms of formatting (measured costs:
the README).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import repeat, starmap
from typing import Any, Protocol

from burstsched.admission import Admitted
from burstsched.config import PrefixHashingConfig, RecordingConfig
from burstsched.dispatch import Served
from burstsched.framework import ApiKind, SchedRequest
from burstsched.recording.line import Entry, format_line, format_replica_line
from burstsched.recording.writer import RotatingFile

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Geometry = Callable[[str], tuple[int | None, int | None]]
"""``geometry(endpoint) -> (block_size, num_gpu_blocks)`` as last reported (None: unknown)."""


class RecordedRequest(Protocol):
    """What the recorder reads of a client request (the front's ``ParsedRequest``)."""

    @property
    def api(self) -> ApiKind: ...

    @property
    def payload(self) -> dict[str, Any]: ...

    @property
    def stream(self) -> bool: ...


class Recorder:
    """Records dispatched requests as JSON lines; :meth:`start` and :meth:`close` bracket its thread.

    ``clock`` is the monotonic clock the request's times come from (``arrived`` and the dispatcher's
    ``first_byte_at``); ``wall_clock`` turns them into Unix times for the file. With ``geometry``, a
    replica's KV-cache geometry gets a line of its own (``kind: replica``) before the first request line
    that names it, again when it changes, and again in each new file after a rotation: the replay sizes its
    simulated caches from it.
    """

    def __init__(
        self,
        settings: RecordingConfig,
        hashing: PrefixHashingConfig,
        *,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        geometry: Geometry | None = None,
    ) -> None:
        self._settings = settings
        self._include_text = settings.include_text
        self._decisions = settings.decisions
        self._bytes_per_token = hashing.bytes_per_token
        self._clock = clock
        self._wall_offset = wall_clock() - clock()
        self._pending: deque[bytes] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: RotatingFile | None = None
        self.written = 0
        self._malformed = 0  # counted by the event loop
        self._unwritten = 0  # counted by the writer thread
        self._geometry = geometry
        self._geometry_seen: dict[str, tuple[int | None, int | None]] = {}
        self._geometry_lines: dict[str, bytes] = {}  # the loop writes it, the writer thread copies it

    # -- the request path ------------------------------------------------------------------------
    def record(
        self,
        arrived: float,
        parsed: RecordedRequest,
        request: SchedRequest,
        admitted: Admitted,
        served: Served,
    ) -> None:
        """Format one finished request's line and queue it (``arrived``: ``clock()`` when it came in).

        Never blocks, never raises: a line that cannot be formatted is counted in :attr:`failed` and logged.
        """
        payload = parsed.payload
        entry: Entry = (
            arrived,
            self._clock(),
            request.request_id,
            parsed.api,
            request.model,
            parsed.stream,
            request.block_tokens,
            request.block_hashes,
            request.prompt_tokens,
            payload.get("max_completion_tokens"),
            payload.get("max_tokens"),
            admitted.window_id,
            admitted.group_id,
            admitted.role,
            admitted.group_size,
            admitted.waited_s,
            served.endpoint,
            served.outcome,
            served.first_byte_at,
            served.response_tail,
            payload if self._include_text else None,
            admitted.decision if self._decisions else None,
        )
        try:
            line = format_line(entry, self._wall_offset, self._bytes_per_token, self._include_text)
        except Exception:  # a malformed entry must never reach the request path
            self._malformed += 1
            log.exception("could not encode a recorded request")
            return
        endpoint = served.endpoint
        if self._geometry is not None and endpoint is not None:
            self._note_geometry(endpoint, self._geometry(endpoint))
        self._pending.append(line)

    def _note_geometry(self, endpoint: str, geometry: tuple[int | None, int | None]) -> None:
        """Queue ``endpoint``'s geometry line when it is new or changed (a dict lookup when it is not)."""
        if self._geometry_seen.get(endpoint) == geometry:
            return
        self._geometry_seen[endpoint] = geometry
        block_size, blocks = geometry
        if block_size is not None and blocks is not None:
            wall = self._clock() + self._wall_offset
            line = format_replica_line(wall, endpoint, block_size, blocks)
            self._geometry_lines[endpoint] = line
            self._pending.append(line)

    def _header(self) -> bytes:
        """Every replica's latest geometry line, at the top of each rotated-in file (the writer thread)."""
        return b"".join(list(self._geometry_lines.values()))  # list(): one C call under the GIL

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Recorder:
        s = self._settings
        self._file = RotatingFile(s.path, s.max_bytes, s.backups, header=self._header)
        self._thread = threading.Thread(target=self._run, name="burstsched-recorder", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Write what is queued, stop the thread, close the file (blocking: call it from a thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    @property
    def pending(self) -> int:
        """Lines formatted and not yet written."""
        return len(self._pending)

    @property
    def failed(self) -> int:
        """Requests without a line: entries that could not be formatted, lines that could not be written."""
        return self._malformed + self._unwritten

    # -- the writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        interval = self._settings.flush_interval_ms / 1000.0
        while not self._stop.wait(interval):
            self.flush()

    def flush(self) -> None:
        """Write every queued line in one write (the writer thread; :meth:`close` and tests call it too)."""
        pending = self._pending
        count = len(pending)  # the loop only appends: these lines stay at the left until taken
        if not count:
            return
        data = b"".join(starmap(pending.popleft, repeat((), count)))  # C calls only, no frame per line
        if self._file is None:
            return
        try:
            self._file.write(data)
            self.written += count
        except OSError as exc:
            self._unwritten += count
            log.warning("recording: could not write %d lines to %s: %s", count, self._file.path, exc)
