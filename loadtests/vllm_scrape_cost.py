"""What a router's ``/metrics`` scrapes cost a real vLLM replica.

vLLM renders its whole Prometheus page on the API server's event loop for every GET. This starts one real
replica (one core) and measures, with polling off and on in turns:
- the page's size and one GET's latency, whole and asking for only the families a router reads
  (``?name[]=...``, which Prometheus' own exposition honours);
- the replica's CPU (API server and engine, ``/proc``) while idle;
- the time to first token of cold and warm requests (one document each, sent one at a time), polling off
  for even-numbered documents and on for odd-numbered ones, so drift hits both alike.

    python loadtests/vllm_scrape_cost.py [--interval-ms 50] [--documents 40] [--json out.json]

Needs the real-vLLM environment (``make real-vllm``); bounded: every request and poll has a timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import random
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import httpx

from burstsched.testing.vllm_env import venv_ready
from burstsched.testing.vllm_replica import VllmConfig, VllmPool
from burstsched.workloads.proc_cpu import group_cpu_seconds

HTTP_TIMEOUT_S = 30.0
ROUTER_FAMILIES = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:prompt_tokens",
)
LETTERS = "abcdefghij"


@dataclass(frozen=True, slots=True)
class ScrapeCost:
    """One run's figures; TTFTs in ms, CPU in percent of one core."""

    interval_ms: float
    page_bytes: int
    get_ms_p50: float
    filtered_page_bytes: int
    filtered_get_ms_p50: float
    idle_cpu_off: list[float]
    idle_cpu_on: list[float]
    ttft_ms: dict[str, list[float]]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval-ms", type=float, default=50.0, help="polling period when on")
    parser.add_argument("--documents", type=int, default=40, help="one cold, one warm request each")
    parser.add_argument("--words", type=int, default=1300, help="words per document (~2.2 tokens each)")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds per idle CPU reading")
    parser.add_argument("--kv-blocks", type=int, default=164)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return parser.parse_args(argv)


class Poller:
    """A thread that GETs ``url`` every ``interval_s`` while switched on."""

    def __init__(self, url: str, interval_s: float) -> None:
        self._url = url
        self._interval = interval_s
        self.on = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-poller", daemon=True)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(HTTP_TIMEOUT_S)

    def _run(self) -> None:
        with httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
            while not self._stop.is_set():
                if self.on.is_set():
                    client.get(self._url)
                self._stop.wait(self._interval)

    def switch(self, on: bool) -> None:
        if on:
            self.on.set()
        else:
            self.on.clear()


def document(rng: random.Random, words: int) -> str:
    return " ".join("".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 4))) for _ in range(words))


def ttft_ms(client: httpx.Client, url: str, model: str, text: str) -> float:
    """One streamed chat request's time to its first content chunk."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8, "stream": True}
    start = time.perf_counter()
    first: float | None = None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith("data:") and '"content"' in line:
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("the stream ended without content")
    return first * 1000.0


def get_timed(client: httpx.Client, url: str, times: int = 40) -> tuple[bytes, list[float]]:
    """The page at ``url`` and the seconds each of ``times`` GETs took."""
    page = client.get(url).content
    seconds = []
    for _ in range(times):
        start = time.perf_counter()
        client.get(url)
        seconds.append(time.perf_counter() - start)
    return page, seconds


def measure(args: argparse.Namespace) -> ScrapeCost:
    rng = random.Random(args.seed)
    with VllmPool(1, VllmConfig(num_gpu_blocks_override=args.kv_blocks)) as pool:
        replica = pool.replicas[0]
        metrics_url = f"{replica.url}/metrics"
        with httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
            filtered_url = metrics_url + "?" + "&".join(f"name[]={name}" for name in ROUTER_FAMILIES)
            page, gets = get_timed(client, metrics_url)
            filtered_page, filtered_gets = get_timed(client, filtered_url)
            idle: dict[bool, list[float]] = {False: [], True: []}
            ttfts: dict[str, list[float]] = {"cold off": [], "warm off": [], "cold on": [], "warm on": []}
            with Poller(metrics_url, args.interval_ms / 1000.0) as poller:
                for on in (False, True, False, True):
                    poller.switch(on)
                    before = group_cpu_seconds([replica.pid])[replica.pid]
                    time.sleep(args.idle_s)
                    after = group_cpu_seconds([replica.pid])[replica.pid]
                    idle[on].append(100.0 * (after - before) / args.idle_s)
                for i in range(args.documents):
                    on = i % 2 == 1
                    poller.switch(on)
                    time.sleep(0.3)
                    text = document(rng, args.words)
                    state = "on" if on else "off"
                    for kind in ("cold", "warm"):
                        ttfts[f"{kind} {state}"].append(
                            ttft_ms(client, replica.url, pool.model, f"{text} question {kind}")
                        )
    return ScrapeCost(
        interval_ms=args.interval_ms,
        page_bytes=len(page),
        get_ms_p50=1000.0 * statistics.median(gets),
        filtered_page_bytes=len(filtered_page),
        filtered_get_ms_p50=1000.0 * statistics.median(filtered_gets),
        idle_cpu_off=idle[False],
        idle_cpu_on=idle[True],
        ttft_ms=ttfts,
    )


def report(cost: ScrapeCost) -> str:
    lines = [
        f"page: {cost.page_bytes} bytes; one GET: {cost.get_ms_p50:.1f} ms (p50 of 40)",
        f"asking for {len(ROUTER_FAMILIES)} families: {cost.filtered_page_bytes} bytes, "
        f"{cost.filtered_get_ms_p50:.1f} ms",
        "idle replica CPU, % of a core: "
        f"polling off {', '.join(f'{v:.1f}' for v in cost.idle_cpu_off)}; "
        f"every {cost.interval_ms:g} ms {', '.join(f'{v:.1f}' for v in cost.idle_cpu_on)}",
        "",
        "| request | polling | n | TTFT p50 ms | mean ms | max ms |",
        "|---|---|---|---|---|---|",
    ]
    for key, values in cost.ttft_ms.items():
        kind, state = key.split()
        lines.append(
            f"| {kind} | {state} | {len(values)} | {statistics.median(values):.1f} | "
            f"{statistics.mean(values):.1f} | {max(values):.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not venv_ready():
        print("the real vLLM environment is absent: run `make real-vllm` first", file=sys.stderr)
        return 2
    cost = measure(args)
    print(report(cost))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(cost), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
