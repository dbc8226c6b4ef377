"""A short multi-tenant chat run on two simulated replicas through client-side random routing."""

from __future__ import annotations

import random
from functools import partial

import anyio
import httpx
import pytest

from burstsched.sim import SimConfig, SimPool
from burstsched.workloads.placement import simulator_received
from burstsched.workloads.targets import ClientRandomTarget
from burstsched.workloads.tenants import TenantsSpec, build_sequence, build_tenants
from burstsched.workloads.tenants_run import run_target

SPEC = TenantsSpec(
    tenants=3,
    system_tokens_min=300,
    system_tokens_max=600,
    think_gaps=2.0,
    burst_users=4,
    burst_gaps=10.0,
    max_tokens=4,
    rate=20.0,
    duration_s=2.0,
    max_requests=30,
    seed=1,
)
SIM = SimConfig(time_scale=0.02, num_gpu_blocks=2000)


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_tenants_run_follows_turns_and_stays_below_the_ideal() -> None:
    requests = build_sequence(SPEC, random.Random(SPEC.seed))
    assert len(requests) >= 20 and any(r.follows is not None for r in requests)
    with anyio.fail_after(50):
        async with SimPool(2, SIM, record_requests=True) as sims, httpx.AsyncClient(timeout=30.0) as client:
            endpoints = list(zip(sims.names, sims.urls, strict=True))
            model = SIM.served_model_name

            async def tokenize(messages: list[dict[str, str]]) -> list[int]:
                response = await client.post(
                    f"{endpoints[0][1]}/tokenize", json={"model": model, "messages": messages}
                )
                response.raise_for_status()
                return [int(t) for t in response.json()["tokens"]]

            async def count(text: str) -> int:
                return len(await tokenize([{"role": "user", "content": text}]))

            tenants = await build_tenants(SPEC, count, random.Random(0))
            prompts = [await tokenize(tenants.messages(r)) for r in requests]
            run = await run_target(
                client,
                ClientRandomTarget(seed=2),
                endpoints,
                tenants,
                requests,
                prompts,
                model,
                rate=SPEC.rate,
                max_tokens=SPEC.max_tokens,
                block_size=16,
                drain_timeout_s=20.0,
                received=partial(simulator_received, sims),
            )
    s = run.summary
    # the client named every replica itself, and the replicas' own account left those names alone
    assert s.replica_source == "client"
    assert 0 <= s.cold_moved_share + s.cold_in_place_share <= 1  # every conversation's replicas known
    assert s.completed == len(requests) and s.failures == s.refused == 0
    records = {r.index: r for r in run.records}
    for request in requests:
        record = records[request.index]
        assert record.prompt_tokens == len(prompts[request.index])  # the sent prompt is the tokenized one
        assert record.completion_tokens == SPEC.max_tokens
        if request.follows is not None:  # a turn leaves only after the previous turn's stream ended
            leader = records[request.follows]
            assert leader.sent_s is not None and leader.e2e_ms is not None and record.sent_s is not None
            assert record.sent_s >= leader.sent_s + leader.e2e_ms / 1000 - 1e-3
    assert 0 < s.hit_rate <= s.ideal_hit_rate + 1e-9
    assert s.e2e_p50_ms >= s.ttft_p50_ms
    assert sum(s.requests_per_replica.values()) == len(requests)
