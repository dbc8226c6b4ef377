"""The recorder on its own: lines and their fields, no text unless asked, rotation, bursts, bad entries."""

from __future__ import annotations

import gc
import json
import logging
import weakref
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from burstsched.admission import Admitted, Role
from burstsched.config import PrefixHashingConfig, RecordingConfig
from burstsched.dispatch import Served
from burstsched.framework import (
    ApiKind,
    Decision,
    EndpointSnapshot,
    PrefixMatch,
    SchedRequest,
    ScoredEndpoint,
)
from burstsched.recording import LINE_VERSION, Recorder, RotatingFile, Usage, hex_chain, parse_chain, usage_of
from burstsched.recording.line import Entry, format_line
from burstsched.recording.recorder import FLUSH_SLICE

EXPECTED_FIELDS = {
    "v", "t", "id", "api", "model", "stream", "block_tokens", "bytes_per_token", "blocks", "prompt_tokens",
    "input_tokens", "cached_tokens", "max_tokens", "output_tokens", "window", "group", "role",
    "group_size", "waited_ms", "endpoint", "outcome", "ttft_ms", "e2e_ms",
}  # fmt: skip

STREAM_TAIL = (
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":" x"},"finish_reason":"length"}]}\n\n'
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":812,"total_tokens":820,'
    b'"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":640}}}\n\n'
    b"data: [DONE]\n\n"
)


class _Parsed:
    def __init__(self, payload: dict[str, Any], stream: bool = True) -> None:
        self.api = ApiKind.CHAT
        self.payload = payload
        self.stream = stream


def _admitted() -> Admitted:
    decision = Decision(ranked=(ScoredEndpoint(EndpointSnapshot(name="e0", url="http://e0")),))
    return Admitted(decision, 3, "3.0", Role.LEADER, 2, 4, 0.004)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _recorder(tmp_path: Path, clock: _Clock | None = None, **settings: Any) -> Recorder:
    config = RecordingConfig(enabled=True, path=str(tmp_path / "trace.jsonl"), **settings)
    return Recorder(
        config, PrefixHashingConfig(), clock=clock or _Clock(), wall_clock=lambda: 1_700_000_000.0
    )


def _record(recorder: Recorder, index: int = 0, arrived: float = 99.5) -> None:
    chain = (2**64 - 1, 12345, 2**53 + 1)
    request = SchedRequest(f"r{index}", "m", ApiKind.CHAT, True, chain, 64, 812)
    payload = {"messages": [{"role": "user", "content": "secret prompt"}], "max_tokens": 8}
    served = Served("e0", "ok", 99.75, STREAM_TAIL)
    recorder.record(arrived, _Parsed(payload), request, _admitted(), served)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_line_holds_the_documented_fields_and_no_text(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path).start()
    _record(recorder)
    recorder.close()
    [line] = _lines(tmp_path / "trace.jsonl")
    assert set(line) == EXPECTED_FIELDS
    assert line["v"] == LINE_VERSION
    assert line["t"] == pytest.approx(1_700_000_000.0 - 0.5)
    assert parse_chain(line["blocks"]) == (2**64 - 1, 12345, 2**53 + 1)
    assert (line["input_tokens"], line["output_tokens"], line["cached_tokens"]) == (812, 8, 640)
    assert (line["max_tokens"], line["stream"], line["api"]) == (8, True, "chat")
    assert (line["window"], line["group"], line["role"], line["group_size"]) == (3, "3.0", "leader", 2)
    assert line["endpoint"] == "e0"
    assert line["ttft_ms"] == pytest.approx(250.0)
    assert line["e2e_ms"] == pytest.approx(500.0)
    assert "secret" not in (tmp_path / "trace.jsonl").read_text()


def test_text_is_recorded_only_when_asked(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path, include_text=True).start()
    _record(recorder)
    recorder.close()
    [line] = _lines(tmp_path / "trace.jsonl")
    assert line["text"] == [{"role": "user", "content": "secret prompt"}]


