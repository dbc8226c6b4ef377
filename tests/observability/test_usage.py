"""Reading id, model, token usage and finish reasons from a replica's response (pure functions)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from burstsched.telemetry import ResponseInfo, StreamTail, from_json_body, from_sse_tail
from burstsched.telemetry.usage import _from_payloads


def _sse(*payloads: object) -> bytes:
    return b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"


def test_json_body_gives_usage_id_model_and_finish_reasons() -> None:
    body = json.dumps(
        {
            "id": "chatcmpl-1",
            "model": "kv-demo",
            "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "length"}],
            "usage": {
                "prompt_tokens": 120,
                "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 64},
            },
        }
    ).encode()
    assert from_json_body(body) == ResponseInfo("chatcmpl-1", "kv-demo", 120, 4, 64, ("length",))


def test_json_body_without_usage_or_not_json_gives_what_there_is() -> None:
    assert from_json_body(b'{"id": "x", "choices": []}') == ResponseInfo(response_id="x")
    assert from_json_body(b"not json") == ResponseInfo()
    assert from_json_body(b"[1, 2]") == ResponseInfo()
    assert from_json_body(b'{"usage": {"prompt_tokens": -1, "completion_tokens": "4"}}') == ResponseInfo()


def test_sse_tail_reads_the_usage_chunk_and_the_last_finish_reason() -> None:
    stream = _sse(
        {
            "id": "c-2",
            "model": "kv-demo",
            "choices": [{"delta": {"role": "assistant"}, "finish_reason": None}],
        },
        {"id": "c-2", "model": "kv-demo", "choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}]},
        {
            "id": "c-2",
            "model": "kv-demo",
            "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2},
        },
    )
    assert from_sse_tail(stream) == ResponseInfo("c-2", "kv-demo", 9, 2, None, ("stop",))


def test_sse_tail_without_usage_chunk_has_no_token_counts() -> None:
    stream = _sse({"id": "c-3", "choices": [{"delta": {"content": "a"}, "finish_reason": None}]})
    info = from_sse_tail(stream)
    assert (info.response_id, info.input_tokens, info.output_tokens) == ("c-3", None, None)


def test_sse_tail_cut_mid_event_skips_the_cut_line() -> None:
    stream = _sse({"id": "c-4", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}})
    assert from_sse_tail(stream[3:]) == ResponseInfo()  # the only data line is cut
    whole = _sse({"id": "a", "choices": []}, {"id": "c-4", "choices": [], "usage": {"prompt_tokens": 5}})
    assert from_sse_tail(whole[10:]).input_tokens == 5


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=40), st.integers(min_value=1, max_value=1000))
def test_stream_tail_keeps_at_least_the_last_limit_bytes(chunks: list[bytes], limit: int) -> None:
    tail = StreamTail(limit)
    for chunk in chunks:
        tail.add(chunk)
    whole = b"".join(chunks)
    kept = tail.value()
    assert whole.endswith(kept)
    assert len(kept) >= min(limit, len(whole))
    assert len(kept) < limit + 300  # never much more than asked: whole chunks beyond the limit are dropped


def test_sse_tail_reads_crlf_streams_and_leaves_out_an_event_cut_before_its_blank_line() -> None:
    usage = {"id": "c-5", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
    crlf = _sse(usage).replace(b"\n", b"\r\n")
    assert from_sse_tail(crlf).input_tokens == 7
    cut = b"data: " + json.dumps(usage).encode() + b"\n"  # the stream ended before the blank line
    assert from_sse_tail(cut) == ResponseInfo()


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False), st.text(max_size=6)
)
_ANY = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
)


@given(
    response_id=_ANY,
    model=_ANY,
    prompt=_ANY,
    completion=_ANY,
    cached=_ANY,
    details=st.booleans(),
    reasons=st.lists(st.one_of(st.text(max_size=6), _SCALARS), max_size=3),
    extra=st.dictionaries(st.sampled_from(["object", "created", "system"]), _ANY, max_size=2),
)
def test_the_fast_json_reading_agrees_with_the_general_one(
    response_id: object,
    model: object,
    prompt: object,
    completion: object,
    cached: object,
    details: bool,
    reasons: list[object],
    extra: dict[str, object],
) -> None:
    usage: dict[str, object] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if details:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    body = {
        "id": response_id,
        "model": model,
        "choices": [{"message": {"content": "x"}, "finish_reason": r} for r in reasons],
        "usage": usage,
        **extra,
    }
    encoded = json.dumps(body).encode()
    assert from_json_body(encoded) == _from_payloads([json.loads(encoded)])


@given(st.dictionaries(st.sampled_from(["id", "model", "usage", "choices", "object"]), _ANY, max_size=5))
def test_the_fast_json_reading_agrees_on_bodies_of_any_shape(body: dict[str, object]) -> None:
    encoded = json.dumps(body).encode()
    assert from_json_body(encoded) == _from_payloads([json.loads(encoded)])
    assert from_json_body(json.dumps([body]).encode()) == ResponseInfo()
