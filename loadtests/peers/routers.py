"""The peer routers (sglang-router, vllm-router) as child processes in front of given replicas.

Their command lines come from each router's own ``--help`` in its venv (sglang-router 0.3.2:
``python -m sglang_router.launch_router``; vllm-router 0.1.17: the ``vllm-router`` script; both Rust
routers behind a Python launcher, sharing sglang-router's flag names). Each runs with its policy's
defaults (cache_aware: ``--cache-threshold 0.3``, ``--balance-abs-threshold 64``,
``--balance-rel-threshold 1.5``); only what a benchmark needs is set: the workers, the policy, a free
127.0.0.1 port (and a free one for its Prometheus exporter, whose default 29000 could collide), a 1 s
worker start-up check (the default waits 30 s between checks) and warning-level logs (per-request INFO
lines cost CPU the replicas share). A router counts as ready once ``/health`` answers 200 and its
``/workers`` lists every replica as healthy; it is stopped by PID (its process group: SIGINT, then
SIGKILL).
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx

from burstsched.testing.ports import free_ports
from burstsched.testing.vllm_replica import stop_process
from burstsched.workloads.targets import Endpoints, RouterTarget
from loadtests.peers.venvs import SGLANG_ROUTER, VLLM_ROUTER, PeerPackage, venv_bin, venv_ready


class PeerUnavailable(RuntimeError):
    """A peer router cannot run here (no venv, unknown policy) or did not become ready; says why."""


@dataclass(frozen=True, slots=True)
class PeerRouter:
    """One peer router: the package that provides it, its launcher and the policies it offers."""

    kind: str
    package: PeerPackage
    launcher: tuple[str, ...]
    policies: tuple[str, ...]
    log_level: str

    def command(
        self, bin_dir: Path, policy: str, worker_urls: Sequence[str], port: int, prometheus_port: int
    ) -> list[str]:
        """The router's command line (absolute paths into its venv)."""
        if policy not in self.policies:
            raise PeerUnavailable(f"{self.kind} has no policy {policy!r} (known: {', '.join(self.policies)})")
        program = [str(bin_dir / self.launcher[0]), *self.launcher[1:]]
        return [
            *program,
            "--worker-urls",
            *worker_urls,
            "--policy",
            policy,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(prometheus_port),
            "--worker-startup-check-interval",
            "1",
            "--log-level",
            self.log_level,
        ]


SGLANG = PeerRouter(
    "sglang",
    SGLANG_ROUTER,
    ("python", "-m", "sglang_router.launch_router"),
    ("cache_aware", "round_robin", "random", "power_of_two"),
    "warn",
)
VLLM_ROUTER_PEER = PeerRouter(
    "vllm-router",
    VLLM_ROUTER,
    ("vllm-router",),
    ("cache_aware", "round_robin", "random", "power_of_two", "consistent_hash"),
    "warning",
)
PEERS: dict[str, PeerRouter] = {p.kind: p for p in (SGLANG, VLLM_ROUTER_PEER)}


def _spawn(args: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
    with tempfile.NamedTemporaryFile(prefix="burstsched-peer-", suffix=".log", delete=False) as log:
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        return process, Path(log.name)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def workers_ready(payload: Any, worker_urls: Sequence[str]) -> bool:
    """Whether a ``/workers`` answer lists every replica as healthy."""
    workers = payload.get("workers") if isinstance(payload, dict) else None
    if not isinstance(workers, list):
        return False
    healthy = {w.get("url") for w in workers if isinstance(w, dict) and w.get("is_healthy", True)}
    return all(url in healthy for url in worker_urls)


async def _wait_ready(
    process: subprocess.Popen[bytes], base_url: str, worker_urls: Sequence[str], timeout_s: float
) -> bool:
    async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
        with anyio.move_on_after(timeout_s):
            while process.poll() is None:
                try:
                    health = await client.get(f"{base_url}/health")
                    workers = await client.get(f"{base_url}/workers")
                    if health.status_code == 200 and workers_ready(workers.json(), worker_urls):
                        return True
                except (httpx.HTTPError, ValueError):
                    pass
                await anyio.sleep(0.2)
    return False


@asynccontextmanager
async def peer_router(
    peer: PeerRouter, policy: str, endpoints: Endpoints, *, ready_timeout_s: float = 60.0
) -> AsyncIterator[str]:
    """Start ``peer`` with ``policy`` in front of the endpoints; yield its base URL; stop it by PID."""
    async with peer_router_process(peer, policy, endpoints, ready_timeout_s=ready_timeout_s) as (url, _):
        yield url


@asynccontextmanager
async def peer_router_process(
    peer: PeerRouter, policy: str, endpoints: Endpoints, *, ready_timeout_s: float = 60.0
) -> AsyncIterator[tuple[str, int]]:
    """:func:`peer_router`, yielding (base URL, PID); the PID leads the router's own process group."""
    if not venv_ready(peer.package):
        raise PeerUnavailable(f"{peer.package.requirement} is not installed (loadtests/peers: prepare)")
    port, prometheus_port = free_ports(2)
    worker_urls = [url for _, url in endpoints]
    args = peer.command(venv_bin(peer.package), policy, worker_urls, port, prometheus_port)
    process, log = await anyio.to_thread.run_sync(_spawn, args)
    base_url = f"http://127.0.0.1:{port}"
    try:
        if not await _wait_ready(process, base_url, worker_urls, ready_timeout_s):
            state = f"exited with {process.returncode}" if process.poll() is not None else "not ready in time"
            raise PeerUnavailable(f"{peer.kind} {policy} {state}; log tail:\n{_tail(log)}")
        yield base_url, process.pid
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(stop_process, process)
            await anyio.to_thread.run_sync(partial(log.unlink, missing_ok=True))


def peer_target(kind: str, policy: str) -> RouterTarget:
    """A workload target for ``kind:policy`` (``sglang:cache_aware``, ``vllm-router:cache_aware``…)."""
    peer = PEERS.get(kind)
    if peer is None:
        raise PeerUnavailable(f"unknown peer router {kind!r} (known: {', '.join(PEERS)})")
    if policy not in peer.policies:
        raise PeerUnavailable(f"{kind} has no policy {policy!r} (known: {', '.join(peer.policies)})")
    return RouterTarget(f"{kind}:{policy}", partial(peer_router, peer, policy))
