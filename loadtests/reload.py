"""Live config under load: ``burstsched serve`` reloaded by SIGHUP every 2 s while requests run; none fails.

    python loadtests/reload.py [--duration 30] [--rate 20] [--stream-share 0.5] [--every 2]
        [--time-scale 0.05] [--json PATH]

Three simulated replicas ``sim-0..2`` run in this process; ``burstsched serve`` runs as its own process with
a config file this script rewrites, then sends the process SIGHUP, every ``--every`` seconds, cycling through
three files:

- A: ``sim-0`` and ``sim-1``, prefix-aware weights (prefix 3, queue 2, KV 2), admission off;
- B: ``sim-0``, ``sim-1`` and ``sim-2`` (``sim-2`` joins; going back to A drains it), prefix weight 1,
  queue 4, a ``tie_tolerance`` change (the picker is rebuilt, the prefix producer kept), admission windows on;
- invalid: B with an unknown plugin type (refused: the running config stays).

Open-loop load at ``--rate`` requests/s (Poisson arrivals, seeded), ``--stream-share`` of them streamed,
half of them on one of a few shared contexts (so the prefix index matters). Each request is sent,
completed (200 and a full body: ``[DONE]`` for a stream) or failed (anything else, with the reason). At the
end the router's ``burstsched_config_reloads_total`` gives the reloads applied and refused. Exits 1 if a
request failed, or no reload was applied or refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from burstsched.sim import SimConfig, SimPool
from burstsched.testing.ports import free_port

MODEL = "reload-model"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load (default 30)")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second (default 20)")
    parser.add_argument("--stream-share", type=float, default=0.5)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between reloads (default 2)")
    parser.add_argument("--time-scale", type=float, default=0.05, help="the simulator's pace (default 0.05)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    return parser.parse_args(argv)


POOL = "pool:\n  scrape_interval_ms: 50\n  staleness_threshold_ms: 2000\n  health_check_interval_ms: 200\n"


def config_a(urls: dict[str, str]) -> str:
    return _config(urls, ["sim-0", "sim-1"], prefix=3, queue=2, tolerance=0.0, admission=False)


def config_b(urls: dict[str, str]) -> str:
    return _config(urls, ["sim-0", "sim-1", "sim-2"], prefix=1, queue=4, tolerance=0.01, admission=True)


def config_invalid(urls: dict[str, str]) -> str:
    return config_b(urls).replace("type: queue-scorer", "type: no-such-scorer")


def _config(
    urls: dict[str, str], names: list[str], *, prefix: float, queue: float, tolerance: float, admission: bool
) -> str:
    endpoints = "".join(f"  - name: {n}\n    url: {urls[n]}\n" for n in names)
    window = "  enabled: true\n  window_ms: 10\n" if admission else "  enabled: false\n"
    return (
        f"endpoints:\n{endpoints}{POOL}admission:\n{window}"
        "plugins:\n"
        "  - type: approx-prefix-producer\n"
        "  - type: health-filter\n"
        "  - type: prefix-cache-scorer\n"
        "  - type: queue-scorer\n"
        "  - type: kv-utilization-scorer\n"
        "  - type: max-score-picker\n"
        f"    parameters:\n      tie_tolerance: {tolerance}\n"
        "profile:\n"
        "  plugins:\n"
        "    - plugin_ref: approx-prefix-producer\n"
        "    - plugin_ref: health-filter\n"
        "    - plugin_ref: prefix-cache-scorer\n"
        f"      weight: {prefix}\n"
        "    - plugin_ref: queue-scorer\n"
        f"      weight: {queue}\n"
        "    - plugin_ref: kv-utilization-scorer\n"
        "      weight: 2\n"
        "  picker: max-score-picker\n"
    )


@dataclass
class Tally:
    sent: int = 0
    completed: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    served_by: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)


def _body(rng: random.Random, contexts: list[str], stream: bool, i: int) -> dict[str, object]:
    prompt = f"Request {i}: {rng.random()}"
    if rng.random() < 0.5:
        prompt = rng.choice(contexts) + " " + prompt
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 16,
        "stream": stream,
    }


async def _one(client: httpx.AsyncClient, body: dict[str, object], tally: Tally) -> None:
    started = time.monotonic()
    try:
        if body["stream"]:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                text = (await response.aread()).decode()
                ok = response.status_code == 200 and "data: [DONE]" in text and '"error"' not in text
                reason = f"stream {response.status_code}"
        else:
            response = await client.post("/v1/chat/completions", json=body)
            ok = response.status_code == 200 and bool(response.json().get("choices"))
            reason = f"status {response.status_code}"
    except httpx.HTTPError as exc:
        ok, reason = False, type(exc).__name__
    if ok:
        tally.completed += 1
        tally.served_by[response.headers.get("x-burstsched-endpoint", "?")] += 1
        tally.latencies.append(time.monotonic() - started)
    else:
        tally.failures[reason] += 1


async def _load(url: str, args: argparse.Namespace, tally: Tally) -> None:
    rng = random.Random(args.seed)
    contexts = [" ".join(f"Context {c} fact {j}: value {rng.random()}." for j in range(80)) for c in range(4)]
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        tasks: list[asyncio.Task[None]] = []
        end = time.monotonic() + args.duration
        next_at = time.monotonic()
        i = 0
        while next_at < end:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            body = _body(rng, contexts, rng.random() < args.stream_share, i)
            tally.sent += 1
            tasks.append(asyncio.create_task(_one(client, body, tally)))
            next_at += rng.expovariate(args.rate)
            i += 1
        await asyncio.gather(*tasks)


async def _reloads(
    proc: subprocess.Popen[bytes], path: Path, texts: list[str], every: float, stop: asyncio.Event
) -> int:
    sent = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=every)
            break
        except TimeoutError:
            pass
        text = texts[sent % len(texts)]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic, as a ConfigMap update is
        proc.send_signal(signal.SIGHUP)
        sent += 1
    return sent


def _reload_counts(metrics: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "burstsched_config_reloads_total":
                out[sample.labels["outcome"]] = sample.value
    return out


async def run(args: argparse.Namespace) -> dict[str, object]:
    sim = SimConfig(served_model_name=MODEL, time_scale=args.time_scale)
    async with SimPool(3, sim) as pool:
        urls = dict(zip(pool.names, pool.urls, strict=True))
        texts = [config_b(urls), config_invalid(urls), config_a(urls)]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "router.yaml"
            path.write_text(config_a(urls))
            port = free_port()
            cmd = [sys.executable, "-m", "burstsched", "serve", "--config", str(path), "--port", str(port)]
            log_path = Path(tmp) / "router.log"
            log_file = log_path.open("wb")
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log_file)  # noqa: ASYNC220
            url = f"http://127.0.0.1:{port}"
            try:
                async with httpx.AsyncClient(base_url=url, timeout=5) as probe:
                    deadline = time.monotonic() + 60
                    while True:
                        if proc.poll() is not None or time.monotonic() > deadline:
                            log_file.flush()
                            tail = log_path.read_text(errors="replace")[-2000:]
                            raise RuntimeError(f"burstsched serve did not become ready:\n{tail}")
                        try:
                            if (await probe.get("/ready")).status_code == 200:
                                break
                        except httpx.TransportError:
                            pass
                        await asyncio.sleep(0.1)
                    tally = Tally()
                    stop = asyncio.Event()
                    reloader = asyncio.create_task(_reloads(proc, path, texts, args.every, stop))
                    started = time.monotonic()
                    await _load(url, args, tally)
                    took = time.monotonic() - started
                    stop.set()
                    signals = await reloader
                    await asyncio.sleep(0.5)  # the last reload's log line; the counts are read below
                    counts = _reload_counts((await probe.get("/metrics")).text)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                log_file.close()
                stderr = log_path.read_text(errors="replace")
    latencies = sorted(tally.latencies)
    return {
        "command": " ".join(["python", "loadtests/reload.py", *sys.argv[1:]]),
        "duration_s": round(took, 1),
        "rate": args.rate,
        "sent": tally.sent,
        "completed": tally.completed,
        "failed": sum(tally.failures.values()),
        "failures": dict(tally.failures),
        "served_by": dict(sorted(tally.served_by.items())),
        "latency_p50_s": round(latencies[len(latencies) // 2], 3) if latencies else None,
        "latency_p99_s": round(latencies[int(len(latencies) * 0.99)], 3) if latencies else None,
        "sighups_sent": signals,
        "reloads_applied": counts.get("applied", 0.0),
        "reloads_unchanged": counts.get("unchanged", 0.0),
        "reloads_refused": counts.get("refused", 0.0),
        "router_tracebacks": stderr.count("Traceback"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(run(args))
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    ok = (
        report["failed"] == 0
        and report["completed"] == report["sent"]
        and float(str(report["reloads_applied"])) > 0
        and float(str(report["reloads_refused"])) > 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
