"""The picker's side of the protocol, spoken to directly over gRPC as a gateway would (no Envoy): what a
gateway sends that Envoy 1.40's ORIGINAL_DST setup does not, here the endpoint that served a response
(``x-gateway-destination-endpoint-served``, GIE proposal 004) when the gateway failed over to a fallback."""

from __future__ import annotations

import random
from typing import Any

import anyio
import grpc
import pytest
from google.protobuf.struct_pb2 import Struct, Value

from burstsched.epp.pb.ext_proc_pb2 import (
    HeaderMap,
    HeaderValue,
    HttpBody,
    HttpHeaders,
    Metadata,
    ProcessingMode,
    ProcessingRequest,
    ProcessingResponse,
    ProtocolConfiguration,
)
from burstsched.epp.service import SERVICE, running_epp
from burstsched.epp.wire import DESTINATION, ENDPOINT_HEADER, NAMESPACE, SERVED_KEY, endpoint_address
from burstsched.sim import SimPool
from tests.router.helpers import eventually, router_config

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
BODY = b'{"model": "kv-demo", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}'


def _headers(pairs: dict[str, str], *, end_of_stream: bool = False) -> HttpHeaders:
    values = [HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return HttpHeaders(headers=HeaderMap(headers=values), end_of_stream=end_of_stream)


def _served(address: str) -> Metadata:
    served = Struct(fields={SERVED_KEY: Value(string_value=address)})
    return Metadata(filter_metadata={NAMESPACE: served})


def _set_headers(answer: ProcessingResponse, kind: str) -> dict[str, str]:
    mutation = getattr(answer, kind).response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


async def test_a_response_served_by_the_fallback_moves_the_request_to_its_account(sims: SimPool) -> None:
    """The picker names its pick and one fallback; the gateway's response headers say the fallback served:
    the response is named after the fallback, the request counts in flight there (not on the pick) until
    its end, and the pick's failed attempt is counted."""
    config = router_config(list(zip(sims.names, sims.urls, strict=True))[:2], "")
    async with running_epp(config, fallbacks=1, rng=random.Random(5), metrics_port=0) as epp:
        pool = epp.router.pool

        async def both_healthy() -> bool:
            return pool.healthy_count() == 2

        await eventually(both_healthy, within_s=10)
        async with grpc.aio.insecure_channel(epp.target) as channel:
            process: Any = channel.stream_stream(
                f"/{SERVICE}/Process",
                request_serializer=ProcessingRequest.SerializeToString,
                response_deserializer=ProcessingResponse.FromString,
            )
            call = process()
            with anyio.fail_after(20):
                headers = _headers({":path": "/v1/chat/completions", ":method": "POST"})
                config_ = ProtocolConfiguration(request_body_mode=FULL_DUPLEX, response_body_mode=FULL_DUPLEX)
                await call.write(ProcessingRequest(request_headers=headers, protocol_config=config_))
                await call.write(ProcessingRequest(request_body=HttpBody(body=BODY, end_of_stream=True)))
                routed = await call.read()
                destination = _set_headers(routed, "request_headers")[DESTINATION].split(",")
                assert len(destination) == 2
                body_echo = await call.read()
                assert body_echo.request_body.response.body_mutation.streamed_response.body == BODY
                by_address = {endpoint_address(s.url): s.name for s in pool.snapshots()}
                picked, fallback = by_address[destination[0]], by_address[destination[1]]
                assert pool.snapshot(picked).in_flight == 1
                response_headers = ProcessingRequest(
                    response_headers=_headers({":status": "200", "content-type": "application/json"}),
                    metadata_context=_served(destination[1]),
                )
                await call.write(response_headers)
                named = await call.read()
                assert _set_headers(named, "response_headers")[ENDPOINT_HEADER] == fallback
                assert (pool.snapshot(picked).in_flight, pool.snapshot(fallback).in_flight) == (0, 1)
                await call.write(ProcessingRequest(response_body=HttpBody(body=b"{}", end_of_stream=True)))
                await call.read()
                await call.done_writing()

                async def released() -> bool:
                    return pool.snapshot(fallback).in_flight == 0

                await eventually(released, within_s=10)
        page = epp.router.metrics.render().decode()
    assert f'burstsched_upstream_attempts_total{{endpoint="{picked}",result="gateway_failover"}} 1.0' in page
    assert f'burstsched_requests_total{{endpoint="{fallback}",outcome="ok"}} 1.0' in page