def test_usage_is_read_from_a_json_body_and_missing_usage_is_null() -> None:
    body = b'{"id":"x","usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}'
    usage = usage_of(body)
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (5, 3, None)
    assert usage_of(b"data: [DONE]\n\n").output_tokens is None


def test_the_file_rotates_by_size_and_keeps_its_backups(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rotating = RotatingFile(path, max_bytes=4096, backups=2)
    line = b"x" * 1023 + b"\n"
    for _ in range(20):
        rotating.write(line)
    rotating.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["t.jsonl", "t.jsonl.1", "t.jsonl.2"]
    for name in names:
        content = (tmp_path / name).read_bytes()
        assert len(content) <= 4096 and content.endswith(b"\n")
    assert rotating.rotations == 4


def test_a_burst_is_queued_without_blocking_and_every_line_is_written(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path).start()  # nothing flushes before close(): run() is not running
    for index in range(20_000):
        _record(recorder, index)
    assert recorder.pending == 20_000  # record() only queued them
    assert not (tmp_path / "trace.jsonl").read_bytes()
    recorder.close()
    lines = _lines(tmp_path / "trace.jsonl")
    assert [line["id"] for line in lines] == [f"r{i}" for i in range(20_000)]
    assert recorder.written == 20_000 and recorder.failed == 0


def _entry(**fields: Any) -> Entry:
    """A queued entry (the recorder's tuple layout), with ``fields`` overriding the defaults."""
    values: dict[str, Any] = {
        "arrived": 10.0,
        "ended": 10.5,
        "request_id": "r0",
        "api": ApiKind.CHAT,
        "model": "m",
        "stream": False,
        "block_tokens": 64,
        "blocks": hex_chain((1, 2**64 - 1)),
        "prompt_tokens": 130,
        "max_completion_tokens": None,
        "max_tokens": 8,
        "window": 3,
        "group": "3.0",
        "role": Role.MEMBER,
        "group_size": 2,
        "waited_s": 0.0041234,
        "endpoint": "e0",
        "outcome": "ok",
        "first_byte_at": 10.25,
        "response_tail": b'{"usage":{"prompt_tokens":130,"completion_tokens":8,"total_tokens":138}}',
        "text": None,
        "decision": None,
        "queued_s": 0.0,
        **fields,
    }
    return tuple(values.values())


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"request_id": 'q"\\\n\x01 é 漢 \U0001f600', "model": "a/b\tc", "endpoint": "ü"},
        {"window": None, "group": None, "endpoint": None, "first_byte_at": None, "role": Role.BYPASS},
        {"max_completion_tokens": 5, "max_tokens": 9, "response_tail": b"", "blocks": ""},
        {"max_completion_tokens": "5", "max_tokens": True, "stream": True, "api": ApiKind.COMPLETIONS},
    ],
)
def test_the_formatted_line_is_the_json_of_the_documented_fields(fields: dict[str, Any]) -> None:
    """format_line writes by hand what json.dumps would write of the line's dict: same keys in the same
    order, same values (times rounded to the µs), escaped strings, null for what is missing."""
    entry = _entry(**fields)
    (arrived, ended, rid, api, model, stream, block_tokens, blocks, prompt, mct, mt, window, group, role,
     size, waited, endpoint, outcome, first, tail, _payload, _decision, _queued) = entry  # fmt: skip
    counts = usage_of(tail)
    limit = mct if type(mct) is int else mt if type(mt) is int else None
    expected = {
        "v": LINE_VERSION, "t": round(arrived + 1000.0, 6), "id": rid, "api": str(api), "model": model,
        "stream": stream, "block_tokens": block_tokens, "bytes_per_token": 4, "blocks": blocks,
        "prompt_tokens": prompt, "input_tokens": counts.input_tokens, "cached_tokens": counts.cached_tokens,
        "max_tokens": limit, "output_tokens": counts.output_tokens, "window": window, "group": group,
        "role": str(role), "group_size": size, "waited_ms": round(waited * 1000, 3), "endpoint": endpoint,
        "outcome": outcome, "ttft_ms": None if first is None else round((first - arrived) * 1000, 3),
        "e2e_ms": round((ended - arrived) * 1000, 3),
    }  # fmt: skip
    raw = format_line(entry, 1000.0, 4, with_text=False)
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    line = json.loads(raw)
    assert list(line) == list(expected)
    assert line == expected
    with_text = format_line(_entry(**fields, text="p \u2028"), 1000.0, 4, with_text=True)
    assert json.loads(with_text) == {**expected, "text": "p \u2028"}


