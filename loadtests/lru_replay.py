"""Replay document-QA runs' placements through vLLM's prefix cache, and bound what a fixed split could hit.

    python loadtests/lru_replay.py REPORT.json[.gz] ... [--max-share 0.55,0.7] [--starts 4] [--seed 0]
        [--kv-blocks N] [--show-splits] [--markdown]

For every run of every report (``loadtests/docqa.py``'s JSON, whose requests name their replica): the hit
rate the replicas measured, and the one a replay of the same placements through one copy of vLLM's block
pool per replica gives (``burstsched/workloads/lru_replay.py``: LRU eviction, last blocks first, requests
one at a time), and each replica's share of the prompt tokens the replay computed. Where the two hit rates
agree, the replay explains the run's hits by its placements.

Then, per report and rate (every target got the same sequence): the replayed hit rate of the balanced
split of documents (each document on one replica, the load even) and the best split local search found
knowing the whole sequence, with no replica over each ``--max-share`` of the requests. A router that
cannot see the future does not reach that split; the gap to it is what placement alone could still win
with these caches. ``--show-splits`` lists, for each best split, which documents each replica kept (by
their popularity rank in the sequence, 1 the most asked), their blocks against the cache's, and each
replica's share of the prompt tokens computed (the prefill work).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from burstsched.workloads.lru_replay import (
    Partition,
    Placed,
    balanced_owner,
    best_partition,
    computed_by_replica,
    partition,
    replay_hits,
    shared_blocks_of,
)
from burstsched.workloads.report_page import num, pct
from burstsched.workloads.report_page import table as render
from loadtests.ttft_predictions import load, report_name

CAPACITY = re.compile(r"(\d+) blocks of (\d+) tokens")


def capacity_of(report: Mapping[str, Any]) -> tuple[int, int]:
    """(KV blocks per replica, tokens per block) from the report's set-up line: vLLM's
    ``num_gpu_blocks``, one of which is its null block."""
    found = CAPACITY.search(str(report.get("setup", {}).get("KV cache per replica", "")))
    if found is None:
        raise ValueError("the report does not say its KV cache per replica; give --kv-blocks")
    return int(found.group(1)), int(found.group(2))


def served(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The run's completed requests that name their replica and prompt, in arrival order."""
    out = [
        r
        for r in run["requests"]
        if r.get("status") == 200 and r.get("replica") and r.get("prompt_tokens") is not None
    ]
    return sorted(out, key=lambda r: (r["arrival_s"], r["index"]))


def computed_shares(placed: Sequence[Placed], hits: Sequence[int], replicas: Sequence[str]) -> str:
    """Each replica's share of the prompt tokens the replay computed, in ``replicas`` order."""
    computed = computed_by_replica(placed, hits)
    total = sum(computed.values()) or 1
    return " / ".join(f"{computed.get(r, 0) / total:.0%}" for r in replicas)


