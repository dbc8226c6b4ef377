"""The ``disconnect_after_events`` fault (a replica dying mid-response) and the test-only request record."""

from __future__ import annotations

import anyio
import httpx
import pytest

from burstsched.sim import Faults, RecordedRequest, SimConfig, SimPool
from burstsched.wire.sse import DONE, SSEReader

from .http_helpers import chat_body, client, metrics, metrics_when

pytestmark = pytest.mark.anyio

LONG = SimConfig(time_scale=0.05)


async def _events_until_cut(http: httpx.AsyncClient, url: str, body: dict[str, object]) -> list[str]:
    """The events of a stream whose connection the replica cuts (the read must fail)."""
    reader = SSEReader()
    events: list[str] = []
    with anyio.fail_after(10), pytest.raises(httpx.RemoteProtocolError):
        async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200  # the head went out before the cut
            async for chunk in response.aiter_bytes():
                events += reader.feed(chunk)
    return events


@pytest.mark.parametrize("after", [0, 1, 3])
async def test_a_stream_is_cut_after_its_first_events_and_its_request_aborted(after: int) -> None:
    async with SimPool(1, LONG) as pool, client() as http:
        url = pool.urls[0]
        await pool.aset_faults(0, Faults(disconnect_after_events=after))
        body = chat_body("tell a long story", max_tokens=2000, stream=True)
        events = await _events_until_cut(http, url, body)
        assert len(events) == after and DONE not in events
        # the request left the engine without finishing: aborted, not completed
        state = await metrics_when(http, url, lambda m: m["vllm:num_requests_running"] == 0)
        assert not any(k.startswith("vllm:request_success_total") and v for k, v in state.items())
        assert state["vllm:generation_tokens_total"] < 2000
        await pool.aset_faults(0, Faults())
        response = await http.post(f"{url}/v1/chat/completions", json=chat_body("hi", max_tokens=2))
        assert response.status_code == 200  # cleared: served again


async def test_a_short_stream_ends_normally_and_a_non_streaming_response_is_cut_before_its_head() -> None:
    async with SimPool(1, LONG) as pool, client() as http:
        url = pool.urls[0]
        await http.post(f"{url}/sim/faults", json={"disconnect_after_events": 100})
        assert (await http.get(f"{url}/sim/faults")).json()["disconnect_after_events"] == 100
        async with http.stream(
            "POST", f"{url}/v1/chat/completions", json=chat_body("hi", max_tokens=3, stream=True)
        ) as response:
            reader = SSEReader()
            events = [data async for chunk in response.aiter_bytes() for data in reader.feed(chunk)]
        assert events[-1] == DONE  # fewer events than the cut: the stream is whole
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(f"{url}/v1/chat/completions", json=chat_body("hi", max_tokens=3))
        assert (await metrics(http, url))["vllm:num_requests_running"] == 0
        bad = await http.post(f"{url}/sim/faults", json={"disconnect_after_events": -1})
        assert bad.status_code == 400


async def test_recorded_requests_are_the_inference_requests_as_received() -> None:
    async with SimPool(2, LONG, record_requests=True) as pool, client() as http:
        url = pool.urls[0]
        await http.get(f"{url}/health")
        await http.get(f"{url}/metrics")
        headers = {"x-request-id": "r-1", "traceparent": "00-abc"}
        await http.post(f"{url}/v1/chat/completions", json=chat_body("hi", max_tokens=1), headers=headers)
        await pool.aset_faults(0, Faults(error_rate=1.0, error_status=503))
        failed = await http.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert failed.status_code == 503
        first, second = pool.requests(0)
        assert pool.requests(1) == []
    assert isinstance(first, RecordedRequest)
    assert (first.method, first.path) == ("POST", "/v1/chat/completions")
    assert first.headers["x-request-id"] == "r-1" and first.headers["traceparent"] == "00-abc"
    assert first.headers["host"] == url.removeprefix("http://")
    assert second.path == "/v1/completions"  # recorded before the injected fault answered it


async def test_a_pool_not_recording_says_so() -> None:
    async with SimPool(1, LONG) as pool:
        with pytest.raises(RuntimeError, match="record_requests"):
            pool.requests(0)
