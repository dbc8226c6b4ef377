"""Short document-QA runs on two simulated replicas, through burstsched and through client-side random:
the plain sequence, and one with classes and a noisy tenant."""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import anyio
import httpx
import pytest

from burstsched.sim import SimConfig, SimPool
from burstsched.workloads.capacity import measure_cold_capacity
from burstsched.workloads.docqa import DocQASpec, build_corpus, build_sequence, remeasure_corpus
from burstsched.workloads.docqa_classes import classed_sequence, plan_of, summarize_classes
from burstsched.workloads.docqa_run import Progress, read_cache_config, reset_prefix_caches, run_target
from burstsched.workloads.placement import Received, attach_replicas, received_counts, simulator_received
from burstsched.workloads.targets import ClientRandomTarget, Endpoints, burstsched_target

CONFIG = Path(__file__).resolve().parents[2] / "config" / "default.yaml"
SPEC = DocQASpec(
    documents=6,
    doc_tokens_min=2100,
    doc_tokens_max=2300,
    max_tokens=4,
    rate=25.0,
    duration_s=2.0,
    max_requests=30,
)
SIM = SimConfig(time_scale=0.02, num_gpu_blocks=2000)  # 32k tokens per replica: every document fits


@pytest.fixture
async def pool() -> AsyncIterator[tuple[Endpoints, str, Received]]:
    async with SimPool(2, SIM, record_requests=True) as sims:
        endpoints = list(zip(sims.names, sims.urls, strict=True))
        yield endpoints, SIM.served_model_name, partial(simulator_received, sims)


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_docqa_through_burstsched_and_random(pool: tuple[Endpoints, str, Received]) -> None:
    endpoints, model, received = pool
    requests = build_sequence(SPEC, random.Random(SPEC.seed))
    assert len(requests) >= 20
    with anyio.fail_after(80):
        async with httpx.AsyncClient(timeout=30.0) as client:

            async def tokenize(text: str) -> list[int]:
                body = {"model": model, "messages": [{"role": "user", "content": text}]}
                response = await client.post(f"{endpoints[0][1]}/tokenize", json=body)
                response.raise_for_status()
                return [int(t) for t in response.json()["tokens"]]

            corpus = await build_corpus(SPEC, tokenize, random.Random(0))
            assert corpus == await remeasure_corpus(corpus, tokenize)
            cache = await read_cache_config(client, endpoints[0][1])
            assert (cache.block_size, cache.num_gpu_blocks) == (16, 2000)
            seen: list[Progress] = []
            runs = {}
            by_replicas = {}
            for target in (burstsched_target(CONFIG), ClientRandomTarget(seed=1)):
                before = received_counts(received)
                runs[target.label] = await run_target(
                    client,
                    target,
                    endpoints,
                    corpus,
                    requests,
                    model,
                    rate=SPEC.rate,
                    max_tokens=SPEC.max_tokens,
                    block_size=cache.block_size,
                    drain_timeout_s=20.0,
                    progress=seen.append,
                    received=received,
                )
                # the replicas' own account of the run, as for a router whose answers name no replica
                copies = [replace(r, replica=None, replica_source=None) for r in runs[target.label].records]
                names = [name for name, _ in endpoints]
                tag = f"docqa-{target.label}"
                assert attach_replicas(copies, tag, names, before, received()) == len(copies)
                by_replicas[target.label] = copies
            await reset_prefix_caches(client, [url for _, url in endpoints])

    assert seen and seen[-1].done == seen[-1].total == len(requests)
    for label, run in runs.items():
        s = run.summary
        assert s.failures == 0 and s.completed == len(requests), (label, [r.error for r in run.records])
        assert [r.document for r in run.records] == [r.document for r in requests]
        assert sum(s.requests_per_replica.values()) == len(requests)
        # every request reached the replica the router's header (or the client) named, and only that one
        assert [r.replica for r in by_replicas[label]] == [r.replica for r in run.records]
        assert all(r.replica_source == "replicas" for r in by_replicas[label])
        assert 0 <= s.cold_moved_share + s.cold_in_place_share < 1  # known: every replica is named
        # the replicas' counters and the responses' usage tell the same story
        assert sum(r.prompt_tokens or 0 for r in run.records) == sum(
            d.prefix_queries for d in run.deltas.values()
        )
        assert sum(r.cached_tokens or 0 for r in run.records) == sum(
            d.prefix_hits for d in run.deltas.values()
        )
        # nothing beats perfect affinity with an infinite cache
        assert 0 < s.hit_rate <= s.ideal_hit_rate + 1e-9
        assert s.ttft_p50_ms <= s.ttft_p95_ms <= s.ttft_p99_ms
        assert s.throughput_rps > 0 and s.output_tokens_per_s > 0
    burst = runs["burstsched:default"]
    assert burst.summary.replica_source == "header"
    assert all("x-burstsched-endpoint" in r.headers for r in burst.records)
    assert runs["random"].summary.replica_source == "client"
    assert burst.summary.router_cpu_ms > 0  # the router child's CPU, read from /proc over the run
    assert math.isnan(runs["random"].summary.router_cpu_ms)  # no router: the client chose
    # prefix-aware routing with every document fitting in cache comes close to the ideal
    assert burst.summary.hit_rate >= 0.85 * burst.summary.ideal_hit_rate


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_cold_capacity_is_replicas_over_cold_service_time(
    pool: tuple[Endpoints, str, Received],
) -> None:
    endpoints, model, _ = pool
    prompts = [f"Calibration document {i}. " + "A line of distinct observations. " * 300 for i in range(6)]
    with anyio.fail_after(50):
        async with httpx.AsyncClient(timeout=30.0) as client:
            capacity = await measure_cold_capacity(client, endpoints, model, prompts, 4, warmup=1)
            with pytest.raises(ValueError, match="warmup"):
                await measure_cold_capacity(client, endpoints, model, prompts[:3], 4, warmup=1)
    assert capacity.samples == 4  # 3 prompts per replica, one of them a warm-up
    # one request at a time per replica: the pool serves about (replicas / mean service time)
    assert capacity.requests_per_s == pytest.approx(2 / capacity.mean_service_s, rel=0.3)


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_docqa_classes_and_a_noisy_tenant_on_the_simulator() -> None:
    """Classes and a noisy tenant end to end: every request reaches a replica with its class's headers
    (straight, client-side random) and through burstsched; the rows per class add up to the run's."""
    spec = replace(SPEC, max_requests=16)
    plan = plan_of("urgent:0.25:objective=urgent,rest:0.75:tenant=quiet", "loud:2")
    assert plan is not None
    requests = classed_sequence(spec, build_sequence(spec, random.Random(spec.seed)), plan)
    assert {r.request_class for r in requests} == {"urgent", "rest", "loud"}
    with anyio.fail_after(80):
        async with SimPool(2, SIM, record_requests=True) as sims, httpx.AsyncClient(timeout=30.0) as client:
            endpoints = list(zip(sims.names, sims.urls, strict=True))
            model = SIM.served_model_name

            async def tokenize(text: str) -> list[int]:
                body = {"model": model, "messages": [{"role": "user", "content": text}]}
                response = await client.post(f"{endpoints[0][1]}/tokenize", json=body)
                response.raise_for_status()
                return [int(t) for t in response.json()["tokens"]]

            corpus = await build_corpus(spec, tokenize, random.Random(0))
            runs = {}
            for target in (ClientRandomTarget(seed=1), burstsched_target(CONFIG)):
                runs[target.label] = await run_target(
                    client,
                    target,
                    endpoints,
                    corpus,
                    requests,
                    model,
                    rate=spec.rate,
                    max_tokens=spec.max_tokens,
                    block_size=16,
                    drain_timeout_s=20.0,
                )
            received = {
                r.headers.get("x-request-id", ""): r.headers for i in range(2) for r in sims.requests(i)
            }
    for request in requests:  # straight to the replicas: each request's headers as its class says
        headers = received[f"docqa-random-{request.index}"]
        assert {k: v for k, v in headers.items() if k.startswith("x-llm-d-")} == dict(request.headers)
    for label, run in runs.items():
        records = run.records
        assert run.summary.completed == len(requests), (label, [r.error for r in records])
        assert [r.request_class for r in records] == [r.request_class for r in requests]
        rows = summarize_classes(plan, records, 2000.0, run.summary.makespan_s)
        assert [r.request_class for r in rows] == ["urgent", "rest", "loud"]
        assert sum(r.sent for r in rows) == sum(r.completed for r in rows) == len(requests)
        assert sum(r.good for r in rows) == sum(1 for r in records if (r.ttft_ms or math.inf) <= 2000.0)
        assert all(r.refused_429 == r.other_failures == 0 for r in rows)
        assert sum(r.goodput_rps for r in rows) <= run.summary.throughput_rps + 1e-9
