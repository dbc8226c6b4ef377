"""Router overhead: tiny non-streaming requests through burstsched vs straight to one replica.

    python loadtests/overhead.py [--duration 10] [--clients 1,32] [--replicas 2] [--sim process|thread]
                                 [--slice 1] [--config config/prefix-aware.yaml] [--json PATH]

Zero-delay simulated replicas (``time_scale`` 0) answer ``max_tokens: 1`` chat requests; closed-loop clients
(1, then 32) send them for a fixed time (``--duration`` seconds per target and level) straight to replica 0
and through ``burstsched serve`` (a separate process on a free port, in front of all replicas, stopped by
PID). The two targets alternate in short slices, so load from elsewhere on the machine falls on both alike.
It prints requests/s, p50/p99 latency, CPU time per request of the router, the replicas and this client,
and the ratios (workloads.md §4). Compare ratios within one run, never absolute figures across runs.

The clients speak minimal HTTP/1.1 over keep-alive connections (no HTTP library), so that the load generator
costs as little CPU as possible next to what it measures. By default each replica is its own process
(``burstsched sim --time-scale 0``); ``--sim thread`` runs them in this process instead (``SimPool``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

MODEL = "kv-demo"
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
).encode()


@dataclass(frozen=True)
class RunResult:
    target: str
    clients: int
    requests: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    router_cpu_ms: float | None = None
    """The router's CPU time per request (burstsched runs only)."""
    replicas_cpu_ms: float | None = None
    """All replicas' CPU time per request (replica processes only)."""
    client_cpu_ms: float | None = None
    """This load generator's CPU time per request."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measured run (default 10)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each run")
    parser.add_argument(
        "--slice", type=float, default=1.0, help="direct and routed runs alternate in slices this long (s)"
    )
    parser.add_argument("--clients", default="1,32", help="comma-separated concurrency levels")
    parser.add_argument("--replicas", type=int, default=2, help="replicas behind the router (default 2)")
    parser.add_argument("--sim", choices=("process", "thread"), default="process")
    parser.add_argument("--config", type=Path, default=Path("config") / "prefix-aware.yaml")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    return parser.parse_args()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- a minimal keep-alive HTTP/1.1 client --------------------------------------------------------------


class HttpConnection:
    """One keep-alive connection sending the same POST again and again."""

    def __init__(self, host: str, port: int, path: str) -> None:
        self._host, self._port = host, port
        self._request = (
            f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self) -> int:
        """Send the request, read the whole response; return its status."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        assert self._reader is not None
        self._writer.write(self._request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
        }
        if "content-length" in headers:
            await self._reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            while True:
                size = int((await self._reader.readuntil(b"\r\n")).strip(), 16)
                await self._reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            raise RuntimeError(f"response without a length: {head!r}")
        if headers.get("connection") == "close":
            await self.close()
        return status

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        self._reader = self._writer = None


async def closed_loop(connections: list[HttpConnection], seconds: float) -> tuple[list[float], int, float]:
    """Each connection sends requests back to back for ``seconds``: latencies, errors, elapsed time."""
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def one_client(connection: HttpConnection) -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                status = await connection.request()
            except (OSError, asyncio.IncompleteReadError, ValueError):
                errors += 1
                await connection.close()
                continue
            if status == 200:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(one_client(c) for c in connections)), timeout=seconds + 30)
    return latencies, errors, time.perf_counter() - started


def connections_to(url: str, path: str, count: int) -> list[HttpConnection]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return [HttpConnection(host, int(port), path) for _ in range(count)]


# --- processes -----------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, from /proc (None where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_http_ok(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGINT the process by PID, then SIGKILL after a bounded wait."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def child(args: list[str], ready_url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http_ok(ready_url, proc)
        yield proc
    except BaseException:
        sys.stderr.write(log.read_text(errors="replace")[-3000:])
        raise
    finally:
        stop_process(proc)


@asynccontextmanager
async def replicas(count: int, mode: str, logdir: Path) -> AsyncIterator[list[tuple[str, str, int | None]]]:
    """``count`` zero-delay simulated replicas: (name, url, pid or None) each."""
    if mode == "thread":
        from burstsched.sim import SimConfig, SimPool

        async with SimPool(count, SimConfig(time_scale=0.0)) as pool:
            yield [(name, url, None) for name, url in zip(pool.names, pool.urls, strict=True)]
        return
    from contextlib import ExitStack

    with ExitStack() as stack:
        endpoints: list[tuple[str, str, int | None]] = []
        for i in range(count):
            port = free_port()
            args = [sys.executable, "-m", "burstsched", "sim", "--port", str(port), "--time-scale", "0"]
            args += ["--name", f"sim-{i}", "--log-level", "warning"]
            url = f"http://127.0.0.1:{port}"
            proc = stack.enter_context(child(args, f"{url}/health", logdir / f"sim-{i}.log"))
            endpoints.append((f"sim-{i}", url, proc.pid))
        yield endpoints


@contextmanager
def router(
    config: Path, endpoints: list[tuple[str, str, int | None]], logdir: Path
) -> Iterator[tuple[str, int]]:
    """``burstsched serve`` in its own process: (url, pid)."""
    port = free_port()
    args = [sys.executable, "-m", "burstsched", "serve", "--config", str(config), "--port", str(port)]
    for name, url, _ in endpoints:
        args += ["--endpoint", f"{name}={url}"]
    url = f"http://127.0.0.1:{port}"
    with child(args, f"{url}/ready", logdir / "router.log") as proc:
        yield url, proc.pid


# --- the measurement -----------------------------------------------------------------------------------


