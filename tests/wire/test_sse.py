"""The SSE reader: events' ``data`` from chunks split anywhere, as the event-stream format defines them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from burstsched.wire.sse import DONE, SSEReader, aiter_data, data_payloads, iter_data, json_object

# -- a model of a stream: events of data lines, with comments and other fields between them ----------------
_CHARS = st.characters(categories=("L", "M", "N", "P", "S", "Z", "Cc", "Cf"), exclude_characters="\r\n")
_VALUE = st.text(_CHARS, max_size=12)
_OTHER = st.sampled_from([": keep-alive", ":", "event: message", "id: 7", "retry: 100", "database: x", "x"])
_EVENT = st.lists(st.tuples(st.booleans(), _VALUE), min_size=1, max_size=3).flatmap(
    lambda data: st.lists(_OTHER, max_size=2).map(lambda other: (data, other))
)
_NEWLINE = st.sampled_from(["\n", "\r\n", "\r"])


def _stream(events: list[tuple[list[tuple[bool, str]], list[str]]], newline: str, bom: bool) -> bytes:
    """The stream's bytes: each event's data lines (with or without the space after the colon) and other
    lines, then a blank line; a comment-only block between events dispatches nothing."""
    lines: list[str] = []
    for data, other in events:
        lines += other
        # without the space after the colon only where the value does not start with one (it would be dropped)
        lines += [
            f"data:{value}" if not (spaced or value.startswith(" ")) else f"data: {value}"
            for spaced, value in data
        ]
        lines.append("")
        if other:
            lines += [*other, ""]
    return (("\ufeff" if bom else "") + "".join(line + newline for line in lines)).encode()


def _expected(events: list[tuple[list[tuple[bool, str]], list[str]]]) -> list[str]:
    return ["\n".join(value for _, value in data) for data, _ in events]


def _split(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(stream)) for c in cuts})
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


@given(
    st.lists(_EVENT, max_size=8),
    _NEWLINE,
    st.booleans(),
    st.lists(st.integers(min_value=0, max_value=400), max_size=20),
)
def test_any_split_of_a_stream_gives_the_same_events(
    events: list[tuple[list[tuple[bool, str]], list[str]]], newline: str, bom: bool, cuts: list[int]
) -> None:
    stream = _stream(events, newline, bom)
    expected = _expected(events)
    assert data_payloads(stream) == expected
    reader = SSEReader()
    got = [data for chunk in _split(stream, cuts) for data in reader.feed(chunk)]
    assert got == expected
    assert not reader.pending


@given(st.lists(_EVENT, max_size=5), _NEWLINE)
def test_byte_by_byte_and_text_chunks_read_alike(
    events: list[tuple[list[tuple[bool, str]], list[str]]], newline: str
) -> None:
    stream = _stream(events, newline, bom=False)
    expected = _expected(events)
    assert list(iter_data(stream[i : i + 1] for i in range(len(stream)))) == expected  # UTF-8 split too
    text = stream.decode()
    assert list(iter_data(text[i : i + 3] for i in range(0, len(text), 3))) == expected


def test_an_openai_stream_with_crlf_comments_and_done() -> None:
    chunk = {"id": "chatcmpl-1", "choices": [{"delta": {"content": "hé"}, "finish_reason": None}]}
    stream = (
        b": ping\r\n\r\n"
        + b"data: "
        + json.dumps(chunk).encode()
        + b"\r\n\r\n"
        + b'data: {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3}}\r\n\r\n'
        + b"data: [DONE]\r\n\r\n"
    )
    events = data_payloads(stream)
    assert len(events) == 3 and events[-1] == DONE
    assert json_object(events[0]) == chunk
    usage = json_object(events[1])
    assert usage is not None and usage["usage"] == {"prompt_tokens": 3}


def test_multi_line_data_joins_with_newlines_and_an_empty_data_line_still_dispatches() -> None:
    reader = SSEReader()
    assert reader.feed(b"data: first\ndata:second\ndata\n") == []
    assert reader.pending
    assert reader.feed(b"\n") == ["first\nsecond\n"]
    assert reader.feed(b"data:\n\n") == [""]
    assert reader.feed(b"event: x\nid: 1\n\n: only a comment\n\n") == []  # no data: nothing dispatched
    assert not reader.pending


def test_line_endings_split_between_chunks() -> None:
    reader = SSEReader()
    assert reader.feed(b"data: a\r") == []
    assert reader.feed(b"\n") == []  # the \n completes the \r\n of the line above, not a blank line
    assert reader.feed(b"\r") == ["a"]  # a lone \r is a line ending: the blank line
    assert reader.feed(b"\ndata: b\r\r") == ["b"]  # this \n belonged to that \r: no second blank line
    assert reader.feed(b"data: c\n\r\n") == ["c"]


def test_a_stream_cut_mid_event_leaves_it_pending_and_undispatched() -> None:
    reader = SSEReader()
    assert reader.feed(b'data: {"a": 1}\n\ndata: {"b"') == ['{"a": 1}']
    assert reader.pending
    cut = SSEReader()
    assert cut.feed(b"data: x\n") == [] and cut.pending  # its blank line never came


def test_a_split_byte_order_mark_is_dropped_once() -> None:
    reader = SSEReader()
    assert reader.feed(b"\xef") == [] and reader.feed(b"\xbb") == []
    assert reader.feed(b"\xbfdata: x\n\n") == ["x"]
    assert reader.feed("\ufeffdata: y\n\n") == []  # later, a BOM is just bytes of a line (field "\ufeffdata")


def test_a_tail_cut_mid_line_skips_the_cut_line() -> None:
    stream = b'data: {"id": "a", "choices": []}\n\ndata: {"id": "b"}\n\n'
    assert data_payloads(stream[10:]) == ['{"id": "b"}']  # starts at '"a", "choices"...': a field "'
    assert data_payloads(stream[3:]) == ['{"id": "b"}']  # starts at 'a: {...}': the field "a"


def test_json_object_decodes_objects_only() -> None:
    assert json_object('{"x": [1]}') == {"x": [1]}
    assert json_object(' {"x": 1}') == {"x": 1}
    assert json_object(DONE) is None
    assert json_object("{broken") is None
    assert json_object("[1]") is None
    assert json_object("") is None


@pytest.mark.anyio
async def test_aiter_data_reads_an_async_stream() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for piece in (b"da", b"ta: 1\n", b"\ndata: [DO", b"NE]\n\n"):
            yield piece

    assert [data async for data in aiter_data(chunks())] == ["1", DONE]