def split_lines(
    source: str,
    rate: float,
    share: float,
    best: Partition,
    documents: Sequence[int],
    shared: Mapping[int, int],
    capacity: int,
) -> list[tuple[str, ...]]:
    """One row per replica of a split: its requests, the tokens it computed, its documents' blocks, and
    their popularity ranks."""
    rank = {d: i + 1 for i, (d, _) in enumerate(Counter(documents).most_common())}
    rows: list[tuple[str, ...]] = []
    for replica in sorted(best.requests):
        kept = sorted((d for d, r in best.owner.items() if r == replica), key=lambda d: rank[d])
        rows.append(
            (
                source,
                num(rate, 2),
                f"≤{share:g}",
                replica,
                str(best.requests[replica]),
                pct(best.computed.get(replica, 0) / max(1, sum(best.computed.values()))),
                f"{sum(shared.get(d, 0) for d in kept)} / {capacity}",
                " ".join(str(rank[d]) for d in kept),
            )
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("reports", type=Path, nargs="+", help="document-QA reports' JSON (.json or .json.gz)")
    parser.add_argument("--max-share", default="0.55,0.7", help="caps on a replica's share of the requests")
    parser.add_argument("--starts", type=int, default=4, help="local-search starts per cap")
    parser.add_argument("--seed", type=int, default=0, help="the search's random starts")
    parser.add_argument(
        "--kv-blocks",
        type=int,
        default=None,
        help="the replicas' num_gpu_blocks, one being vLLM's null block (default: the report's)",
    )
    parser.add_argument("--show-splits", action="store_true", help="each best split's documents per replica")
    parser.add_argument("--markdown", action="store_true", help="markdown tables instead of text")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.reports if not path.is_file()]
    if missing:
        parser.error(f"no such report: {', '.join(missing)}")
    try:
        shares = [float(x) for x in args.max_share.split(",")]
    except ValueError:
        parser.error(f"--max-share takes comma-separated numbers, got {args.max_share!r}")
    if not all(0 < s <= 1 for s in shares):
        parser.error("--max-share: each cap must be in (0, 1]")
    replayed_rows: list[tuple[str, ...]] = []
    bound_rows: list[tuple[str, ...]] = []
    split_rows: list[tuple[str, ...]] = []
    for path in args.reports:
        report = load(path)
        kv_blocks, block = capacity_of(report)
        capacity = (args.kv_blocks or kv_blocks) - 1  # usable: vLLM keeps one null block
        runs = [(run, served(run)) for run in report.get("runs", [])]
        requests = [r for _, done in runs for r in done]
        shared = shared_blocks_of(
            ((r["document"], r["prompt_tokens"], r.get("cached_tokens") or 0) for r in requests), block
        )
        by_rate: dict[float, list[dict[str, Any]]] = {}
        replicas = sorted({r["replica"] for r in requests})
        for run, done in runs:
            if not done:
                continue
            summary = run["summary"]
            placed = [
                Placed(r["document"], r["prompt_tokens"], r["replica"], r.get("completion_tokens") or 0)
                for r in done
            ]
            hits = replay_hits(placed, shared, block_size=block, capacity_blocks=capacity)
            prompts = sum(p.prompt_tokens for p in placed)
            measured = sum(r.get("cached_tokens") or 0 for r in done) / prompts
            replayed_rows.append(
                (
                    report_name(path),
                    num(run["rate"], 2),
                    str(summary["target"]),
                    str(summary.get("repeat", 1)),
                    str(len(done)),
                    pct(measured),
                    pct(sum(hits) / prompts),
                    computed_shares(placed, hits, replicas),
                )
            )
            longest = by_rate.get(run["rate"])
            if longest is None or len(done) > len(longest):
                by_rate[run["rate"]] = done
        name = report_name(path)
        for rate, done in sorted(by_rate.items()):
            documents = [r["document"] for r in done]
            prompts_of = [r["prompt_tokens"] for r in done]
            outputs = [r.get("completion_tokens") or 0 for r in done]
            even = partition(
                balanced_owner(documents, replicas),
                documents,
                prompts_of,
                shared,
                block_size=block,
                capacity_blocks=capacity,
                output_tokens=outputs,
            )
            row = [name, num(rate, 2), str(len(done)), pct(even.hit_rate)]
            for share in shares:
                best = best_partition(
                    documents,
                    prompts_of,
                    shared,
                    replicas=replicas,
                    block_size=block,
                    capacity_blocks=capacity,
                    max_share=share,
                    rng=random.Random(args.seed),
                    starts=args.starts,
                    output_tokens=outputs,
                )
                row.append(
                    "none" if best is None else f"{pct(best.hit_rate)} ({best.largest_share:.0%} on one)"
                )
                if best is not None:
                    split_rows += split_lines(name, rate, share, best, documents, shared, capacity)
            bound_rows.append(tuple(row))
    columns = ["report", "rate r/s", "target", "pass", "requests", "measured hit", "replayed hit"]
    print(
        render(
            columns + ["computed per replica"],
            replayed_rows,
            markdown=args.markdown,
        )
    )
    print()
    columns = ["report", "rate r/s", "requests", "balanced split"]
    columns += [f"best split found, ≤{share:g} on one" for share in shares]
    print(render(columns, bound_rows, markdown=args.markdown))
    if args.show_splits:
        print()
        columns = ["report", "rate r/s", "cap", "replica", "requests", "computed tokens", "blocks / cache"]
        columns.append("documents by rank")
        print(render(columns, split_rows, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
