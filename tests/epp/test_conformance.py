"""The EPP-facing checks of the Gateway API Inference Extension conformance suite, reproduced with a real
Envoy (llm-d's standalone configuration, reporting the endpoint that served), ``burstsched epp`` running the
suite's test filter (``header-based-testing-filter``) and three simulated replicas, all on 127.0.0.1.

The suite (kubernetes-sigs/gateway-api-inference-extension, conformance/tests/ at 84436a96) steers requests
with the ``test-epp-endpoint-selection`` header and checks that:

- ``GatewayFollowingEPPRouting``: a request naming one pod is served by it, one naming several by one of them
  (100 requests, 10 at a time); ``...WithDataParallelism``: a pod's IP alone covers each of its ports;
- ``GatewayDestinationEndpointServed``: the gateway reports the served ``IP:PORT`` to the picker
  (``x-gateway-destination-endpoint-served`` in ``envoy.lb`` metadata), which the suite's picker echoes in
  ``x-conformance-test-served-endpoint``;
- ``EppUnAvailableFailOpen``: with the pool's picker gone and its failureMode FailOpen, requests still get
  200 from a pod of the pool.

Every replica here listens on 127.0.0.1, so an address is ``127.0.0.1:PORT`` where the suite sends a pod IP.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from burstsched.config import parse_config_text
from burstsched.epp.service import running_epp
from burstsched.epp.wire import endpoint_address
from burstsched.framework import (
    ApiKind,
    CycleState,
    EndpointSnapshot,
    Filter,
    HeaderReader,
    PluginContext,
    PluginRegistry,
    SchedRequest,
)
from burstsched.sim import SimPool
from burstsched.workloads.gateway import SERVED, EnvoyMode, envoy, epp_process
from tests.router.helpers import router_config

SELECT = "test-epp-endpoint-selection"
CONFIG = """
admission:
  enabled: false                 # each request placed alone, as its own header says
plugins:
  - type: header-based-testing-filter
  - type: random-picker
profile:
  plugins:
    - plugin_ref: header-based-testing-filter
  picker: random-picker
"""
BODY = {"model": "kv-demo", "prompt": "Write as if you were a critic: San Francisco", "max_tokens": 2}
REPORTING = EnvoyMode(report_served=True)
CONFORMANCE_SERVED = "x-conformance-test-served-endpoint"
"""The response header the suite reads the served address from (``burstsched epp --served-header``)."""

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def test_the_filter_is_registered_opt_in_and_parses_as_the_suite() -> None:
    """Registered under the suite's type name, in no shipped config; IPv4 and IPv6, with and without port."""
    registry = PluginRegistry.discover()
    filter_type = registry.get("header-based-testing-filter")
    assert filter_type is not None
    shipped = Path(__file__).resolve().parents[2] / "config"
    assert all("header-based-testing-filter" not in p.read_text() for p in shipped.glob("*.yaml"))
    plugin = filter_type("steer", filter_type.Parameters(), PluginContext())
    assert isinstance(plugin, Filter) and isinstance(plugin, HeaderReader)
    assert plugin.request_headers == (SELECT,)
    pool = [
        EndpointSnapshot(name="a", url="http://10.0.0.1:8000"),
        EndpointSnapshot(name="b", url="http://10.0.0.1:8001"),
        EndpointSnapshot(name="c", url="http://[fd00::1]:8000/v1"),
    ]

    def kept(value: str | None) -> list[str]:
        headers = () if value is None else ((SELECT, value),)
        request = SchedRequest(request_id="r", model="m", api=ApiKind.COMPLETIONS, headers=headers)
        return [e.name for e in plugin.filter(request, pool, CycleState())]

    assert kept(None) == kept("") == kept(" ") == ["a", "b", "c"]
    assert kept("10.0.0.1:8001") == ["b"]
    assert kept("10.0.0.1") == ["a", "b"]
    assert kept("[fd00:0::1]:8000,10.0.0.1:8000") == ["c", "a"]
    assert kept("fd00::1, [fd00::1], 10.0.0.1:8001,10.0.0.1:8001") == ["c", "b"]
    assert kept("10.0.0.2,10.0.0.1:9") == []  # the scheduler then keeps them all (its filters fail open)
    config = parse_config_text(CONFIG)
    assert [p.type for p in config.plugins] == ["header-based-testing-filter", "random-picker"]


def _addresses(sims: SimPool) -> list[str]:
    return [endpoint_address(url) for url in sims.urls]


@asynccontextmanager
async def conformance_gateway(
    sims: SimPool, envoy_path: Path, workdir: Path, mode: EnvoyMode = REPORTING
) -> AsyncIterator[httpx.AsyncClient]:
    """The picker (in process, the suite's filter) over all three replicas, Envoy in front."""
    config = router_config(list(zip(sims.names, sims.urls, strict=True)), CONFIG)
    async with running_epp(config, rng=random.Random(5), served_header=CONFORMANCE_SERVED) as epp:
        with envoy(envoy_path, epp.port, mode, workdir) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                yield client


async def _served_by(client: httpx.AsyncClient, sims: SimPool, selection: str, total: int) -> list[str]:
    """Send ``total`` requests (10 at a time) selecting ``selection``; the replica each landed on, as the
    replicas' own records say, checked against the picker's and the gateway's answer headers."""
    before = [len(sims.requests(i)) for i in range(3)]
    limit = asyncio.Semaphore(10)

    async def one() -> tuple[str, str]:
        async with limit:
            response = await client.post("/v1/completions", json=BODY, headers={SELECT: selection})
        assert response.status_code == 200, response.text
        assert response.json()["object"] == "text_completion"
        return response.headers["x-burstsched-endpoint"], response.headers[SERVED]

    answers = await asyncio.gather(*(one() for _ in range(total)))
    names = [name for name, _ in answers]
    addresses = _addresses(sims)
    assert [served for _, served in answers] == [addresses[sims.names.index(n)] for n in names]
    landed = [len(sims.requests(i)) - before[i] for i in range(3)]
    assert landed == [names.count(sims.names[i]) for i in range(3)], (landed, names)
    return names


