"""Is splitting a burst over replicas worth it? Three paired measurements on a pool of two replicas.

    python loadtests/burst_split.py [--backend sim|vllm] [--trials 10] [--burst 8] [--system-words 1500]
        [--replica-cpu-quota 0.85] [--config config/cost.yaml] [--out loadtests/reports/burst-split/NAME]

Each trial uses a system prompt no earlier trial used (random words), so no trial finds another's blocks
cached; the two modes of a pair alternate A B B A ..., so drift on the machine falls on both alike.

1. **Warm burst, one replica or split.** The system prompt is first sent to both replicas (one output token
   each), then ``--burst`` users send it at the same moment with their own short question (16 output tokens,
   streamed): all to one replica, or split evenly over both. This is the burst that prewarming prepares
   (README, "Prefix prewarming"): does the second warm replica shorten it?
2. **Cold prefill, alone or beside another.** One new prompt to one replica while the other is idle, or one
   new prompt to each at the same moment: how much two replicas on one machine slow each other down.
3. **Cold burst, straight or through burstsched.** A burst on a new system prompt, all of it sent straight
   to one replica, or through ``burstsched serve --config`` (which groups it onto one replica): what the
   router's admission window and proxying add to a burst's time to first token.

Per mode: TTFT p50 and p95 over all requests (client side, to the first chunk carrying a choice), the mean
over trials of the burst's slowest TTFT, and the prompt and cached tokens the replicas reported. A table on
stdout; with ``--out PREFIX``, ``PREFIX.md`` and ``PREFIX.json`` (every request). Bounded: every request has
a timeout and the run has a fixed number of trials.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from burstsched.workloads.report_page import num, report_page
from burstsched.workloads.report_page import table as render
from burstsched.workloads.router_process import router_process
from burstsched.workloads.stats import percentile
from burstsched.workloads.stream_client import StreamResult, stream_chat
from burstsched.workloads.tenants_run import chat_request
from loadtests.replica_pool import add_pool_arguments, open_pool

SYLLABLES = [
    a + b for a in ("ka", "lo", "mi", "nu", "pe", "ro", "su", "ti") for b in ("an", "el", "is", "or", "um")
]
QUESTION_WORDS = 30
OUTPUT_TOKENS = 16
KV_BLOCKS = 537
"""Per replica, as the multi-tenant runs size them (1.00x their working set over two replicas)."""
MAX_MODEL_LEN = 8192


@dataclass(frozen=True, slots=True)
class Sample:
    """One request of one trial."""

    phase: str
    mode: str
    trial: int
    replica: str
    ttft_ms: float
    e2e_ms: float
    prompt_tokens: int | None
    cached_tokens: int | None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_pool_arguments(parser)
    parser.set_defaults(time_scale=1.0)
    parser.add_argument("--trials", type=int, default=10, help="trials per mode")
    parser.add_argument("--burst", type=int, default=8, help="requests in a burst (even)")
    parser.add_argument("--system-words", type=int, default=1500, help="words in a system prompt")
    parser.add_argument("--config", type=Path, default=Path("config") / "cost.yaml", help="for phase 3")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--request-timeout", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=None, help="write PREFIX.md and PREFIX.json")
    args = parser.parse_args(argv)
    if args.replicas != 2:
        parser.error("--replicas must be 2")
    if args.burst < 2 or args.burst % 2:
        parser.error("--burst must be even and at least 2")
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    return args


def system_and(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def prompt_of(result: StreamResult) -> int | None:
    value = (result.usage or {}).get("prompt_tokens")
    return int(value) if value is not None else None


def alternating(first: str, second: str, pairs: int) -> list[str]:
    """``first second second first first second ...``: each mode leads and follows equally often."""
    return [(first, second)[(t // 2 + t) % 2] for t in range(2 * pairs)]


class Trials:
    """The run's state: the client, the pool's URLs and the samples so far."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        endpoints: Sequence[tuple[str, str]],
        model: str,
        rng: random.Random,
        system_words: int,
    ) -> None:
        self.client, self.model, self.rng, self.system_words = client, model, rng, system_words
        self.names = [name for name, _ in endpoints]
        self.urls = [url for _, url in endpoints]
        self.samples: list[Sample] = []
        self._next_id = 0

    def words(self, count: int) -> str:
        return " ".join(self.rng.choice(SYLLABLES) for _ in range(count))

    async def send(self, url: str, system: str, user: str, max_tokens: int) -> StreamResult:
        self._next_id += 1
        request = chat_request(self.model, system_and(system, user), max_tokens)
        result = await stream_chat(self.client, url, request, f"split-{self._next_id}")
        if result.status != 200 or result.ttft_s is None:
            raise RuntimeError(f"request to {url} failed: {result.status} {result.error}")
        return result

    def record(self, phase: str, mode: str, trial: int, results: Sequence[tuple[str, StreamResult]]) -> None:
        for replica, result in results:
            assert result.ttft_s is not None
            self.samples.append(
                Sample(
                    phase,
                    mode,
                    trial,
                    replica,
                    result.ttft_s * 1000,
                    result.e2e_s * 1000,
                    prompt_of(result),
                    result.cached_tokens,
                )
            )

    async def burst(
        self, targets: Sequence[tuple[str, str]], system: str, tag: str
    ) -> list[tuple[str, StreamResult]]:
        questions = [f"{self.words(QUESTION_WORDS)} {tag}-{i}" for i in range(len(targets))]
        results = await asyncio.gather(
            *(
                self.send(url, system, q, OUTPUT_TOKENS)
                for (_, url), q in zip(targets, questions, strict=True)
            )
        )
        return [(result.endpoint or name, result) for (name, _), result in zip(targets, results, strict=True)]

    async def warm_bursts(self, pairs: int, size: int) -> None:
        for trial, mode in enumerate(alternating("one replica", "split", pairs)):
            system = self.words(self.system_words)
            for url in self.urls:
                await self.send(url, system, "warm up", 1)
            await asyncio.sleep(0.5)
            home = trial % 2
            order = [home] * size if mode == "one replica" else [home, 1 - home] * (size // 2)
            results = await self.burst([(self.names[i], self.urls[i]) for i in order], system, f"w{trial}")
            self.record("warm burst", mode, trial, results)
            await asyncio.sleep(1.0)

    async def cold_prefills(self, pairs: int) -> None:
        for trial, mode in enumerate(alternating("alone", "beside another", pairs)):
            picks = [trial % 2] if mode == "alone" else [0, 1]
            systems = [self.words(self.system_words) for _ in picks]
            results = await asyncio.gather(
                *(self.send(self.urls[i], s, "go", 1) for i, s in zip(picks, systems, strict=True))
            )
            self.record(
                "cold prefill", mode, trial, [(self.names[i], r) for i, r in zip(picks, results, strict=True)]
            )
            await asyncio.sleep(0.5)

    async def cold_bursts(self, pairs: int, size: int, router: str) -> None:
        for trial, mode in enumerate(alternating("straight", "through burstsched", pairs)):
            system = self.words(self.system_words)
            if mode == "straight":
                targets = [(self.names[trial % 2], self.urls[trial % 2])] * size
            else:
                targets = [("router", router)] * size
            self.record("cold burst", mode, trial, await self.burst(targets, system, f"c{trial}"))
            await asyncio.sleep(1.0)


def summary_rows(samples: Sequence[Sample]) -> list[list[str]]:
    rows = []
    keys = list(dict.fromkeys((s.phase, s.mode) for s in samples))
    for phase, mode in keys:
        mine = [s for s in samples if (s.phase, s.mode) == (phase, mode)]
        ttfts = [s.ttft_ms for s in mine]
        trials = sorted({s.trial for s in mine})
        slowest = [max(s.ttft_ms for s in mine if s.trial == t) for t in trials]
        prompts = [s.prompt_tokens for s in mine if s.prompt_tokens is not None]
        cached = [s.cached_tokens for s in mine if s.cached_tokens is not None]
        replicas = sorted({s.replica for s in mine})
        rows.append(
            [
                phase,
                mode,
                str(len(trials)),
                str(len(mine)),
                f"{num(percentile(ttfts, 50))} / {num(percentile(ttfts, 95))}",
                num(statistics.mean(slowest)),
                num(statistics.mean(prompts)) if prompts else "-",
                num(statistics.mean(cached)) if cached else "-",
                "/".join(replicas),
            ]
        )
    return rows


HEADER = [
    "phase",
    "mode",
    "trials",
    "requests",
    "TTFT p50 / p95 ms",
    "slowest per trial, mean ms",
    "prompt tokens",
    "cached tokens",
    "replicas",
]


async def run(args: argparse.Namespace) -> tuple[list[Sample], dict[str, Any]]:
    rng = random.Random(args.seed)
    timeout = httpx.Timeout(args.request_timeout, connect=10.0)
    limits = httpx.Limits(keepalive_expiry=1.0)  # below vLLM's 5 s keep-alive: no reuse of a closing socket
    async with (
        open_pool(args, KV_BLOCKS, MAX_MODEL_LEN) as pool,
        httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client,
    ):
        trials = Trials(client, pool.endpoints, pool.model, rng, args.system_words)
        print("warm bursts…", file=sys.stderr)
        await trials.warm_bursts(args.trials, args.burst)
        print("cold prefills…", file=sys.stderr)
        await trials.cold_prefills(args.trials)
        print("cold bursts…", file=sys.stderr)
        async with router_process(args.config, pool.endpoints, extra_args=pool.router_args) as router:
            await asyncio.sleep(3.0)  # a scrape of each replica, so the router prices them alike
            await trials.cold_bursts(args.trials, args.burst, router)
        setup = {
            "backend": args.backend,
            "replicas": "2"
            + (
                f", each capped at {args.replica_cpu_quota:g} CPU"
                if args.replica_cpu_quota and args.backend == "vllm"
                else ""
            ),
            "KV cache per replica": f"{KV_BLOCKS} blocks",
            "system prompt": f"{args.system_words} random words, new in every trial",
            "burst": f"{args.burst} requests, each the system prompt and {QUESTION_WORDS} words of its own, "
            f"{OUTPUT_TOKENS} output tokens (ignore_eos), streamed with usage",
            "trials": f"{args.trials} per mode, the two modes of a phase alternating A B B A",
            "router (phase 3)": str(args.config),
            "seed": str(args.seed),
        }
        if args.backend == "sim":
            setup["time scale"] = f"{args.time_scale:g}"
        return trials.samples, setup


NOTES = (
    "TTFT: client side, sending to the first chunk carrying a choice; slowest per trial: the mean over "
    "trials of the slowest request's TTFT (a burst's last first token); prompt and cached tokens: the "
    "replicas' usage, means over the mode's requests; replicas: where the requests were served "
    "(burstsched's `x-burstsched-endpoint` header through the router)."
)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    samples, setup = asyncio.run(run(args))
    setup["wall time"] = f"{time.monotonic() - started:.0f} s"
    rows = summary_rows(samples)
    print(render(HEADER, rows, markdown=False))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command = "python loadtests/burst_split.py " + " ".join(sys.argv[1:] if argv is None else argv)
        page = report_page(
            f"Burst split: {args.backend}, 2 replicas",
            command,
            setup,
            render(HEADER, rows, markdown=True),
            NOTES,
            {},
            [],
        )
        md, data = Path(f"{args.out}.md"), Path(f"{args.out}.json")
        md.write_text(page)
        payload = {"command": command, "setup": setup, "samples": [asdict(s) for s in samples]}
        data.write_text(json.dumps(payload, indent=1))
        print(f"wrote {md} and {data}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
