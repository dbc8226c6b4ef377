"""Mixed requests through a real Envoy with ``burstsched epp``: every response byte-identical to the same
request sent to the replica directly, none lost.

    python loadtests/epp_identity.py [--requests 1000] [--concurrency 16] [--max-prompt-bytes 200000]
                                     [--cancel 0.1] [--mode full-duplex|buffered] [--json PATH]

Simulated replicas at temperature 0 (their output is a function of the prompt, whichever replica serves it).
The mix: chat and completions, streamed and not, prompts of log-uniform size up to ``--max-prompt-bytes``
(a few at the maximum), and a fraction ``--cancel`` cancelled by the client (streams after their first
chunk, whole requests after a few milliseconds). Every request carries its own ``x-request-id``, so the
response's id is the same both ways; each completed response is then sent again, with the same id, straight
to the replica that served it (``x-burstsched-endpoint``), and the two are compared byte for byte, status,
content type and body. The only field masked is ``created`` (whole seconds of the wall clock, which may
tick between the two). ``prompt_tokens_details`` is off on the replicas, as vLLM's default: its
``cached_tokens`` says what the replica's cache held, which differs on a second sending.

Lost: a request not cancelled whose response is not a complete 200 (a stream must end with ``[DONE]``).
At the end no replica may still run or queue a request (the cancellations reached them).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from burstsched.sim import SimConfig, SimPool
from burstsched.workloads.gateway import EnvoyMode, gateway_process

MODEL = "kv-demo"
_CREATED = re.compile(rb'"created": ?\d+')
MODES = {
    "full-duplex": EnvoyMode(),
    "buffered": EnvoyMode(request_body="BUFFERED", response_body="NONE"),
}


@dataclass(frozen=True, slots=True)
class Spec:
    """One request of the mix."""

    index: int
    path: str
    body: dict[str, Any]
    stream: bool
    cancel: bool
    prompt_bytes: int

    @property
    def request_id(self) -> str:
        return f"ident-{self.index}-{uuid.uuid5(uuid.NAMESPACE_URL, str(self.index)).hex[:12]}"


@dataclass(slots=True)
class Outcome:
    spec: Spec
    status: int = 0
    content_type: str = ""
    body: bytes = b""
    endpoint: str | None = None
    cancelled: bool = False
    """The client went away before the response's end."""
    error: str | None = None
    latency_s: float = 0.0

    @property
    def complete(self) -> bool:
        if self.status != 200 or self.error is not None or self.cancelled:
            return False
        return not self.spec.stream or self.body.rstrip().endswith(b"data: [DONE]")


@dataclass(slots=True)
class Report:
    requests: int = 0
    cancelled_asked: int = 0
    cancelled_cut: int = 0
    """Cancelled requests whose response was cut by the client before its end."""
    completed: int = 0
    compared: int = 0
    identical: int = 0
    lost: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    by_kind: dict[str, int] = field(default_factory=dict)
    largest_prompt_bytes: int = 0
    replicas_busy_after: dict[str, float] = field(default_factory=dict)
    served_by: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _text(rng: random.Random, n_bytes: int, tag: str) -> str:
    words, size = [f"doc-{tag}"], len(tag) + 4
    while size < n_bytes:
        words.append(f"note{rng.randrange(10**9):09d}")
        size += len(words[-1]) + 1
    return " ".join(words)[:n_bytes]


def make_specs(count: int, max_prompt_bytes: int, cancel: float, seed: int) -> list[Spec]:
    """The mix: APIs and streaming evenly, log-uniform prompt sizes from 64 B (every 50th at the maximum)."""
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        chat, stream = rng.random() < 0.5, rng.random() < 0.5
        size = (
            max_prompt_bytes
            if i % 50 == 7
            else int(math.exp(rng.uniform(math.log(64), math.log(max_prompt_bytes))))
        )
        text = _text(rng, size, f"{seed}-{i}")
        body: dict[str, Any] = {"model": MODEL, "max_tokens": rng.randint(1, 64), "temperature": 0}
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if stream:
            body["stream"] = True
        path = "/v1/chat/completions" if chat else "/v1/completions"
        specs.append(Spec(i, path, body, stream, rng.random() < cancel, len(text)))
    return specs


async def send(client: httpx.AsyncClient, base_url: str, spec: Spec, *, cancel: bool) -> Outcome:
    """One request; with ``cancel`` the client leaves after the first chunk (a stream) or a few ms."""
    outcome = Outcome(spec)
    started = time.perf_counter()
    headers = {"x-request-id": spec.request_id}
    try:
        if cancel and not spec.stream:
            with anyio.move_on_after(0.005 + 0.02 * (spec.index % 5) / 4) as scope:
                response = await client.post(base_url + spec.path, json=spec.body, headers=headers)
                outcome.status, outcome.body = response.status_code, response.content
            outcome.cancelled = scope.cancelled_caught
            return outcome
        async with client.stream("POST", base_url + spec.path, json=spec.body, headers=headers) as response:
            outcome.status = response.status_code
            outcome.content_type = response.headers.get("content-type", "")
            outcome.endpoint = response.headers.get("x-burstsched-endpoint")
            chunks = []
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                if cancel:
                    outcome.cancelled = True
                    break
            outcome.body = b"".join(chunks)
    except httpx.HTTPError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.latency_s = time.perf_counter() - started
    return outcome


