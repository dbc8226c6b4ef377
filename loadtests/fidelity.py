"""Simulator fidelity: the same workload against a real vLLM replica and the simulator, compared per request.

    python loadtests/fidelity.py [--json PATH] [--pairs N] [--vllm-url URL]

Both get the tiny model's tokenizer, blocks of 128, an 80-block KV cache and vLLM's CPU scheduling limits.
Per request it prints Δprefix_cache_hits, Δprefix_cache_queries and Δprefill computed tokens for both, then
the cold/warm TTFT ratio of each. A mismatch is any per-request value differing between the two. Needs
`make real-vllm`. Exit status 0 when there are no mismatches and the simulator's ratio is within 2x of
vLLM's, else 1 (2 when the vLLM environment is absent).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import anyio

from burstsched.sim import SimPool
from burstsched.testing.backends import SERVED_MODEL_NAME, sim_config, vllm_config
from burstsched.testing.fixtures import skip_reason
from burstsched.testing.tiny_model import ensure_model
from burstsched.testing.vllm_replica import VllmPool
from burstsched.workloads.fidelity import RequestRecord, Target, format_table, report, run_workload


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--pairs", type=int, default=3, help="seed pairs (cold then warm)")
    parser.add_argument("--vllm-url", default=None, help="use this running replica (80 blocks) instead")
    return parser.parse_args()


async def run_vllm(model: Path, args: argparse.Namespace) -> list[RequestRecord]:
    if args.vllm_url:
        return await run_workload(Target(args.vllm_url, SERVED_MODEL_NAME), pairs=args.pairs)
    async with VllmPool(1, vllm_config(model, kv_events=False)) as pool:
        return await run_workload(Target(pool.urls[0], SERVED_MODEL_NAME), pairs=args.pairs)


async def run_sim(model: Path, args: argparse.Namespace) -> list[RequestRecord]:
    async with SimPool(1, sim_config(model, kv_events=False)) as pool:
        return await run_workload(Target(pool.urls[0], SERVED_MODEL_NAME), pairs=args.pairs)


def within_2x(ratio_sim: float | None, ratio_vllm: float | None) -> bool:
    return ratio_sim is not None and ratio_vllm is not None and ratio_vllm / 2 <= ratio_sim <= ratio_vllm * 2


async def main() -> int:
    args = parse_args()
    reason = skip_reason()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    model = ensure_model()
    vllm = await run_vllm(model, args)  # one after the other: neither steals the other's cores
    sim = await run_sim(model, args)
    result = report(vllm, sim)
    print(format_table(vllm, sim))
    for line in result["mismatch_details"]:
        print("mismatch:", line)
    ratio_sim, ratio_vllm = result["ttft_ratio_sim"], result["ttft_ratio_vllm"]
    print(f"mismatches: {result['mismatches']}")
    print(f"cold/warm TTFT ratio: vLLM {ratio_vllm:.1f}, simulator {ratio_sim:.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["mismatches"] == 0 and within_2x(ratio_sim, ratio_vllm) else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main))