def test_the_line_is_byte_for_byte_the_v1_line() -> None:
    """The line format's bytes, pinned: keys in this order, no spaces, text left as UTF-8, a float as the
    shortest text that reads back as its value (``250.0``; before the lines were encoded by msgspec they
    were written with a fixed count of decimals, ``250.000``: the same value to a JSON reader)."""
    tail = (
        b'data: {"usage":{"prompt_tokens":130,"total_tokens":138,"completion_tokens":8,'
        b'"prompt_tokens_details":{"cached_tokens":64}}}\n\ndata: [DONE]\n\n'
    )
    entry = _entry(stream=True, response_tail=tail, text=[{"role": "user", "content": "h\u00e9"}])
    line = (
        b'{"v":1,"t":1700000010.0,"id":"r0","api":"chat","model":"m","stream":true,"block_tokens":64,'
        b'"bytes_per_token":4,"blocks":"0000000000000001ffffffffffffffff","prompt_tokens":130,'
        b'"input_tokens":130,"cached_tokens":64,"max_tokens":8,"output_tokens":8,"window":3,"group":"3.0",'
        b'"role":"member","group_size":2,"waited_ms":4.123,"endpoint":"e0","outcome":"ok","ttft_ms":250.0,'
        b'"e2e_ms":500.0'
    )
    assert format_line(entry, 1_700_000_000.0, 4, with_text=False) == line + b"}\n"
    text = ',"text":[{"role":"user","content":"h\u00e9"}]}\n'.encode()
    assert format_line(entry, 1_700_000_000.0, 4, with_text=True) == line + text


def test_a_request_the_flow_queue_held_says_how_long_others_do_not() -> None:
    """``queued_ms`` follows the line's other fields only when the flow-control queue held the request."""
    held = json.loads(format_line(_entry(queued_s=1.2345678), 1000.0, 4, with_text=False))
    assert list(held)[-1] == "queued_ms" and held["queued_ms"] == 1234.568
    assert "queued_ms" not in json.loads(format_line(_entry(), 1000.0, 4, with_text=False))


def test_times_are_rounded_to_the_microsecond() -> None:
    entry = _entry(arrived=10.0000004, ended=10.5000011, first_byte_at=10.2500006, waited_s=0.0041236)
    line = json.loads(format_line(entry, 1_700_000_000.0, 4, with_text=False))
    times = (line["t"], line["waited_ms"], line["ttft_ms"], line["e2e_ms"])
    assert times == (1700000010.0, 4.124, 250.0, 500.001)
    raw = format_line(entry, 1_700_000_000.123456789, 4, with_text=False)
    assert b'"t":1700000010.123457,' in raw


def test_usage_is_the_last_usage_object_and_a_null_usage_is_skipped() -> None:
    tail = (
        b'data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
        b'data: {"usage": {"prompt_tokens": 7, "completion_tokens": 2, '
        b'"prompt_tokens_details": {"cached_tokens": 4}}}\n\n'
        b'data: {"choices":[],"usage":null}\n\ndata: [DONE]\n\n'
    )
    assert usage_of(tail) == Usage(input_tokens=7, output_tokens=2, cached_tokens=4)
    assert usage_of(b'{"usage":null}') == Usage()


