"""What a warm request costs a real vLLM replica over a long cached prefix.

A request whose prefix is cached computes only its new tokens, but each of them attends over the whole
context before it, so its cost grows with the cached prefix as well. This starts one real replica and,
for each cached prefix length and new-token count, warms a prefix with one request, then sends a burst
of requests at once that share it (each with its own new text) and times each one's first token. It then
fits, by least squares over every request of every burst (the k-th first token of a burst waits for k
requests' prefills):

    tokens only:       ttft_k ≈ base + k · per_token · new
    with the context:  ttft_k ≈ base + k · (per_token · new + per_pair · new · (cached + new / 2))

and prints both fits' median and 90th-percentile relative errors.

    python loadtests/context_cost.py [--prefix-words 500,1300] [--new-words 30,250] [--bursts 1,2,4,8]
        [--repeats 3] [--cpu-quota 0.85] [--json out.json]

A word of the prompts is about 5 of the tiny model's tokens (the table shows the replica's own counts): keep
prefix and new words together under the replica's context (8192 tokens by default) over 5.
Needs the real-vLLM environment (``make real-vllm``); bounded: every request has a timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import httpx
import numpy as np

from burstsched.testing.vllm_env import venv_ready
from burstsched.testing.vllm_replica import VllmConfig, VllmPool
from burstsched.workloads.report_page import aligned_table

HTTP_TIMEOUT_S = 120.0
VOCABULARY = tuple(f"w{i}" for i in range(5000))


@dataclass(frozen=True, slots=True)
class Burst:
    """``size`` requests sent at once over one cached prefix: their prompt and cached tokens (the
    replica's counts) and their times to first token, sorted."""

    prefix_words: int
    new_words: int
    size: int
    prompt_tokens: int
    cached_tokens: int
    ttfts_s: tuple[float, ...]

    @property
    def new_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True, slots=True)
class Fit:
    """Least-squares coefficients (seconds) and relative errors of one model over every request."""

    coefficients: dict[str, float]
    error_p50: float
    error_p90: float


def fit(bursts: Sequence[Burst], *, with_context: bool) -> Fit:
    """Fit the tokens-only model or the one with the context term over every request of ``bursts``."""
    rows: list[list[float]] = []
    seconds: list[float] = []
    for burst in bursts:
        new, cached = burst.new_tokens, burst.cached_tokens
        for k, ttft in enumerate(burst.ttfts_s, start=1):
            row = [1.0, k * new / 1e3]
            if with_context:
                row.append(k * new * (cached + new / 2) / 1e6)
            rows.append(row)
            seconds.append(ttft)
    x, y = np.array(rows), np.array(seconds)
    theta = np.linalg.lstsq(x, y, rcond=None)[0]
    errors = np.abs(x @ theta - y) / y
    names = ["base_s", "per_token_s", "per_pair_s"]
    scales = [1.0, 1e-3, 1e-6]
    coefficients = {names[i]: float(theta[i]) * scales[i] for i in range(len(theta))}
    return Fit(coefficients, float(np.median(errors)), float(np.quantile(errors, 0.9)))


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(words))


async def _first_token(
    client: httpx.AsyncClient, url: str, model: str, prompt: str
) -> tuple[float, dict[str, int]]:
    """One streamed completion of one token: seconds to its first chunk with a choice, and its usage."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.monotonic()
    ttft: float | None = None
    usage: dict[str, int] = {}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and ttft is None:
                ttft = time.monotonic() - started
            if chunk.get("usage"):
                details = chunk["usage"].get("prompt_tokens_details") or {}
                usage = {
                    "prompt": chunk["usage"]["prompt_tokens"],
                    "cached": details.get("cached_tokens") or 0,
                }
    if ttft is None or not usage:
        raise RuntimeError("a stream ended without a choice or usage")
    return ttft, usage


async def measure(url: str, model: str, args: argparse.Namespace) -> list[Burst]:
    rng = random.Random(args.seed)
    bursts: list[Burst] = []
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
        for _ in range(3):  # the first requests of a fresh replica are slow
            await _first_token(client, url, model, _text(rng, 100))
        for prefix_words in args.prefix_words:
            for new_words in args.new_words:
                for size in args.bursts:
                    for _ in range(args.repeats):
                        prefix = _text(rng, prefix_words)
                        await _first_token(client, url, model, prefix)  # cached from now on
                        results = await asyncio.gather(
                            *(
                                _first_token(client, url, model, f"{prefix} {_text(rng, new_words)}")
                                for _ in range(size)
                            )
                        )
                        usage = results[0][1]
                        burst = Burst(
                            prefix_words,
                            new_words,
                            size,
                            usage["prompt"],
                            usage["cached"],
                            tuple(sorted(ttft for ttft, _ in results)),
                        )
                        bursts.append(burst)
                        print(
                            f"prefix {prefix_words} words, new {new_words}, burst {size}: "
                            f"{burst.cached_tokens}/{burst.prompt_tokens} tokens cached, first token "
                            + " ".join(f"{t * 1000:.0f}" for t in burst.ttfts_s)
                            + " ms",
                            flush=True,
                        )
    return bursts


def report(bursts: Sequence[Burst]) -> str:
    rows = [["cached / prompt tokens", "burst", "first token: first / median / last ms"]]
    for burst in bursts:
        t = burst.ttfts_s
        rows.append(
            [
                f"{burst.cached_tokens} / {burst.prompt_tokens}",
                str(burst.size),
                f"{t[0] * 1000:.0f} / {t[len(t) // 2] * 1000:.0f} / {t[-1] * 1000:.0f}",
            ]
        )
    lines = [aligned_table(rows[0], rows[1:]), ""]
    for name, with_context in (("tokens only", False), ("with the context", True)):
        result = fit(bursts, with_context=with_context)
        coefficients = ", ".join(f"{k} {v:.3g}" for k, v in result.coefficients.items())
        lines.append(
            f"{name}: {coefficients}; relative error p50 {result.error_p50:.2f}, p90 {result.error_p90:.2f}"
        )
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--prefix-words", type=_ints, default=[500, 1300])
    parser.add_argument("--new-words", type=_ints, default=[30, 250])
    parser.add_argument("--bursts", type=_ints, default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-quota", type=float, default=None, metavar="CORES")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> int:
    if not venv_ready():
        print("the real-vLLM environment is missing: run `make real-vllm`", file=sys.stderr)
        return 2
    async with VllmPool(1, VllmConfig(cpu_quota_cores=args.cpu_quota)) as pool:
        bursts = await measure(pool.urls[0], pool.model, args)
    print(report(bursts))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(b) for b in bursts], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
