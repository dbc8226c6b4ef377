"""One workload run against a real vLLM replica and the simulator; per-request counter deltas compared.

Cases (each starts from a reset prefix cache): seed pairs (a ~5200-token context cold, then the same context
with another question), a burst of 4 identical ~4000-token prompts sent at once, an eviction case that
needs a small KV cache (80 blocks of 128: two 5200-token contexts do not both fit), and a partial-block
case in the same cache: a 5200-token context, ten distinct ~560-token prompts, the long context again.
What the short prompts evict of the long one depends on where vLLM puts each finished request's last,
partial block (no hash): at the free queue's head, to be reused first. Put at its tail like cached
blocks, the partial blocks would hold places in the LRU order and the fillers would evict more.

A request's deltas are Δ`vllm:prefix_cache_hits_total`, Δ`vllm:prefix_cache_queries_total` and
Δ`vllm:request_prefill_kv_computed_tokens_sum`, read from `/metrics` before and after it. Burst requests run
at once, so each is described by its usage (`prompt_tokens`, `cached_tokens`: queries, hits, computed =
prompt − cached) and the burst as a whole by its metric deltas.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

import anyio
import httpx

from burstsched.workloads.contexts import sized_context
from burstsched.workloads.replica_metrics import ReplicaCounters, read_counters
from burstsched.workloads.stream_client import StreamResult, chat_body, stream_chat

MAX_TOKENS = 32
SEED_CONTEXT_TOKENS = 5200
BURST_CONTEXT_TOKENS = 4000
BURST_SIZE = 4
FILLERS = 10
FILLER_TOKENS = 560
QUESTIONS = (
    "\nQuestion: Summarize the observations.",
    "\nQuestion: Which measurements should engineers collect next?",
)
DELTA_FIELDS = ("prompt_tokens", "hits", "queries", "computed")
SETTLE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One row of the fidelity table."""

    case: str
    label: str
    source: str  # "metrics": deltas from /metrics; "usage": from the request's usage chunk
    prompt_tokens: int
    cached_tokens: int | None
    hits: int
    queries: int
    computed: int
    ttft_s: float | None

    def key(self) -> tuple[str, str]:
        return (self.case, self.label)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a workload's requests go: a replica's base URL and its served model name."""

    url: str
    model: str


def _body(model: str, prompt: str) -> dict[str, Any]:
    body = chat_body(model, prompt, MAX_TOKENS)
    body["ignore_eos"] = True
    return body


async def _count_tokens(client: httpx.AsyncClient, target: Target, text: str) -> int:
    response = await client.post(f"{target.url}/tokenize", json={"model": target.model, "prompt": text})
    response.raise_for_status()
    return int(response.json()["count"])


async def _settled(
    client: httpx.AsyncClient, target: Target, before: ReplicaCounters, finished: int
) -> ReplicaCounters:
    """Counters once `finished` more requests are counted as finished (bounded wait)."""
    with anyio.fail_after(SETTLE_TIMEOUT_S):
        while True:
            after = await read_counters(client, target.url)
            if after.requests_finished - before.requests_finished >= finished:
                return after
            await anyio.sleep(0.05)


async def _reset(client: httpx.AsyncClient, target: Target) -> None:
    response = await client.post(f"{target.url}/reset_prefix_cache")
    response.raise_for_status()


def _check(result: StreamResult, label: str) -> StreamResult:
    if result.status != 200 or result.usage is None or result.error is not None:
        raise RuntimeError(f"{label}: status {result.status}, error {result.error}, usage {result.usage}")
    return result


async def _one(
    client: httpx.AsyncClient, target: Target, case: str, label: str, prompt: str
) -> RequestRecord:
    before = await read_counters(client, target.url)
    body = _body(target.model, prompt)
    result = _check(await stream_chat(client, target.url, body, f"{case}-{label}"), label)
    delta = await _settled(client, target, before, 1) - before
    usage = result.usage or {}
    return RequestRecord(
        case=case,
        label=label,
        source="metrics",
        prompt_tokens=int(usage["prompt_tokens"]),
        cached_tokens=result.cached_tokens,
        hits=round(delta.prefix_hits),
        queries=round(delta.prefix_queries),
        computed=round(delta.prefill_computed_tokens),
        ttft_s=result.ttft_s,
    )


async def seed_pairs(client: httpx.AsyncClient, target: Target, pairs: int) -> list[RequestRecord]:
    await _reset(client, target)
    records = []
    for i in range(pairs):
        context = await sized_context(
            f"fidelity-seed-{i}", SEED_CONTEXT_TOKENS, 0, lambda t: _count_tokens(client, target, t)
        )
        records.append(await _one(client, target, "seed", f"pair{i}-cold", context + QUESTIONS[0]))
        records.append(await _one(client, target, "seed", f"pair{i}-warm", context + QUESTIONS[1]))
    return records


async def burst(client: httpx.AsyncClient, target: Target) -> list[RequestRecord]:
    await _reset(client, target)
    context = await sized_context(
        "fidelity-burst", BURST_CONTEXT_TOKENS, 0, lambda t: _count_tokens(client, target, t)
    )
    prompt = context + QUESTIONS[0]
    before = await read_counters(client, target.url)
    results: list[StreamResult] = []

    async def send(i: int) -> None:
        body = _body(target.model, prompt)
        results.append(_check(await stream_chat(client, target.url, body, f"burst-{i}"), f"burst-{i}"))

    async with anyio.create_task_group() as tg:
        for i in range(BURST_SIZE):
            tg.start_soon(send, i)
    delta = await _settled(client, target, before, BURST_SIZE) - before
    ordered = sorted(results, key=lambda r: (r.cached_tokens or 0, r.ttft_s or 0.0))
    records = []
    for i, result in enumerate(ordered):
        usage = result.usage or {}
        prompt_tokens = int(usage["prompt_tokens"])
        cached = result.cached_tokens or 0
        records.append(
            RequestRecord(
                "burst",
                f"req{i}",
                "usage",
                prompt_tokens,
                result.cached_tokens,
                cached,
                prompt_tokens,
                prompt_tokens - cached,
                result.ttft_s,
            )
        )
    total_prompt = sum(r.prompt_tokens for r in records)
    records.append(
        RequestRecord(
            "burst",
            "all",
            "metrics",
            total_prompt,
            None,
            round(delta.prefix_hits),
            round(delta.prefix_queries),
            round(delta.prefill_computed_tokens),
            None,
        )
    )
    return records


async def eviction(client: httpx.AsyncClient, target: Target) -> list[RequestRecord]:
    """A cold, B cold (evicts part of A), A warm, B warm, in an 80-block cache."""
    await _reset(client, target)
    contexts = {}
    for name in ("A", "B"):
        contexts[name] = await sized_context(
            f"fidelity-evict-{name}", SEED_CONTEXT_TOKENS, 0, lambda t: _count_tokens(client, target, t)
        )
    records = []
    for name, question, label in (("A", 0, "cold"), ("B", 0, "cold"), ("A", 1, "warm"), ("B", 1, "warm")):
        prompt = contexts[name] + QUESTIONS[question]
        records.append(await _one(client, target, "eviction", f"{name}-{label}", prompt))
    return records


async def partial_blocks(client: httpx.AsyncClient, target: Target) -> list[RequestRecord]:
    """The long context cold, ten short distinct prompts one after another, the long context warm."""
    await _reset(client, target)

    async def count(text: str) -> int:
        return await _count_tokens(client, target, text)

    context = await sized_context("fidelity-partial-long", SEED_CONTEXT_TOKENS, 0, count)
    records = [await _one(client, target, "partial", "long-cold", context + QUESTIONS[0])]
    for i in range(FILLERS):
        filler = await sized_context(f"fidelity-partial-filler-{i}", FILLER_TOKENS, 0, count)
        records.append(await _one(client, target, "partial", f"filler{i}", filler + QUESTIONS[0]))
    records.append(await _one(client, target, "partial", "long-warm", context + QUESTIONS[1]))
    return records


async def run_workload(target: Target, *, pairs: int = 3, timeout_s: float = 300.0) -> list[RequestRecord]:
    """All four cases against one replica, after one short warm-up request."""
    with anyio.fail_after(timeout_s):
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
            await _one(client, target, "warmup", "warmup", "Warm-up: say something.")
            records = await seed_pairs(client, target, pairs)
            records += await burst(client, target)
            records += await eviction(client, target)
            records += await partial_blocks(client, target)
    return records


def ttft_ratio(records: list[RequestRecord]) -> float | None:
    """Median cold TTFT over median warm TTFT of the seed pairs."""
    cold = [r.ttft_s for r in records if r.case == "seed" and r.label.endswith("cold") and r.ttft_s]
    warm = [r.ttft_s for r in records if r.case == "seed" and r.label.endswith("warm") and r.ttft_s]
    if not cold or not warm:
        return None
    return statistics.median(cold) / statistics.median(warm)


def mismatches(vllm: list[RequestRecord], sim: list[RequestRecord]) -> list[str]:
    """Every (request, field) whose value differs between the two runs, described."""
    out = []
    sim_by_key = {r.key(): r for r in sim}
    for real in vllm:
        other = sim_by_key.get(real.key())
        if other is None:
            out.append(f"{real.case}/{real.label}: missing in the simulator's run")
            continue
        for name in DELTA_FIELDS:
            a, b = getattr(real, name), getattr(other, name)
            if a != b:
                out.append(f"{real.case}/{real.label}: {name} vllm={a} sim={b}")
    return out


def report(vllm: list[RequestRecord], sim: list[RequestRecord]) -> dict[str, Any]:
    """The JSON report: rows side by side, the mismatch count and both TTFT ratios."""
    sim_by_key = {r.key(): r for r in sim}
    rows = []
    for real in vllm:
        other = sim_by_key.get(real.key())
        rows.append(
            {
                "case": real.case,
                "label": real.label,
                "source": real.source,
                "vllm": asdict(real),
                "sim": asdict(other) if other is not None else None,
            }
        )
    problems = mismatches(vllm, sim)
    return {
        "requests": rows,
        "mismatches": len(problems),
        "mismatch_details": problems,
        "ttft_ratio_sim": ttft_ratio(sim),
        "ttft_ratio_vllm": ttft_ratio(vllm),
    }


def format_table(vllm: list[RequestRecord], sim: list[RequestRecord]) -> str:
    """The per-request table, vLLM | simulator."""
    sim_by_key = {r.key(): r for r in sim}
    head = (
        f"{'case':<9}{'request':<13}{'src':<8}{'prompt':>7} | {'Δhits':>6}{'Δqueries':>9}{'Δcomputed':>10}"
        f"{'ttft ms':>9} | {'Δhits':>6}{'Δqueries':>9}{'Δcomputed':>10}{'ttft ms':>9}  {'':4}"
    )
    lines = [f"{'':<37} | {'real vLLM':^34} | {'simulator':^34}", head, "-" * len(head)]
    for real in vllm:
        other = sim_by_key.get(real.key())
        same = other is not None and all(getattr(real, f) == getattr(other, f) for f in DELTA_FIELDS)
        lines.append(
            f"{real.case:<9}{real.label:<13}{real.source:<8}{real.prompt_tokens:>7} | {_cells(real)} | "
            f"{_cells(other)}  {'ok' if same else 'DIFF'}"
        )
    return "\n".join(lines)


def _cells(record: RequestRecord | None) -> str:
    if record is None:
        return f"{'-':>34}"
    ttft = f"{record.ttft_s * 1000:.0f}" if record.ttft_s is not None else "-"
    return f"{record.hits:>6}{record.queries:>9}{record.computed:>10}{ttft:>9}"
