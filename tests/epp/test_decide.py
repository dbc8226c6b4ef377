"""The picker makes ``serve``'s decision (:func:`burstsched.front.decide.decide`): flow control, the plugins'
request headers, the prefill cap of both sharing roles, the cap on its whole wait; and both fronts choose the
same endpoint for the same request on the same pool. Real router parts over simulated replicas."""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest
from burstsched_plugins.session_affinity import encode_endpoint

from burstsched.admission.grouping import shared_blocks
from burstsched.config import FlowControlConfig, HeadroomConfig, RouterConfig
from burstsched.epp.picker import Pick, Picker, Refusal
from burstsched.epp.service import running_epp
from burstsched.front.app import Router
from burstsched.server.serve import running_router
from burstsched.sim import SimPool
from tests.router.helpers import eventually, metric, router_config

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
MODEL = "kv-demo"
CHAT = "/v1/chat/completions"
AFFINITY = """
admission: {enabled: false}
plugins:
  - type: session-affinity-filter
  - type: queue-scorer
  - type: max-score-picker
profile:
  plugins:
    - plugin_ref: session-affinity-filter
    - plugin_ref: queue-scorer
  picker: max-score-picker
"""


def _body(text: str, **extra: object) -> bytes:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2, **extra}
    return json.dumps(payload).encode()


def _words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(10**9):09d}" for _ in range(n))


def _pool(sims: SimPool) -> list[tuple[str, str]]:
    return list(zip(sims.names, sims.urls, strict=True))[:2]


@asynccontextmanager
async def _router(config: RouterConfig) -> AsyncIterator[Router]:
    """The router as ``burstsched epp`` assembles it, once both replicas are healthy."""
    async with running_epp(config, rng=random.Random(3)) as epp:

        async def healthy() -> bool:
            return epp.router.pool.healthy_count() == 2

        await eventually(healthy, within_s=10)
        yield epp.router


def _no_room(router: Router) -> None:
    """Every endpoint at the flow queue's in-flight bound (``max_in_flight: 1``): one request each."""
    for name in router.pool.names:
        router.pool.acquire(name, 100, 100)


def _flow(retry_after_s: int = 1) -> FlowControlConfig:
    headroom = HeadroomConfig(max_in_flight=1)
    objectives = {"batch": -1}
    return FlowControlConfig(
        enabled=True, headroom=headroom, objectives=objectives, retry_after_s=retry_after_s
    )


async def test_a_sheddable_request_is_refused_with_retry_after_when_the_queue_has_no_room(
    sims: SimPool,
) -> None:
    config = router_config(_pool(sims), flow_control=_flow(retry_after_s=3))
    async with _router(config) as router:
        _no_room(router)
        picker = Picker(router, max_wait_s=1.0)
        headers = {"x-llm-d-inference-objective": "batch", "x-llm-d-inference-fairness-id": "tenant-a"}
        with anyio.fail_after(5):
            outcome = await picker.pick(CHAT, headers, _body("hello"), None)
        page = router.metrics.render().decode()
    assert isinstance(outcome, Refusal), outcome
    assert (outcome.status, outcome.outcome) == (429, "throttled")
    assert ("retry-after", "3") in outcome.headers
    assert "sheddable" in outcome.message
    assert metric(page, "burstsched_flow_queue_wait_seconds_count", outcome="shed", priority="-1") == 1


async def test_the_flow_queue_wait_counts_in_the_cap(sims: SimPool) -> None:
    """A request the queue holds (no room anywhere) leaves it at the picker's cap and is scheduled alone:
    the gateway gets its answer in time."""
    config = router_config(_pool(sims), flow_control=_flow())
    async with _router(config) as router:
        _no_room(router)
        picker = Picker(router, max_wait_s=0.2)
        with anyio.fail_after(5):
            started = time.monotonic()
            outcome = await picker.pick(CHAT, {}, _body(_words(1, 50)), None)
            waited = time.monotonic() - started
        depth = router.flow.depth if router.flow is not None else -1
    assert isinstance(outcome, Pick), outcome
    assert 0.2 <= waited < 1.0, waited
    assert picker.capped == 1
    assert depth == 0  # it left the queue


async def test_the_plugins_request_headers_reach_the_decision(sims: SimPool) -> None:
    """llm-d's session affinity: the client's ``x-session-token`` names the endpoint that gets the request."""
    async with _router(router_config(_pool(sims), AFFINITY)) as router:
        picker = Picker(router)
        for name in router.pool.names:
            token = encode_endpoint(name)
            with anyio.fail_after(5):
                outcome = await picker.pick(CHAT, {"x-session-token": token}, _body("hi"), None)
            assert isinstance(outcome, Pick), outcome
            assert outcome.endpoint.name == name
            assert outcome.request is not None
            assert ("x-session-token", token) in outcome.request.headers


async def test_a_joined_request_computes_only_what_its_group_does_not(sims: SimPool) -> None:
    """A late member of a group placed in an earlier window joins the group's endpoint (role ``joined``):
    its queued prefill leaves out the prefix its group's first request computes there, as a member's does."""
    shared = _words(7, 600)
    async with _router(router_config(_pool(sims))) as router:
        picker = Picker(router)
        with anyio.fail_after(5):
            first = await picker.pick(CHAT, {}, _body(shared + " first question"), None)
            late = await picker.pick(CHAT, {}, _body(shared + " " + _words(8, 200)), None)
        page = router.metrics.render().decode()
    assert isinstance(first, Pick) and isinstance(late, Pick), (first, late)
    assert first.request is not None and late.request is not None
    assert late.endpoint.name == first.endpoint.name
    assert metric(page, "burstsched_admission_wait_seconds_count", role="joined") == 1, page
    common = shared_blocks(first.request.block_hashes, late.request.block_hashes)
    assert common >= 4
    expected = late.request.prompt_tokens - common * late.request.block_tokens
    assert late.queued_prefill == expected < late.request.prompt_tokens


async def test_both_fronts_choose_the_same_endpoint(sims: SimPool) -> None:
    """One router, served over HTTP: for each of two prompts warm on the pool, the picker's pick and the
    endpoint ``serve`` proxies the same request to are the same."""
    config = router_config(_pool(sims))
    async with (
        running_router(config, rng=random.Random(2)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=30) as client,
    ):
        router: Router = served.app.state.router

        async def healthy() -> bool:
            return router.pool.healthy_count() == 2

        await eventually(healthy, within_s=10)
        picker = Picker(router)
        with anyio.fail_after(30):
            for seed in (11, 12):
                prefix = _words(seed, 600)
                warm = await client.post(CHAT, content=_body(prefix + " warm"))
                assert warm.status_code == 200, warm.text
                body = _body(prefix + " again", stream=False)
                picked = await picker.pick(CHAT, {}, body, None)
                assert isinstance(picked, Pick), picked
                proxied = await client.post(CHAT, content=body)
                assert proxied.status_code == 200, proxied.text
                assert proxied.headers["x-burstsched-endpoint"] == picked.endpoint.name
