"""The traffic recorder: the event loop appends one tuple per request; a writer thread builds the lines.

:meth:`Recorder.record` is the only call on a request's path: it appends one flat tuple of the request's
primitives (ids, counts, times, the response's tail; the payload only with ``include_text``) to a deque,
no encoding, no lock, no I/O. Primitives rather than the request's objects: a queued request then holds
no dicts, dataclasses or decisions alive until the next flush, and the tuple itself, holding nothing the
cyclic garbage collector tracks (enums are turned into plain strings), is untracked at its first
collection instead of being walked again and again and promoted to the oldest generation. Every
``flush_interval_ms`` the writer thread drains the deque, formats each line
(:func:`~burstsched.recording.line.format_line`) and appends them to the rotating file in one write. The
deque is unbounded: a burst is never dropped, it waits for the next flush.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from burstsched.admission import Admitted
from burstsched.config import PrefixHashingConfig, RecordingConfig
from burstsched.dispatch import Served
from burstsched.framework import ApiKind, SchedRequest
from burstsched.recording.line import Entry, format_line
from burstsched.recording.writer import RotatingFile

log = logging.getLogger(__name__)

Clock = Callable[[], float]


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
    ``first_byte_at``); ``wall_clock`` turns them into Unix times for the file.
    """

    def __init__(
        self,
        settings: RecordingConfig,
        hashing: PrefixHashingConfig,
        *,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
    ) -> None:
        self._settings = settings
        self._include_text = settings.include_text
        self._bytes_per_token = hashing.bytes_per_token
        self._clock = clock
        self._wall_offset = wall_clock() - clock()
        self._pending: deque[Entry] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: RotatingFile | None = None
        self.written = 0
        self.failed = 0

    # -- the request path ------------------------------------------------------------------------
    def record(
        self,
        arrived: float,
        parsed: RecordedRequest,
        request: SchedRequest,
        admitted: Admitted,
        served: Served,
    ) -> None:
        """Queue one finished request (``arrived``: ``clock()`` when it came in). Never blocks."""
        payload = parsed.payload
        self._pending.append(
            (
                arrived,
                self._clock(),
                request.request_id,
                str(parsed.api),  # a plain str: the tuple then holds nothing the GC tracks
                request.model,
                parsed.stream,
                request.block_tokens,
                request.block_hashes,
                request.prompt_tokens,
                payload.get("max_completion_tokens"),
                payload.get("max_tokens"),
                admitted.window_id,
                admitted.group_id,
                str(admitted.role),
                admitted.group_size,
                admitted.waited_s,
                served.endpoint,
                served.outcome,
                served.first_byte_at,
                served.response_tail,
                payload if self._include_text else None,
            )
        )

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Recorder:
        s = self._settings
        self._file = RotatingFile(s.path, s.max_bytes, s.backups)
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
        return len(self._pending)

    # -- the writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        interval = self._settings.flush_interval_ms / 1000.0
        while not self._stop.wait(interval):
            self.flush()

    def flush(self) -> None:
        """Format and write every queued entry (the writer thread; tests may call it)."""
        chunks: list[bytes] = []
        pending = self._pending
        offset, bytes_per_token, with_text = self._wall_offset, self._bytes_per_token, self._include_text
        while pending:
            entry = pending.popleft()
            try:
                chunks.append(format_line(entry, offset, bytes_per_token, with_text))
            except Exception:  # a malformed entry must not stop the recorder
                self.failed += 1
                log.exception("could not encode a recorded request")
        if not chunks or self._file is None:
            return
        try:
            self._file.write(b"".join(chunks))
            self.written += len(chunks)
        except OSError as exc:
            self.failed += len(chunks)
            log.warning("recording: could not write %d lines to %s: %s", len(chunks), self._file.path, exc)
