"""A burst through the admission window, traced: one trace per client, one window and group for the burst."""

from __future__ import annotations

import random
import secrets
from typing import Any

import anyio
import httpx
import pytest

from burstsched.config import RouterConfig, parse_config_text
from burstsched.server.serve import running_router
from burstsched.sim import SimConfig, SimPool
from burstsched.telemetry import attributes as attr
from burstsched.telemetry.receiver import ReceivedSpan

from .receiver_fixture import served_receiver

MODEL = "kv-demo"
BURST = 6


def _config(pool: SimPool, receiver_url: str) -> RouterConfig:
    endpoints = "\n".join(
        f"  - {{name: {n}, url: '{u}'}}" for n, u in zip(pool.names, pool.urls, strict=True)
    )
    return parse_config_text(
        f"endpoints:\n{endpoints}\n"
        "pool: {scrape_interval_ms: 20, staleness_threshold_ms: 2000, health_check_interval_ms: 100}\n"
        # the window seals when the whole burst is in it (max_batch), well before window_ms
        f"admission: {{enabled: true, window_ms: 1000, max_batch: {BURST}, min_shared_blocks: 2}}\n"
        f"tracing: {{enabled: true, endpoint: '{receiver_url}', detail: full}}\n"
    )


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    matching = [s for s in spans if s.name == name]
    assert len(matching) == 1, [s.name for s in spans]
    return matching[0]


@pytest.mark.anyio
async def test_a_burst_shares_one_window_and_group_and_each_admission_span_covers_its_wait() -> None:
    shared = "Shared context for the burst. " + " ".join(f"fact {i}: {random.random()}" for i in range(300))
    traces = [(secrets.token_hex(16), secrets.token_hex(8)) for _ in range(BURST)]
    async with served_receiver() as rx, SimPool(2, SimConfig(time_scale=0.02)) as pool:
        async with running_router(_config(pool, rx.url), rng=random.Random(3)) as router:
            async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
                statuses: list[int] = []

                async def ask(i: int) -> None:
                    body: dict[str, Any] = {
                        "model": MODEL,
                        "messages": [{"role": "user", "content": f"{shared}\nQuestion {i}: why?"}],
                        "max_tokens": 4,
                        "stream": True,
                    }
                    trace_id, span_id = traces[i]
                    headers = {"traceparent": f"00-{trace_id}-{span_id}-01"}
                    response = await client.post("/v1/chat/completions", json=body, headers=headers)
                    statuses.append(response.status_code)

                with anyio.fail_after(60):
                    async with anyio.create_task_group() as tg:
                        for i in range(BURST):
                            tg.start_soon(ask, i)
                assert statuses == [200] * BURST

    admissions, upstreams = [], []
    for trace_id, client_span in traces:
        spans = rx.receiver.by_trace(trace_id)  # each client's trace id carried through
        server = _one(spans, "POST /v1/chat/completions")
        admission, schedule = _one(spans, attr.SPAN_ADMISSION), _one(spans, attr.SPAN_SCHEDULE)
        upstream = _one(spans, f"chat {MODEL}")
        assert server.parent_span_id == client_span
        assert {admission.parent_span_id, schedule.parent_span_id, upstream.parent_span_id} == {
            server.span_id
        }
        assert admission.end_ns <= upstream.start_ns
        assert schedule.attributes[attr.ENDPOINT] == upstream.attributes[attr.ENDPOINT]
        assert schedule.attributes[attr.GROUP_ID] == admission.attributes[attr.GROUP_ID]
        assert admission.attributes[attr.ADMISSION_BYPASS] is False
        assert admission.attributes[attr.ADMISSION_WAITED_S] > 0
        assert upstream.event(attr.EVENT_FIRST_TOKEN) is not None
        admissions.append(admission)
        upstreams.append(upstream)

    assert len({a.attributes[attr.WINDOW_ID] for a in admissions}) == 1
    assert len({a.attributes[attr.GROUP_ID] for a in admissions}) == 1
    assert {a.attributes[attr.GROUP_SIZE] for a in admissions} == {BURST}
    assert sorted(a.attributes[attr.GROUP_ROLE] for a in admissions) == ["leader"] + ["member"] * (BURST - 1)
    assert len({u.attributes[attr.ENDPOINT] for u in upstreams}) == 1  # the group went to one endpoint
    # every member was still waiting when the last one arrived: the window held them all until it sealed
    assert max(a.start_ns for a in admissions) <= min(a.end_ns for a in admissions)
