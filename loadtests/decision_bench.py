"""The whole scheduling decision at N endpoints: ``schedule`` alone, and the admission path as the app
runs it.

For each config (approximate: ``config/default.yaml``; precise: ``config/precise.yaml``), in one process:

- the pool is a real :class:`EndpointPool` of N endpoints (snapshots built as the app builds them, scraped
  metrics set), the prefix index holds ``--docs`` documents of ``--doc-tokens`` tokens spread over the
  endpoints (the precise one filled through BlockStored events, the approximate one through dispatches);
- ``schedule``: p50/p99 of one call for a request whose document is cached on one endpoint;
- admission: CPU time (``time.process_time``) per request of ``Admission.admit`` with the config's window
  (warm requests bypass it; cold ones wait for it), sequential, so only the router's own work is counted.

    python loadtests/decision_bench.py [--endpoints 64] [--requests 3000] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from burstsched.admission import Admission
from burstsched.config import EndpointConfig, RouterConfig, TokenizerConfig, parse_config_text
from burstsched.dispatch import HttpxUpstream, getter
from burstsched.framework import (
    ApiKind,
    BlockStored,
    EventBatch,
    KVEventConsumer,
    PluginContext,
    PluginRegistry,
    SchedRequest,
)
from burstsched.pool import EndpointPool
from burstsched.prefix.hashing import block_hashes
from burstsched.scheduling import build_scheduler

REPO = Path(__file__).resolve().parents[1]
BLOCK = 16


def _config(name: str, endpoints: int) -> RouterConfig:
    config = parse_config_text((REPO / "config" / name).read_text())
    eps = [EndpointConfig(name=f"e{i}", url=f"http://127.0.0.1:{20000 + i}") for i in range(endpoints)]
    return config.model_copy(update={"endpoints": eps, "tokenizer": TokenizerConfig()})


def _document(rng: random.Random, tokens: int) -> list[int]:
    return [rng.randrange(5, 4000) for _ in range(tokens)]


def _request(i: int, tokens: list[int], precise: bool) -> SchedRequest:
    data = b"".join(t.to_bytes(4, "little") for t in tokens)
    return SchedRequest(
        request_id=f"r{i}",
        model="m",
        api=ApiKind.CHAT,
        block_hashes=block_hashes(data, model="m"),
        prompt_tokens=len(tokens),
        token_ids=tuple(tokens) if precise else None,
    )


def _replica_page(request: httpx.Request) -> httpx.Response:
    """What a vLLM replica answers to the pool's checks (an in-process fake: no sockets)."""
    if request.url.path == "/metrics":
        waiting = request.url.port % 3 if request.url.port else 0
        page = (
            f'vllm:num_requests_waiting{{model_name="m",engine="0"}} {waiting}\n'
            'vllm:num_requests_running{model_name="m",engine="0"} 2\n'
            'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.3\n'
            f'vllm:cache_config_info{{block_size="{BLOCK}",num_gpu_blocks="20000",engine="0"}} 1\n'
        )
        return httpx.Response(200, text=page)
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "object": "model"}]})
    return httpx.Response(200, json={})


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _bench(name: str, endpoints: int, requests: int, docs: int, doc_tokens: int) -> dict[str, Any]:
    config = _config(name, endpoints)
    scheduler = build_scheduler(config, PluginRegistry.discover(), PluginContext(rng=random.Random(1)))
    precise = any(isinstance(p, KVEventConsumer) for p in scheduler.profile.plugins)
    fetch = getter(HttpxUpstream(httpx.MockTransport(_replica_page)))
    pool = EndpointPool(config.endpoints, config.pool, fetch, clock=lambda: 0.0)  # never stale
    await pool.refresh()  # health, models and one scrape of each endpoint, as at start-up
    rng = random.Random(7)
    documents = [_document(rng, doc_tokens) for _ in range(docs)]
    snapshots = pool.snapshots()
    for d, doc in enumerate(documents):
        endpoint = snapshots[d % endpoints]
        if precise:
            for consumer in scheduler.profile.plugins:
                if isinstance(consumer, KVEventConsumer):
                    consumer.on_kv_stream_live(endpoint.name)
                    n = len(doc) // BLOCK
                    event = BlockStored(
                        tuple(range(d * 10_000, d * 10_000 + n)), None, tuple(doc[: n * BLOCK]), BLOCK
                    )
                    consumer.on_kv_events(endpoint.name, EventBatch(0.0, (event,), 0))
        else:
            scheduler.on_dispatch(_request(-d, doc, False), endpoint)
    if precise:
        for consumer in scheduler.profile.plugins:
            if isinstance(consumer, KVEventConsumer):
                for snap in snapshots:
                    consumer.on_kv_stream_live(snap.name)

    # schedule alone: warm requests (a cached document plus a new question)
    timings: list[float] = []
    for i in range(requests):
        doc = documents[i % docs] + _document(rng, 40)
        request = _request(i, doc, precise)
        snaps = pool.snapshots()
        started = time.perf_counter()
        scheduler.schedule(request, snaps)
        timings.append(time.perf_counter() - started)

    # the admission path, warm (bypass) and cold (new documents, through the window)
    results: dict[str, float] = {}
    async with Admission(config.admission, scheduler, pool.snapshots) as admission:
        for kind in ("warm", "cold"):
            prepared = [  # built before the clock starts: only the router's work is timed
                _request(
                    10**6 + i,
                    documents[i % docs] + _document(rng, 40)
                    if kind == "warm"
                    else _document(rng, doc_tokens),
                    precise,
                )
                for i in range(requests)
            ]
            cpu = time.process_time()
            wall = time.perf_counter()
            for request in prepared:
                admitted = await admission.admit(request)
                scheduler.on_dispatch(request, admitted.decision.endpoint)
            results[f"admission_{kind}_cpu_us"] = (time.process_time() - cpu) / requests * 1e6
            results[f"admission_{kind}_wall_ms"] = (time.perf_counter() - wall) / requests * 1e3
    return {
        "config": name,
        "endpoints": endpoints,
        "index": "precise" if precise else "approximate",
        "schedule_p50_us": statistics.median(timings) * 1e6,
        "schedule_p99_us": _percentile(timings, 0.99) * 1e6,
        **results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, default=64)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--docs", type=int, default=256)
    parser.add_argument("--doc-tokens", type=int, default=4000)
    parser.add_argument("--configs", default="default.yaml,precise.yaml,cost.yaml,precise-cost.yaml")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [
        asyncio.run(_bench(name, args.endpoints, args.requests, args.docs, args.doc_tokens))
        for name in args.configs.split(",")
    ]
    print("| config | index | schedule p50 / p99 (µs) | admission CPU per request, warm / cold (µs) |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['config']} | {r['index']} | {r['schedule_p50_us']:.0f} / {r['schedule_p99_us']:.0f} | "
            f"{r['admission_warm_cpu_us']:.0f} / {r['admission_cold_cpu_us']:.0f} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