class _Payload(dict[str, Any]):
    """A payload that can be watched with a weak reference."""


@pytest.mark.parametrize("include_text", [False, True])
def test_a_queued_request_keeps_nothing_of_the_request_alive(tmp_path: Path, include_text: bool) -> None:
    """record() keeps nothing of the payload until the flush but what the line needs (its text only with
    include_text)."""
    recorder = _recorder(tmp_path, include_text=include_text).start()
    payload = _Payload(messages=[{"role": "user", "content": "hi"}], max_completion_tokens=4)
    watched = weakref.ref(payload)
    request = SchedRequest("r0", "m", ApiKind.CHAT, False, (7,), 64, 1)
    recorder.record(99.5, _Parsed(payload, stream=False), request, _admitted(), Served("e0", "ok", None))
    del payload
    gc.collect()
    assert recorder.pending == 1
    assert watched() is None
    recorder.close()
    [line] = _lines(tmp_path / "trace.jsonl")
    assert line["max_tokens"] == 4 and line["ttft_ms"] is None and line["input_tokens"] is None
    assert ("text" in line) is include_text


def test_a_request_that_cannot_be_encoded_is_counted_and_logged_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = _recorder(tmp_path).start()
    _record(recorder, 0)
    bad = SchedRequest(object(), "m", ApiKind.CHAT, True, (1,), 64, 64)  # type: ignore[arg-type]  # no JSON
    recorder.record(99.5, _Parsed({}), bad, _admitted(), Served("e0", "ok", 99.75))
    _record(recorder, 2)
    assert recorder.failed == 0 and recorder.pending == 3  # formatted at the flush
    too_wide = SchedRequest("r3", "m", ApiKind.CHAT, True, (2**64,), 64, 64)  # no 64-bit hash
    with caplog.at_level(logging.ERROR, logger="burstsched.recording.recorder"):
        recorder.record(99.5, _Parsed({}), too_wide, _admitted(), Served("e0", "ok", 99.75))
        assert recorder.failed == 1 and recorder.pending == 3
        assert "could not record a request" in caplog.text
        recorder.close()
    assert "could not encode a recorded request" in caplog.text  # its batch was encoded line by line
    assert [line["id"] for line in _lines(tmp_path / "trace.jsonl")] == ["r0", "r2"]
    assert recorder.written == 2 and recorder.failed == 2


class _Geometry:
    """What the pool would answer: each endpoint's (block_size, num_gpu_blocks), changeable."""

    def __init__(self) -> None:
        self.known: dict[str, tuple[int | None, int | None]] = {"e0": (128, 164)}

    def __call__(self, endpoint: str) -> tuple[int | None, int | None]:
        return self.known.get(endpoint, (None, None))


def test_a_replica_geometry_line_comes_before_its_first_request_and_again_when_it_changes(
    tmp_path: Path,
) -> None:
    geometry = _Geometry()
    config = RecordingConfig(enabled=True, path=str(tmp_path / "trace.jsonl"))
    recorder = Recorder(config, PrefixHashingConfig(), clock=_Clock(), geometry=geometry).start()
    for index in range(3):
        _record(recorder, index)
    recorder.flush()  # the geometry is read when the lines are formatted
    geometry.known["e0"] = (128, 80)  # the replica restarted with a smaller cache
    _record(recorder, 3)
    recorder.flush()
    geometry.known["e0"] = (None, None)  # not scraped yet: nothing to say
    _record(recorder, 4)
    recorder.close()
    kinds = [(line.get("kind"), line.get("num_gpu_blocks")) for line in _lines(tmp_path / "trace.jsonl")]
    request = (None, None)
    assert kinds == [("replica", 164), request, request, request, ("replica", 80), request, request]
    first = _lines(tmp_path / "trace.jsonl")[0]
    assert first == {"v": LINE_VERSION, "kind": "replica", "t": first["t"], "replica": "e0",
                     "block_size": 128, "num_gpu_blocks": 164}  # fmt: skip