def same(a: Outcome, b: Outcome) -> bool:
    return (
        a.status == b.status
        and a.content_type == b.content_type
        and _CREATED.sub(b'"created":0', a.body) == _CREATED.sub(b'"created":0', b.body)
    )


async def _busy(client: httpx.AsyncClient, urls: Sequence[str], names: Sequence[str]) -> dict[str, float]:
    """Each replica's running + waiting requests (from its /metrics)."""
    busy = {}
    for name, url in zip(names, urls, strict=True):
        text = (await client.get(url + "/metrics")).text
        busy[name] = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
        )
    return busy


@asynccontextmanager
async def sim_pool(replicas: int, time_scale: float) -> AsyncIterator[SimPool]:
    config = SimConfig(
        time_scale=time_scale,
        num_gpu_blocks=16384,
        max_model_len=120_000,
        enable_prompt_tokens_details=False,
    )
    async with SimPool(replicas, config) as pool:
        yield pool


async def run(
    pool: SimPool,
    gateway_url: str,
    specs: Sequence[Spec],
    *,
    concurrency: int,
    settle_s: float = 10.0,
) -> Report:
    """Send ``specs`` through the gateway (``concurrency`` at a time), then each completed one directly."""
    report = Report(requests=len(specs))
    direct_urls = dict(zip(pool.names, pool.urls, strict=True))
    limiter = anyio.Semaphore(concurrency)
    started = time.perf_counter()
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(120.0), limits=httpx.Limits(max_connections=concurrency * 2)
    ) as client:

        async def one(spec: Spec) -> None:
            async with limiter:
                via = await send(client, gateway_url, spec, cancel=spec.cancel)
                kind = ("chat" if "messages" in spec.body else "completions") + ("-stream" * spec.stream)
                report.by_kind[kind] = report.by_kind.get(kind, 0) + 1
                report.largest_prompt_bytes = max(report.largest_prompt_bytes, spec.prompt_bytes)
                if spec.cancel:
                    report.cancelled_asked += 1
                    report.cancelled_cut += via.cancelled
                    if not via.cancelled and not via.complete:
                        report.lost.append(f"{spec.request_id}: {via.status} {via.error}")
                    return
                if not via.complete:
                    report.lost.append(f"{spec.request_id}: {via.status} {via.error} {via.body[:200]!r}")
                    return
                report.completed += 1
                if via.endpoint is None or via.endpoint not in direct_urls:
                    report.mismatches.append(f"{spec.request_id}: served by {via.endpoint!r}")
                    return
                report.served_by[via.endpoint] = report.served_by.get(via.endpoint, 0) + 1
                direct = await send(client, direct_urls[via.endpoint], spec, cancel=False)
                report.compared += 1
                if same(via, direct):
                    report.identical += 1
                else:
                    report.mismatches.append(
                        f"{spec.request_id}: via {via.status} {len(via.body)} B, direct {direct.status} "
                        f"{len(direct.body)} B; first via {via.body[:160]!r} / direct {direct.body[:160]!r}"
                    )

        async with anyio.create_task_group() as tg:
            for spec in specs:
                tg.start_soon(one, spec)
        report.seconds = time.perf_counter() - started
        with anyio.move_on_after(settle_s):
            while True:
                report.replicas_busy_after = await _busy(client, pool.urls, pool.names)
                if not any(report.replicas_busy_after.values()):
                    break
                await anyio.sleep(0.2)
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-prompt-bytes", type=int, default=200_000)
    parser.add_argument("--cancel", type=float, default=0.1, help="fraction cancelled by the client")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=0.02, help="simulator time scale")
    parser.add_argument("--mode", choices=sorted(MODES), default="full-duplex")
    parser.add_argument("--config", type=Path, default=Path("config") / "default.yaml")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> Report:
    specs = make_specs(args.requests, args.max_prompt_bytes, args.cancel, args.seed)
    async with sim_pool(args.replicas, args.time_scale) as pool:
        endpoints = list(zip(pool.names, pool.urls, strict=True))
        async with gateway_process(args.config, endpoints, mode=MODES[args.mode]) as url:
            return await run(pool, url, specs, concurrency=args.concurrency)


def summary_lines(report: Report) -> list[str]:
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(report.by_kind.items()))
    return [
        f"requests {report.requests} ({kinds}); largest prompt {report.largest_prompt_bytes} B",
        f"cancelled by the client: {report.cancelled_asked} asked, "
        f"{report.cancelled_cut} cut before their end",
        f"completed {report.completed}; compared with the replica directly {report.compared}, "
        f"byte-identical {report.identical}, different {len(report.mismatches)}",
        f"lost {len(report.lost)}; served by {dict(sorted(report.served_by.items()))}",
        f"replicas still running or queueing afterwards: {report.replicas_busy_after}",
        f"{report.seconds:.1f} s",
    ]


if __name__ == "__main__":
    arguments = parse_args()
    measured = anyio.run(main, arguments)
    print("\n".join(summary_lines(measured)))
    for line in (measured.lost + measured.mismatches)[:20]:
        print("  ", line)
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(measured.as_json(), indent=2) + "\n")
    raise SystemExit(0 if not measured.lost and not measured.mismatches else 1)
