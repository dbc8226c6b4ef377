"""Index truth: what the router predicted a replica's prefix cache holds vs what the replica then found.

Document-QA traffic (Zipf-popular documents, each request a document plus a new question) runs through the
router at concurrency 1 on 2 replicas whose KV caches hold less than the working set, so blocks get evicted.
For every request the router's prediction for the replica it chose is held against the replica's own count,
``usage.prompt_tokens_details.cached_tokens``:

- precise index: ``x-burstsched-predicted-cached-tokens`` (whole engine blocks, as vLLM counts hits);
- approximate index: ``x-burstsched-prefix-blocks`` (matched/total of its pseudo-token blocks) as a share of
  the prompt's tokens, rounded down to engine blocks and capped at ``prompt_tokens - 1`` as vLLM caps hits.

Each config runs the same request sequence from empty caches. Reported per config: the share of requests
predicted exactly right (to the block), the mean absolute error in blocks, over- and under-predictions, and
the hit rate the replicas measured.

    python loadtests/index_truth.py --backend vllm --kv-blocks 160 --requests 200
    python loadtests/index_truth.py --backend sim
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from burstsched.config import EndpointConfig, RouterConfig, TokenizerConfig, parse_config_text
from burstsched.server.serve import running_router
from burstsched.workloads.contexts import context_text

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Replica:
    name: str
    url: str
    events: str
    replay: str | None


@dataclass(frozen=True, slots=True)
class PoolInfo:
    replicas: Sequence[Replica]
    model: str
    block_size: int
    tokenizer: TokenizerConfig


@dataclass(slots=True)
class Sample:
    document: int
    endpoint: str
    index: str
    prompt_tokens: int
    predicted: int
    actual: int


@asynccontextmanager
async def open_pool(backend: str, kv_blocks: int, sim_block_size: int) -> AsyncIterator[PoolInfo]:
    """Two replicas with KV events, a replay socket and a small KV cache."""
    if backend == "vllm":
        from burstsched.testing.tiny_model import ensure_model
        from burstsched.testing.vllm_replica import VllmConfig, VllmPool

        model = ensure_model()
        config = VllmConfig(kv_events=True, num_gpu_blocks_override=kv_blocks, prompt_tokens_details=True)
        with VllmPool(2, config) as pool:
            replicas = [
                Replica(n, r.url, r.kv_events_endpoint or "", r.kv_replay_endpoint)
                for n, r in zip(pool.names, pool.replicas, strict=True)
            ]
            yield PoolInfo(replicas, pool.model, 128, TokenizerConfig(source="local", path=str(model)))
        return
    from burstsched.sim import SimConfig, SimPool

    sim = SimConfig(
        time_scale=0.05,
        block_size=sim_block_size,
        num_gpu_blocks=kv_blocks,
        kv_events_endpoint="tcp://127.0.0.1:*",
        kv_events_replay_endpoint="tcp://127.0.0.1:*",
    )
    async with SimPool(2, sim) as pool:
        replicas = [
            Replica(n, u, e or "", r)
            for n, u, e, r in zip(
                pool.names, pool.urls, pool.kv_events_endpoints, pool.kv_events_replay_endpoints, strict=True
            )
        ]
        yield PoolInfo(replicas, sim.served_model_name, sim_block_size, TokenizerConfig(source="remote"))


def router_config(name: str, pool: PoolInfo) -> RouterConfig:
    config = parse_config_text((REPO / "config" / name).read_text())
    endpoints = [
        EndpointConfig(name=r.name, url=r.url, kv_events=r.events, kv_events_replay=r.replay)
        for r in pool.replicas
    ]
    return config.model_copy(update={"endpoints": endpoints, "tokenizer": pool.tokenizer})


def predicted_tokens(headers: httpx.Headers, prompt_tokens: int, block_size: int) -> tuple[str, int]:
    index = headers.get("x-burstsched-prefix-index", "none")
    usable = max(0, (prompt_tokens - 1) // block_size)
    if index == "precise":
        return index, int(headers["x-burstsched-predicted-cached-tokens"])
    matched, _, total = headers.get("x-burstsched-prefix-blocks", "0/0").partition("/")
    share = int(matched) / int(total) if int(total or 0) > 0 else 0.0
    return index, min(int(share * prompt_tokens) // block_size, usable) * block_size


async def reset_caches(client: httpx.AsyncClient, pool: PoolInfo) -> None:
    for replica in pool.replicas:
        deadline = time.monotonic() + 30
        while True:
            response = await client.post(f"{replica.url}/reset_prefix_cache")
            if response.status_code == 200 and response.json().get("success", True):
                # the reset's AllBlocksCleared event goes out with the replica's next engine step
                body = {"model": pool.model, "prompt": "reset", "max_tokens": 1}
                (await client.post(f"{replica.url}/v1/completions", json=body)).raise_for_status()
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{replica.name} would not reset its prefix cache")
            await asyncio.sleep(0.2)


async def run_config(
    name: str, pool: PoolInfo, documents: Sequence[str], picks: Sequence[int], max_tokens: int
) -> list[Sample]:
    samples: list[Sample] = []
    async with httpx.AsyncClient(timeout=120) as direct:
        await reset_caches(direct, pool)
    async with running_router(router_config(name, pool), rng=random.Random(1)) as router:
        async with httpx.AsyncClient(base_url=router.url, timeout=120) as client:
            for i, doc in enumerate(picks):
                body = {
                    "model": pool.model,
                    "messages": [
                        {"role": "user", "content": f"{documents[doc]}\nQuestion {i}: what changed?"}
                    ],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                }
                response = await client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                usage = response.json()["usage"]
                prompt = int(usage["prompt_tokens"])
                actual = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                index, predicted = predicted_tokens(response.headers, prompt, pool.block_size)
                endpoint = response.headers["x-burstsched-endpoint"]
                samples.append(Sample(doc, endpoint, index, prompt, predicted, actual))
                print(f"\r{name}: {i + 1}/{len(picks)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return samples


def summarize(name: str, samples: Sequence[Sample], block_size: int) -> dict[str, Any]:
    errors = [(s.predicted - s.actual) / block_size for s in samples]
    indexes = sorted({s.index for s in samples})
    prompt = sum(s.prompt_tokens for s in samples)
    return {
        "config": name,
        "index": "+".join(indexes),
        "requests": len(samples),
        "exact": sum(e == 0 for e in errors) / len(samples),
        "mae_blocks": statistics.fmean(abs(e) for e in errors),
        "over": sum(e > 0 for e in errors),
        "under": sum(e < 0 for e in errors),
        "hit_rate": sum(s.actual for s in samples) / prompt if prompt else 0.0,
        "requests_per_endpoint": {
            e: sum(s.endpoint == e for s in samples) for e in sorted({s.endpoint for s in samples})
        },
    }


async def main_async(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    documents = [context_text(f"doc-{args.seed}-{d}", args.doc_lines, d) for d in range(args.docs)]
    weights = [1.0 / (d + 1) ** args.zipf for d in range(args.docs)]
    picks = rng.choices(range(args.docs), weights=weights, k=args.requests)
    rows: list[dict[str, Any]] = []
    raw: dict[str, list[dict[str, Any]]] = {}
    async with open_pool(args.backend, args.kv_blocks, args.sim_block_size) as pool:
        for name in args.configs.split(","):
            samples = await run_config(name, pool, documents, picks, args.max_tokens)
            rows.append(summarize(name, samples, pool.block_size))
            raw[name] = [asdict(s) for s in samples]
    print(
        f"\nindex truth, {args.backend}, 2 replicas × {args.kv_blocks} KV blocks, {args.docs} documents, "
        f"{args.requests} requests at concurrency 1\n"
    )
    print("| config | index | requests | exactly right | MAE (blocks) | over / under | hit rate |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['config']} | {r['index']} | {r['requests']} | {r['exact']:.1%} | {r['mae_blocks']:.2f} | "
            f"{r['over']} / {r['under']} | {r['hit_rate']:.1%} |"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "rows": rows, "samples": raw}, indent=1
            )
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--configs", default="default.yaml,precise.yaml")
    parser.add_argument("--kv-blocks", type=int, default=None, help="KV blocks per replica")
    parser.add_argument("--sim-block-size", type=int, default=16)
    parser.add_argument("--docs", type=int, default=40)
    parser.add_argument(
        "--doc-lines", type=int, default=60, help="observations per document (~40 tokens each)"
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.kv_blocks is None:
        args.kv_blocks = 160 if args.backend == "vllm" else 1200
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