async def test_gateway_following_epp_routing(sims: SimPool, envoy_path: Path, workdir: Path) -> None:
    """``GatewayFollowingEPPRouting``: one address, two, all three; every request lands within them."""
    addresses, names = _addresses(sims), sims.names
    async with conformance_gateway(sims, envoy_path, workdir) as client:
        with anyio.fail_after(90):
            for index, address in enumerate(addresses):
                assert set(await _served_by(client, sims, address, 3)) == {names[index]}
            cases: list[tuple[Sequence[int], int]] = [((2,), 30), ((0, 1), 30), ((0, 1, 2), 30)]
            for chosen, total in cases:
                selection = ",".join(addresses[i] for i in chosen)
                landed = await _served_by(client, sims, selection, total)
                assert set(landed) <= {names[i] for i in chosen}, (selection, landed)


async def test_the_selection_header_syntax(sims: SimPool, envoy_path: Path, workdir: Path) -> None:
    """The filter's parsing, as the suite's pickers parse: spaces and blank items ignored, an address not in
    the pool skipped, a bare IP covering each port at it (``GatewayFollowingEPPRoutingWithDataParallelism``:
    here every replica shares 127.0.0.1). Where the list names no endpoint of the pool the suite's pickers
    answer 503; burstsched's scheduler fails open to the whole pool instead (its filters never leave none)."""
    addresses, names = _addresses(sims), sims.names
    async with conformance_gateway(sims, envoy_path, workdir) as client:
        with anyio.fail_after(60):
            spaced = f"10.255.0.9:3000 , ,{addresses[1]}"
            assert set(await _served_by(client, sims, spaced, 6)) == {names[1]}
            assert set(await _served_by(client, sims, "127.0.0.1", 30)) == set(names)
            assert set(await _served_by(client, sims, "10.255.0.9", 6)) <= set(names)


async def test_gateway_destination_endpoint_served(sims: SimPool, envoy_path: Path, workdir: Path) -> None:
    """``GatewayDestinationEndpointServed``: the served ``IP:PORT`` the gateway reports (to the picker in
    ``envoy.lb`` metadata, here also to the client in the response header of the same name) is the address
    the request selected, for each replica, whole and streamed; the picker (``--served-header``) echoes the
    address it holds the request on after hearing the report (a fallback that served replaces the pick) in
    ``x-conformance-test-served-endpoint``, where the suite reads it."""
    addresses = _addresses(sims)
    async with conformance_gateway(sims, envoy_path, workdir) as client:
        with anyio.fail_after(60):
            for index, address in enumerate(addresses):
                whole = await client.post("/v1/completions", json=BODY, headers={SELECT: address})
                assert whole.status_code == 200, whole.text
                assert whole.headers[SERVED] == whole.headers[CONFORMANCE_SERVED] == address
                assert whole.headers["x-burstsched-endpoint"] == sims.names[index]
                body = {**BODY, "stream": True}
                async with client.stream(
                    "POST", "/v1/completions", json=body, headers={SELECT: address}
                ) as s:
                    await s.aread()
                assert s.status_code == 200 and s.headers[SERVED] == s.headers[CONFORMANCE_SERVED] == address
                assert len(sims.requests(index)) == 2


async def test_epp_unavailable_fail_open(sims: SimPool, envoy_path: Path, workdir: Path) -> None:
    """``EppUnAvailableFailOpen``: the picker (its own process) steers to replica 1; once it is killed (by
    PID), Envoy with ``failure_mode_allow`` still answers 200, from the pool's fallback address (replica 0):
    a standalone Envoy knows no pool membership, so the fallback is one address of the pool. The request
    body is BUFFERED: in FULL_DUPLEX_STREAMED Envoy 1.40 fails such a request itself (500) even with
    ``failure_mode_allow`` (tests/epp/test_process.py)."""
    addresses = _addresses(sims)
    config = workdir / "conformance.yaml"
    config.write_text(CONFIG)
    mode = EnvoyMode(
        request_body="BUFFERED",
        response_body="NONE",
        failure_mode_allow=True,
        fail_open_to=addresses[0],
        report_served=True,
    )
    endpoints = list(zip(sims.names, sims.urls, strict=True))
    with anyio.fail_after(90):
        async with epp_process(config, endpoints) as (process, port):
            with envoy(envoy_path, port, mode, workdir) as gw:
                async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
                    steered = await client.post("/v1/completions", json=BODY, headers={SELECT: addresses[1]})
                    assert steered.status_code == 200, steered.text
                    assert steered.headers[SERVED] == addresses[1]
                    assert steered.headers["x-burstsched-endpoint"] == sims.names[1]
                    process.kill()
                    await anyio.to_thread.run_sync(process.wait, 10)
                    after = [
                        await client.post("/v1/completions", json=BODY, headers={SELECT: addresses[1]})
                        for _ in range(3)
                    ]
    for response in after:
        assert response.status_code == 200, response.text
        assert response.headers[SERVED] == addresses[0]
        assert "x-burstsched-endpoint" not in response.headers  # no picker answered
    assert (len(sims.requests(0)), len(sims.requests(1))) == (3, 1)
