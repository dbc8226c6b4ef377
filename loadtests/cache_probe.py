"""Does the block-pool replay predict a replica's prefix-cache hits? Document-QA prompts, one at a time.

    python loadtests/cache_probe.py [--backend sim|vllm] [--requests 400] [--kv-blocks 161] [--seed 5]
        [--documents 32] [--doc-tokens 2200-3000] [--max-tokens 16] [--replica-cpu-quota CORES]
        [--json PATH]

Sends the first ``--requests`` prompts of a document-QA sequence (``loadtests/docqa.py``'s for the same
seed and documents) to one replica with ``--kv-blocks`` KV blocks, one at a time, each after the previous
one ended, and reads each one's cached tokens from its usage. Then replays the same prompts through
``burstsched/workloads/lru_replay.py`` (the simulator's copy of vLLM's block pool) and prints both hit
rates, how many requests got exactly the replay's cached tokens, and the first few that did not.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import math
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import anyio
import httpx

from burstsched.workloads.docqa import DocQASpec, build_corpus, build_sequence, remeasure_corpus
from burstsched.workloads.lru_replay import Placed, replay_hits
from burstsched.workloads.stream_client import chat_body, stream_chat
from loadtests.replica_pool import (
    VLLM_BLOCK_SIZE,
    add_pool_arguments,
    open_pool,
    sizing_replica,
    tokenizer_of,
)

SHOWN_MISMATCHES = 5


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_pool_arguments(parser)
    parser.set_defaults(block_size=VLLM_BLOCK_SIZE, kv_blocks=161, time_scale=0.02)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--documents", type=int, default=32)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--doc-tokens", default="2200-3000", help="document length range, tokens")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write every request's counts here")
    args = parser.parse_args(argv)
    low, _, high = args.doc_tokens.partition("-")
    try:
        args.doc_tokens_min, args.doc_tokens_max = int(low), int(high or low)
    except ValueError:
        parser.error(f"--doc-tokens takes MIN-MAX, got {args.doc_tokens!r}")
    if args.requests < 1 or args.kv_blocks < 2:
        parser.error("--requests must be >= 1 and --kv-blocks >= 2")
    args.replicas = 1
    return args


async def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[int], int]:
    """Each request's document and counts, the corpus' shared tokens per document, and the block size."""
    spec = DocQASpec(
        documents=args.documents,
        zipf_exponent=args.zipf,
        doc_tokens_min=args.doc_tokens_min,
        doc_tokens_max=args.doc_tokens_max,
        max_tokens=args.max_tokens,
        rate=1.0,
        duration_s=math.inf,
        max_requests=args.requests,
        seed=args.seed,
    )
    block = VLLM_BLOCK_SIZE if args.backend == "vllm" else args.block_size
    max_model_len = 1024 * math.ceil((spec.doc_tokens_max + 256 + spec.max_tokens) / 1024)
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), trust_env=False) as client:
        async with sizing_replica(args.backend) as sizer:
            tokenize = tokenizer_of(client, sizer.endpoints[0][1], sizer.model)
            corpus = await build_corpus(spec, tokenize, random.Random(f"docqa-lengths:{args.seed}"))
        async with open_pool(args, args.kv_blocks, max_model_len) as pool:
            url = pool.endpoints[0][1]
            corpus = await remeasure_corpus(corpus, tokenizer_of(client, url, pool.model))
            for request in build_sequence(replace(spec, rate=1e9), random.Random(args.seed)):
                body = chat_body(pool.model, corpus.prompt(request), args.max_tokens)
                result = await stream_chat(client, url, body, f"cache-probe-{request.index}")
                usage = result.usage or {}
                if result.status != 200 or not usage:
                    raise RuntimeError(f"request {request.index}: status {result.status}, {result.error}")
                details = usage.get("prompt_tokens_details") or {}
                rows.append(
                    {
                        "index": request.index,
                        "document": request.document,
                        "prompt_tokens": int(usage["prompt_tokens"]),
                        "completion_tokens": int(usage.get("completion_tokens") or 0),
                        "cached_tokens": int(details.get("cached_tokens") or 0),
                    }
                )
    return rows, list(corpus.shared_tokens), block


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows, shared_tokens, block = anyio.run(measure, args)
    placed = [Placed(r["document"], r["prompt_tokens"], "replica", r["completion_tokens"]) for r in rows]
    shared = {d: tokens // block for d, tokens in enumerate(shared_tokens)}
    replayed = replay_hits(placed, shared, block_size=block, capacity_blocks=args.kv_blocks - 1)
    prompts = sum(r["prompt_tokens"] for r in rows)
    measured = [r["cached_tokens"] for r in rows]
    same = sum(m == p for m, p in zip(measured, replayed, strict=True))
    print(f"{args.backend}, {len(rows)} requests one at a time, {args.kv_blocks} KV blocks of {block} tokens")
    print(f"hit rate: measured {sum(measured) / prompts:.2%}, replayed {sum(replayed) / prompts:.2%}")
    print(f"requests with exactly the replay's cached tokens: {same}/{len(rows)}")
    differ = [(r, p) for r, p in zip(rows, replayed, strict=True) if r["cached_tokens"] != p]
    for r, p in differ[:SHOWN_MISMATCHES]:
        print(
            f"  request {r['index']}: document {r['document']}, {r['prompt_tokens']} prompt tokens, "
            f"cached {r['cached_tokens']} measured, {p} replayed"
        )
    if args.json is not None:
        for r, p in zip(rows, replayed, strict=True):
            r["replayed_cached_tokens"] = p
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "requests": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