class CpuMeter:
    """CPU seconds of the router, the replica processes and this process, between two readings."""

    def __init__(self, router_pid: int, replica_pids: list[int | None]) -> None:
        self._router = router_pid
        self._replicas = replica_pids

    def read(self) -> tuple[float | None, float | None, float]:
        router = cpu_seconds(self._router)
        replica_times = [cpu_seconds(pid) if pid is not None else None for pid in self._replicas]
        replicas = None if any(t is None for t in replica_times) else sum(t or 0.0 for t in replica_times)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return router, replicas, usage.ru_utime + usage.ru_stime


@dataclass
class Tally:
    """One target's measurements, summed over its time slices."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    cpu: list[float | None] = field(default_factory=lambda: [0.0, 0.0, 0.0])

    def add(
        self,
        run: tuple[list[float], int, float],
        before: tuple[float | None, float | None, float],
        after: tuple[float | None, float | None, float],
    ) -> None:
        self.latencies += run[0]
        self.errors += run[1]
        self.seconds += run[2]
        for i in range(3):
            total, a, b = self.cpu[i], before[i], after[i]
            self.cpu[i] = None if total is None or a is None or b is None else total + (b - a)


def summarize(target: str, clients: int, tally: Tally) -> RunResult:
    latencies = sorted(tally.latencies)
    n = len(latencies)
    p50 = statistics.median(latencies) if latencies else float("nan")
    p99 = latencies[min(n - 1, int(0.99 * n))] if latencies else float("nan")

    def per_request(cpu: float | None) -> float | None:
        return None if cpu is None or n == 0 else cpu / n * 1e3

    return RunResult(
        target=target,
        clients=clients,
        requests=n,
        errors=tally.errors,
        seconds=tally.seconds,
        rps=n / tally.seconds,
        p50_ms=p50 * 1e3,
        p99_ms=p99 * 1e3,
        router_cpu_ms=per_request(tally.cpu[0]) if target == "burstsched" else None,
        replicas_cpu_ms=per_request(tally.cpu[1]),
        client_cpu_ms=per_request(tally.cpu[2]),
    )


async def measure(args: argparse.Namespace) -> list[RunResult]:
    """Per concurrency level, direct and routed runs alternate in short slices, so that load from elsewhere
    on the machine falls on both alike."""
    levels = [int(c) for c in args.clients.split(",")]
    results: list[RunResult] = []
    path = "/v1/chat/completions"
    with tempfile.TemporaryDirectory(prefix="burstsched-overhead-") as tmp:
        logdir = Path(tmp)
        async with replicas(args.replicas, args.sim, logdir) as endpoints:
            with router(args.config, endpoints, logdir) as (router_url, router_pid):
                meter = CpuMeter(router_pid, [pid for _, _, pid in endpoints])
                urls = {"direct": endpoints[0][1], "burstsched": router_url}
                slices = max(1, round(args.duration / args.slice))
                for clients in levels:
                    connections = {t: connections_to(url, path, clients) for t, url in urls.items()}
                    tallies = {t: Tally() for t in urls}
                    try:
                        for target in urls:
                            await closed_loop(connections[target], args.warmup)
                        for i in range(slices):
                            order = list(urls) if i % 2 == 0 else list(reversed(urls))
                            for target in order:
                                before = meter.read()
                                run = await closed_loop(connections[target], args.duration / slices)
                                tallies[target].add(run, before, meter.read())
                    finally:
                        for conns in connections.values():
                            for connection in conns:
                                await connection.close()
                    for target in urls:
                        result = summarize(target, clients, tallies[target])
                        results.append(result)
                        print(_row(result), flush=True)
    return results


def _ms(value: float | None) -> str:
    return f"{value:>7.3f}" if value is not None else "      -"


def _row(r: RunResult) -> str:
    return (
        f"{r.target:>10} {r.clients:>7} {r.requests:>9} {r.errors:>6} {r.rps:>9.0f} "
        f"{r.p50_ms:>8.3f} {r.p99_ms:>8.3f} "
        f"{_ms(r.router_cpu_ms)} {_ms(r.replicas_cpu_ms)} {_ms(r.client_cpu_ms)}"
    )


def report(results: list[RunResult]) -> list[dict[str, float | int]]:
    print("\nratios (burstsched vs direct, same run):")
    ratios = []
    for clients in sorted({r.clients for r in results}):
        direct = next(r for r in results if r.clients == clients and r.target == "direct")
        routed = next(r for r in results if r.clients == clients and r.target == "burstsched")
        entry: dict[str, float | int] = {
            "clients": clients,
            "rps_ratio": routed.rps / direct.rps,
            "added_p50_ms": routed.p50_ms - direct.p50_ms,
            "added_p99_ms": routed.p99_ms - direct.p99_ms,
        }
        ratios.append(entry)
        print(
            f"  {clients:>3} clients: requests/s ratio {entry['rps_ratio']:.3f}, "
            f"added p50 {entry['added_p50_ms']:.3f} ms, added p99 {entry['added_p99_ms']:.3f} ms"
        )
    return ratios


def main() -> int:
    args = parse_args()
    print(
        f"router overhead: {args.replicas} zero-delay replica(s) ({args.sim}), config {args.config}, "
        f"{args.duration:g} s per run, cpu count {os.cpu_count()}"
    )
    print(
        f"{'target':>10} {'clients':>7} {'requests':>9} {'errors':>6} {'req/s':>9} "
        f"{'p50 ms':>8} {'p99 ms':>8} "
        "  CPU ms/request: router replicas client"
    )
    results = asyncio.run(measure(args))
    ratios = report(results)
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in results], "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