def test_each_rotated_file_repeats_the_replica_geometry(tmp_path: Path) -> None:
    config = RecordingConfig(enabled=True, path=str(tmp_path / "t.jsonl"), max_bytes=4096, backups=3)
    recorder = Recorder(config, PrefixHashingConfig(), clock=_Clock(), geometry=_Geometry()).start()
    for index in range(60):
        _record(recorder, index)
        recorder.flush()  # one write per line, so the file rotates between requests
    recorder.close()
    files = sorted(tmp_path.iterdir())
    assert len(files) >= 3
    for path in files:
        lines = _lines(path)
        served = [i for i, line in enumerate(lines) if line.get("endpoint") == "e0"]
        replica = [i for i, line in enumerate(lines) if line.get("kind") == "replica"]
        if served:
            assert replica and replica[0] < served[0], path.name


def test_with_decisions_a_line_holds_every_candidate_in_the_scheduler_s_order() -> None:
    fresh = EndpointSnapshot(name="e1", url="http://e1", waiting=2, running=3, kv_usage=0.4, in_flight=1,
                             metrics_age=0.0123)  # fmt: skip
    stale = EndpointSnapshot(name="e0", url="http://e0", stale=True)
    decision = Decision(
        ranked=(
            ScoredEndpoint(fresh, {"prefix-cache-scorer": 1.0, "queue-scorer": 0.25}, 3.5),
            ScoredEndpoint(stale, {"prefix-cache-scorer": 0.0, "queue-scorer": 1.0}, 2.0),
        ),
        matches={"e1": PrefixMatch(12, 16, 64)},
    )
    line = json.loads(format_line(_entry(decision=decision), 1000.0, 4, with_text=False))
    assert line["decision"] == [
        {"endpoint": "e1", "total": 3.5, "scores": {"prefix-cache-scorer": 1.0, "queue-scorer": 0.25},
         "matched_blocks": 12, "waiting": 2, "running": 3, "in_flight": 1, "pending": 0, "kv_usage": 0.4,
         "stale": False, "metrics_age_ms": 12.3},
        {"endpoint": "e0", "total": 2.0, "scores": {"prefix-cache-scorer": 0.0, "queue-scorer": 1.0},
         "matched_blocks": None, "waiting": 0, "running": 0, "in_flight": 0, "pending": 0, "kv_usage": 0.0,
         "stale": True, "metrics_age_ms": None},
    ]  # fmt: skip
    assert "decision" not in json.loads(format_line(_entry(), 1000.0, 4, with_text=False))


def test_the_recorder_writes_decisions_only_when_asked(tmp_path: Path) -> None:
    for decisions in (False, True):
        recorder = _recorder(tmp_path / str(decisions), decisions=decisions).start()
        _record(recorder)
        recorder.close()
        [line] = _lines(tmp_path / str(decisions) / "trace.jsonl")
        assert ("decision" in line) is decisions
        if decisions:
            assert [c["endpoint"] for c in line["decision"]] == ["e0"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_flush_lets_the_loop_run_between_slices_and_a_cancelled_one_loses_nothing(
    tmp_path: Path, anyio_backend: str
) -> None:
    recorder = _recorder(tmp_path, flush_interval_ms=1).start()
    total = FLUSH_SLICE * 4 + 3
    for index in range(total):
        _record(recorder, index)
    seen_mid_flush = False
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(recorder.run)
            while not seen_mid_flush:
                await anyio.lowlevel.checkpoint()
                # a slice formatted (its CPU counted), nothing written yet: the flush gave the loop a turn
                seen_mid_flush = recorder.flush_cpu_s > 0 and recorder.written == 0
            tg.cancel_scope.cancel()
    assert recorder.written == 0 and recorder.pending == total
    recorder.close()
    assert [line["id"] for line in _lines(tmp_path / "trace.jsonl")] == [f"r{i}" for i in range(total)]
