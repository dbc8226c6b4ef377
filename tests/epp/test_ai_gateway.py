"""``burstsched epp`` behind a real Envoy configured as Envoy AI Gateway configures it for an InferencePool
(:func:`~burstsched.workloads.gateway.ai_gateway_config`: the picker's ext_proc last before the router,
FULL_DUPLEX_STREAMED or BUFFERED bodies, fail-closed, TLS to the picker, no filter stripping a client's
destination header), in front of simulated replicas, all on 127.0.0.1."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from burstsched.epp.service import running_epp
from burstsched.epp.tls import self_signed
from burstsched.epp.wire import endpoint_address
from burstsched.sim import SimPool
from burstsched.workloads.gateway import DESTINATION, EnvoyMode, ai_gateway_config, ai_gateway_mode, envoy
from tests.epp.gateway_requests import burst_landings, chat, each_api
from tests.router.helpers import router_config

REPO = Path(__file__).resolve().parents[2]
MODES = {
    "duplex": ai_gateway_mode(),
    "buffered": ai_gateway_mode("buffered"),
    "duplex-override": ai_gateway_mode(allow_mode_override=True),
}

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@asynccontextmanager
async def gateway(
    sims: SimPool, envoy_path: Path, workdir: Path, mode: EnvoyMode, yaml_name: str = "default.yaml"
) -> AsyncIterator[httpx.AsyncClient]:
    """The picker (TLS with a certificate it makes, as AI Gateway expects) on the first two replicas, and
    Envoy in AI Gateway's configuration in front of it."""
    pool = list(zip(sims.names, sims.urls, strict=True))[:2]
    config = router_config(pool, (REPO / "config" / yaml_name).read_text())
    async with running_epp(config, tls=self_signed(), rng=random.Random(7)) as epp:
        with envoy(envoy_path, epp.port, mode, workdir) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                yield client


def test_the_configuration_is_ai_gateways() -> None:
    """What Envoy is given: the picker's ext_proc named as AI Gateway names it, last before the router, with
    its processing modes and timeouts; an ORIGINAL_DST cluster on the destination header; the picker's
    cluster over TLS and HTTP/2."""
    config: Any = ai_gateway_config(10080, 10081, 9002, ai_gateway_mode())
    resources = config["static_resources"]
    hcm = resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    filters = hcm["http_filters"]
    assert [f["name"] for f in filters] == [
        "envoy.filters.http.ext_proc/endpointpicker/burstsched_default_ext_proc",
        "envoy.filters.http.router",
    ]
    ext_proc = filters[0]["typed_config"]
    assert ext_proc["processing_mode"] == {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED",
        "response_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND",
        "response_trailer_mode": "SEND",
    }
    assert (ext_proc["message_timeout"], ext_proc["failure_mode_allow"]) == ("300s", False)
    assert "allow_mode_override" not in ext_proc and "timeout" not in ext_proc["grpc_service"]
    assert ext_proc["grpc_service"]["envoy_grpc"] == {
        "cluster_name": "envoy.clusters.endpointpicker_burstsched_default_ext_proc",
        "authority": "burstsched-epp.default.svc:9002",
    }
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route == {
        "cluster": "httproute/default/burstsched/rule/0",
        "timeout": "60s",
        "auto_host_rewrite": False,
    }
    rule, picker = resources["clusters"]
    assert (rule["type"], rule["lb_policy"], rule["connect_timeout"]) == (
        "ORIGINAL_DST",
        "CLUSTER_PROVIDED",
        "10s",
    )
    assert rule["original_dst_lb_config"] == {"use_http_header": True, "http_header_name": DESTINATION}
    assert (picker["type"], picker["lb_policy"], picker["connect_timeout"]) == (
        "STRICT_DNS",
        "LEAST_REQUEST",
        "10s",
    )
    assert picker["transport_socket"]["typed_config"]["common_tls_context"] == {"validation_context": {}}
    buffered: Any = ai_gateway_config(1, 2, 3, ai_gateway_mode("buffered", allow_mode_override=True))
    hcm = buffered["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = hcm["http_filters"][0]["typed_config"]
    assert ext_proc["processing_mode"]["request_body_mode"] == "BUFFERED"
    assert ext_proc["processing_mode"]["response_body_mode"] == "BUFFERED"
    assert ext_proc["allow_mode_override"] is True


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
async def test_chat_and_completions_streamed_and_not(
    sims: SimPool, envoy_path: Path, workdir: Path, mode: EnvoyMode
) -> None:
    """Each API, streamed and whole, passes through intact; the replica the picker named served it, and saw
    only the picker's destination header, even when the client sent one naming the decoy (AI Gateway does
    not strip it: the picker overwrites it)."""
    decoy = {DESTINATION: endpoint_address(sims.urls[2])}
    async with gateway(sims, envoy_path, workdir, mode) as client:
        with anyio.fail_after(60):
            served = await each_api(client, decoy)
    assert set(served) <= set(sims.names[:2])
    for index, name in enumerate(sims.names[:2]):
        destinations = [r.headers.get(DESTINATION) for r in sims.requests(index)]
        assert destinations == [endpoint_address(sims.urls[index])] * served.count(name)
    assert sims.requests(2) == []


@pytest.mark.parametrize("mode", [MODES["duplex"], MODES["buffered"]], ids=["duplex", "buffered"])
async def test_a_burst_sharing_a_new_prefix_lands_on_one_replica(
    sims: SimPool, envoy_path: Path, workdir: Path, mode: EnvoyMode
) -> None:
    """Burst admission through AI Gateway's configuration: each burst of 8 sharing a new prefix is served by
    one replica (the one each replica's own record shows), and the bursts do not all pile on one."""
    async with gateway(sims, envoy_path, workdir, mode) as client:
        with anyio.fail_after(60):
            landed = await burst_landings(client, random.Random(11))
    assert all(len(s) == 1 for s in landed), landed
    assert len(set().union(*landed)) == 2, landed
    for index in (0, 1):  # each replica's own record agrees with the picker's header
        assert len(sims.requests(index)) == 8 * landed.count({sims.names[index]})


@pytest.mark.parametrize("mode", [MODES["duplex"], MODES["buffered"]], ids=["duplex", "buffered"])
async def test_an_unknown_model_is_refused_in_openais_shape(
    sims: SimPool, envoy_path: Path, workdir: Path, mode: EnvoyMode
) -> None:
    """The picker's refusal passes through Envoy unchanged: 404 with OpenAI's error JSON, whole or streamed,
    and no replica sees the request."""
    async with gateway(sims, envoy_path, workdir, mode) as client:
        with anyio.fail_after(30):
            whole = await client.post("/v1/chat/completions", json={**chat("hi"), "model": "no-such-model"})
            streamed = await client.post(
                "/v1/completions",
                json={"model": "no-such-model", "prompt": "x", "max_tokens": 2, "stream": True},
            )
    for response in (whole, streamed):
        assert response.status_code == 404, response.text
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert error["code"] == "model_not_found" and "no-such-model" in error["message"]
        assert error["type"]
    assert sims.requests(0) == sims.requests(1) == sims.requests(2) == []
