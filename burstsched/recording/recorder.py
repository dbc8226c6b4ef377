"""The traffic recorder: a request's path only queues what its line needs; the loop formats and writes
the lines in batches.

:meth:`Recorder.record` is the only call on a request's path, after the response has been sent (no client
waits on it): it appends one flat tuple of the line's primitives (ids, counts, times, the response's tail;
of the payload only its output limits, and its prompt text with ``include_text``) to a deque: no
formatting, no I/O, no object of the request kept. Every ``flush_interval_ms``, :meth:`Recorder.run` (a
task of the app's lifespan) calls :meth:`Recorder.flush`, which makes each queued request a ``msgspec``
struct (:func:`~burstsched.recording.line.line_of`: its usage read, its times worked out), encodes them
in one C call (:func:`~burstsched.recording.line.encode_lines`) and appends the lines to the rotating file
in one ``write``, as nginx writes a buffered access log: from the event loop, one system call per flush,
into the page cache. It formats :data:`FLUSH_SLICE` requests at a time and lets the loop serve requests
between slices, so that a flush after a busy interval never holds the loop for long. A request whose line
cannot be formatted is counted in ``failed`` and logged, never raised.

Why not a thread: a writer thread pays for every GIL round trip while the loop is busy (about 1 ms of CPU
per wake-up, measured). Why not format on the request's path: right after a request the caches are cold
with its own work, and a line cost more there than in a batch (measured costs: the README). The trade: the
loop blocks for as long as the file's ``write`` does, which on a local disk is a copy into the page cache;
a disk that stalls writes stalls the router too.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from itertools import repeat, starmap
from typing import Any, Protocol

import anyio
import anyio.lowlevel

from burstsched.admission import Admitted
from burstsched.config import PrefixHashingConfig, RecordingConfig
from burstsched.dispatch import Served
from burstsched.framework import ApiKind, SchedRequest
from burstsched.recording.line import (
    ENDPOINT,
    Entry,
    Line,
    encode_lines,
    format_replica_line,
    hex_chain,
    line_of,
    prompt_text_of,
)
from burstsched.recording.writer import RotatingFile

log = logging.getLogger(__name__)

FLUSH_SLICE = 128
"""Requests a flush formats before it lets the loop serve again (about 1 ms of formatting)."""

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
    """Records dispatched requests as JSON lines; :meth:`start` and :meth:`close` bracket its file, and
    :meth:`run` flushes every ``flush_interval_ms`` in between.

    ``clock`` is the monotonic clock the request's times come from (``arrived`` and the dispatcher's
    ``first_byte_at``); ``wall_clock`` turns them into Unix times for the file. With ``geometry``, a
    replica's KV-cache geometry gets a line of its own (``kind: replica``) before the first request line
    that names it, again in the first flush that finds it changed, and again in each new file after a
    rotation: the replay sizes its simulated caches from it. ``flush_cpu_s`` is the CPU time (the loop
    thread's) the flushes have taken, formatting included: the per-request cost :meth:`record` leaves.
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
        self._queued: deque[Entry] = deque()
        self._formatted: list[bytes] = []
        """Encoded and not yet written: slices of request lines, and geometry lines."""
        self._formatted_lines = 0
        """Request lines in ``_formatted``."""
        self._file: RotatingFile | None = None
        self.written = 0
        self._malformed = 0
        self._unwritten = 0
        self.flush_cpu_s = 0.0
        self._geometry = geometry
        self._geometry_seen: dict[str, tuple[int | None, int | None]] = {}
        self._geometry_lines: dict[str, bytes] = {}

    # -- the request path ------------------------------------------------------------------------
    def record(
        self,
        arrived: float,
        parsed: RecordedRequest,
        request: SchedRequest,
        admitted: Admitted,
        served: Served,
        queued_s: float = 0.0,
    ) -> None:
        """Queue one finished request's fields (``arrived``: ``clock()`` when it came in); never blocks,
        never raises.

        Primitives only, read off the request's objects (none of them is kept but the decision, with
        ``decisions``; of the payload only its two output limits, and its prompt text with
        ``include_text``); the line is formatted at the next :meth:`flush`. The hash chain is turned into
        hex here, while its ints are still in the CPU's caches (at the flush, 16 scattered ints cost 1-2 µs
        more to read).
        """
        payload = parsed.payload
        try:
            entry: Entry = (
                arrived,
                self._clock(),
                request.request_id,
                parsed.api,
                request.model,
                parsed.stream,
                request.block_tokens,
                hex_chain(request.block_hashes),
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
                prompt_text_of(payload) if self._include_text else None,
                admitted.decision if self._decisions else None,
                queued_s,
            )
        except Exception:  # e.g. a hash past 64 bits: the request must never see it
            self._malformed += 1
            log.exception("could not record a request")
            return
        self._queued.append(entry)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Recorder:
        s = self._settings
        self._file = RotatingFile(s.path, s.max_bytes, s.backups, header=self._header)
        return self

    async def run(self) -> None:
        """Flush every ``flush_interval_ms`` until cancelled (a task of the app's lifespan).

        The requests queued when a flush starts are formatted :data:`FLUSH_SLICE` at a time, the loop
        serving requests between slices, and written in one write: a flush holds the loop about a
        millisecond at a time, however busy the router was. Cancelled between slices, it leaves the
        formatted lines for :meth:`close`.
        """
        interval = self._settings.flush_interval_ms / 1000.0
        while True:
            await anyio.sleep(interval)
            count = len(self._queued)
            while count > FLUSH_SLICE:
                self._format(FLUSH_SLICE)
                count -= FLUSH_SLICE
                await anyio.lowlevel.checkpoint()
            self._format(count)
            self._write()

    def close(self) -> None:
        """Write what is queued and close the file."""
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    @property
    def pending(self) -> int:
        """Requests recorded and not yet written."""
        return len(self._queued) + self._formatted_lines

    @property
    def failed(self) -> int:
        """Requests without a line: entries that could not be formatted, lines that could not be written."""
        return self._malformed + self._unwritten

    # -- the batch ---------------------------------------------------------------------------------
    def flush(self) -> None:
        """Format every queued request and write the lines in one write (:meth:`close` and tests)."""
        self._format(len(self._queued))
        self._write()

    def _format(self, count: int) -> None:
        """Format the first ``count`` queued requests onto the lines to write: each entry made a
        :class:`~burstsched.recording.line.Line`, the slice's lines encoded in one call (cut where a
        replica's geometry line goes in before them)."""
        if not count:
            return
        started = time.thread_time()
        offset, bytes_per_token, with_text = self._wall_offset, self._bytes_per_token, self._include_text
        batch: list[Line] = []
        checked: set[str | None] = set()  # endpoints whose geometry this slice has compared
        for entry in starmap(self._queued.popleft, repeat((), count)):  # C calls only to take them
            try:
                line = line_of(entry, offset, bytes_per_token, with_text)
            except Exception:  # a malformed entry must never stop the others
                self._malformed += 1
                log.exception("could not encode a recorded request")
                continue
            endpoint = entry[ENDPOINT]
            if endpoint not in checked:
                checked.add(endpoint)
                geometry = self._geometry_line(endpoint)
                if geometry:
                    self._encode(batch)
                    batch = []
                    self._formatted.append(geometry)
            batch.append(line)
        self._encode(batch)
        self.flush_cpu_s += time.thread_time() - started

    def _encode(self, batch: list[Line]) -> None:
        """Encode ``batch`` onto the lines to write; a line that cannot be encoded is counted and left out."""
        if not batch:
            return
        try:
            self._formatted.append(encode_lines(batch))
            self._formatted_lines += len(batch)
            return
        except Exception:  # one bad line (e.g. text that is not JSON): encode them one by one
            pass
        for line in batch:
            try:
                self._formatted.append(encode_lines((line,)))
                self._formatted_lines += 1
            except Exception:
                self._malformed += 1
                log.exception("could not encode a recorded request")

    def _write(self) -> None:
        """Append the formatted lines to the file in one write."""
        chunks, count = self._formatted, self._formatted_lines
        if not chunks or self._file is None:
            return
        started = time.thread_time()
        self._formatted, self._formatted_lines = [], 0
        try:
            self._file.write(b"".join(chunks))
            self.written += count
        except OSError as exc:
            self._unwritten += count
            log.warning("recording: could not write %d lines to %s: %s", count, self._file.path, exc)
        self.flush_cpu_s += time.thread_time() - started

    def _geometry_line(self, endpoint: str | None) -> bytes:
        """``endpoint``'s geometry line when it is new or has changed since the last one, else b"" (also
        while it is unknown); the latest is kept for the rotation header."""
        if self._geometry is None or endpoint is None:
            return b""
        geometry = self._geometry(endpoint)
        if self._geometry_seen.get(endpoint) == geometry:
            return b""
        self._geometry_seen[endpoint] = geometry
        block_size, blocks = geometry
        if block_size is None or blocks is None:
            return b""
        line = format_replica_line(self._clock() + self._wall_offset, endpoint, block_size, blocks)
        self._geometry_lines[endpoint] = line
        return line

    def _header(self) -> bytes:
        """Every replica's latest geometry line, at the top of each rotated-in file."""
        return b"".join(self._geometry_lines.values())
