"""Reading server-sent events (SSE) as OpenAI-compatible servers stream them.

One incremental reader for every consumer of a stream: the router's span enrichment (a stream's tail),
the workloads, the load tests and the tests. It follows the WHATWG event-stream format (HTML, "Server-sent
events", *parsing an event stream*) for what OpenAI streams use: lines end in ``\\r\\n``, ``\\n`` or ``\\r``;
an event is its ``data:`` lines (one leading space after the colon dropped, several lines joined with
``\\n``) dispatched at a blank line; comments (``:``) and other fields (``event``, ``id``, ``retry``) are
skipped; a leading byte-order mark is dropped; an event that the stream ends before its blank line is
never dispatched. Chunks may be split anywhere, inside a line ending or a UTF-8 character included::

    reader = SSEReader()
    for chunk in chunks:
        for data in reader.feed(chunk):
            if data == DONE:
                ...
            payload = json_object(data)  # the JSON object, or None
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any

DONE = "[DONE]"
"""The payload OpenAI-compatible servers end a successful stream with (``data: [DONE]``)."""

_BOM = b"\xef\xbb\xbf"


class SSEReader:
    """Incremental SSE reader: :meth:`feed` it chunks as they arrive, get back the ``data`` of each event
    that the chunk completed, in order."""

    __slots__ = ("_buf", "_data", "_skip_lf", "_at_start")

    def __init__(self) -> None:
        self._buf = b""
        """The current line's bytes, its ending not seen yet (never holds ``\\r`` or ``\\n``)."""
        self._data: list[bytes] | None = None
        """The current event's ``data`` values; None while it has none."""
        self._skip_lf = False
        """The last chunk ended in ``\\r``: a ``\\n`` starting the next one belongs to that line ending."""
        self._at_start = True

    @property
    def pending(self) -> bool:
        """Whether an event is unfinished: part of a line, or data lines not yet ended by a blank line.

        At the end of a stream this means it was cut mid-event (that event is never dispatched)."""
        return bool(self._buf) or self._data is not None

    def feed(self, chunk: bytes | str) -> list[str]:
        """Read one more chunk of the stream; the ``data`` of every event it completes."""
        if isinstance(chunk, str):
            chunk = chunk.encode()
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._skip_lf = chunk[-1] == 0x0D
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + chunk if self._buf else chunk
        if self._at_start:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                self._buf = buf  # maybe a byte-order mark split across chunks: wait for more
                return []
            self._at_start = False
            if buf.startswith(_BOM):
                buf = buf[len(_BOM) :]
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        return self._read_lines(lines) if lines else []

    def _read_lines(self, lines: list[bytes]) -> list[str]:
        events: list[str] = []
        data = self._data
        for line in lines:
            if not line:  # a blank line ends the event
                if data is not None:
                    value = data[0] if len(data) == 1 else b"\n".join(data)
                    events.append(value.decode("utf-8", "replace"))
                    data = None
            elif line.startswith(b"data"):
                if line.startswith(b"data:"):
                    field = line[6:] if line.startswith(b"data: ") else line[5:]
                elif line == b"data":  # a field name alone: an empty value
                    field = b""
                else:  # another field whose name starts with "data"
                    continue
                if data is None:
                    data = [field]
                else:
                    data.append(field)
            # comments (":...") and the fields event, id, retry and unknown ones carry nothing read here
        self._data = data
        return events


def data_payloads(body: bytes | str) -> list[str]:
    """The ``data`` of every complete event of a whole stream body, in order."""
    return SSEReader().feed(body)


def iter_data(chunks: Iterable[bytes | str]) -> Iterator[str]:
    """The ``data`` of every event of a stream given as chunks, as each is complete."""
    reader = SSEReader()
    for chunk in chunks:
        yield from reader.feed(chunk)


async def aiter_data(chunks: AsyncIterable[bytes | str]) -> AsyncIterator[str]:
    """:func:`iter_data` over an async stream (``httpx.Response.aiter_bytes()``, ``aiter_raw()``…)."""
    reader = SSEReader()
    async for chunk in chunks:
        for data in reader.feed(chunk):
            yield data


def json_object(data: str) -> dict[str, Any] | None:
    """An event's ``data`` as a JSON object (an OpenAI chunk, a usage chunk, an error event); None for
    ``[DONE]``, malformed JSON and any other JSON value."""
    if not data.startswith("{") and not data.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
