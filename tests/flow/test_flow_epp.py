"""Flow control behind the gateway: the tokens a response's ``usage`` says it used reach the flow queue's
program-aware fairness, from a whole JSON body and from a stream's usage chunk, as with ``serve``.

The picker is spoken to over gRPC as a gateway speaks to it (request headers and body, then the response the
gateway saw), in front of simulated replicas (only for the pool's health: the response is the test's own).
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import anyio
import grpc
import pytest

from burstsched.config import FlowControlConfig
from burstsched.config.flow_control import ProgramAwareConfig
from burstsched.epp.pb.ext_proc_pb2 import (
    HeaderMap,
    HeaderValue,
    HttpBody,
    HttpHeaders,
    ProcessingMode,
    ProcessingRequest,
    ProcessingResponse,
    ProtocolConfiguration,
)
from burstsched.epp.service import SERVICE, RunningEpp, running_epp
from burstsched.flow import FlowQueue
from burstsched.sim import SimConfig, SimPool
from tests.router.helpers import eventually, router_config

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED


@pytest.fixture
async def sims() -> AsyncIterator[SimPool]:
    async with SimPool(2, SimConfig(time_scale=0.02)) as pool:
        yield pool


@pytest.fixture
async def epp(sims: SimPool) -> AsyncIterator[RunningEpp]:
    flow = FlowControlConfig(
        enabled=True, fairness="program-aware", program_aware=ProgramAwareConfig(half_life_s=0)
    )
    config = router_config(list(zip(sims.names, sims.urls, strict=True)), flow_control=flow)
    async with running_epp(config, rng=random.Random(4)) as running:

        async def healthy() -> bool:
            return running.router.pool.healthy_count() == 2

        await eventually(healthy, within_s=10)
        yield running


def _headers(pairs: dict[str, str], *, end_of_stream: bool = False) -> HttpHeaders:
    values = [HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return HttpHeaders(headers=HeaderMap(headers=values), end_of_stream=end_of_stream)


async def _exchange(
    epp: RunningEpp, fairness_id: str, request: dict[str, object], head: dict[str, str], chunks: list[bytes]
) -> None:
    """One request through the picker, answered with ``head`` and the body ``chunks``."""
    async with grpc.aio.insecure_channel(epp.target) as channel:
        process: Any = channel.stream_stream(
            f"/{SERVICE}/Process",
            request_serializer=ProcessingRequest.SerializeToString,
            response_deserializer=ProcessingResponse.FromString,
        )
        call = process()
        pairs = {":path": "/v1/chat/completions", ":method": "POST"}
        pairs["x-llm-d-inference-fairness-id"] = fairness_id
        modes = ProtocolConfiguration(request_body_mode=FULL_DUPLEX, response_body_mode=FULL_DUPLEX)
        await call.write(ProcessingRequest(request_headers=_headers(pairs), protocol_config=modes))
        body = json.dumps(request).encode()
        await call.write(ProcessingRequest(request_body=HttpBody(body=body, end_of_stream=True)))
        routed = await call.read()
        assert routed.WhichOneof("response") == "request_headers", routed
        await call.read()  # the body, given back
        await call.write(ProcessingRequest(response_headers=_headers({":status": "200", **head})))
        await call.read()
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            await call.write(ProcessingRequest(response_body=HttpBody(body=chunk, end_of_stream=last)))
            await call.read()
        await call.done_writing()


def _service(epp: RunningEpp, flow: str) -> float:
    queue = epp.router.flow
    assert isinstance(queue, FlowQueue)
    service = queue._service  # the queue's program-aware ledger: what completed() added
    assert service is not None
    return service.service(flow, 0.0)


async def _served(epp: RunningEpp, flow: str, tokens: float) -> None:
    async def credited() -> bool:
        return _service(epp, flow) == tokens

    await eventually(credited, within_s=5)


async def test_usage_of_a_json_body_reaches_the_flow_queue(epp: RunningEpp) -> None:
    request = {"model": "kv-demo", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 30}
    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 3000}}],
        "usage": {"prompt_tokens": 1234, "completion_tokens": 30, "total_tokens": 1264},
    }
    body = json.dumps(answer).encode()
    head = {"content-type": "application/json", "content-length": str(len(body))}
    cut = len(body) - 40  # the usage object arrives in two pieces
    with anyio.fail_after(20):
        await _exchange(epp, "json-tenant", request, head, [body[:cut], body[cut:]])
        await _served(epp, "json-tenant", 1234 + 2 * 30)


async def test_usage_of_a_stream_reaches_the_flow_queue(epp: RunningEpp) -> None:
    request = {
        "model": "kv-demo",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    delta = {"id": "c", "choices": [{"index": 0, "delta": {"content": "tok"}}]}
    usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 500, "completion_tokens": 7}}
    chunks = [b"data: " + json.dumps(delta).encode() + b"\n\n" for _ in range(50)]
    chunks += [b"data: " + json.dumps(usage).encode() + b"\n\n", b"data: [DONE]\n\n"]
    with anyio.fail_after(20):
        await _exchange(epp, "sse-tenant", request, {"content-type": "text/event-stream"}, chunks)
        await _served(epp, "sse-tenant", 500 + 2 * 7)
