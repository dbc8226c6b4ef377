"""``burstsched epp`` as its own process: gRPC health, and Envoy's behaviour once it is killed (SIGKILL by
PID), fail-closed and fail-open (``failure_mode_allow``), with and without the gateway stripping a client's
destination header."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from burstsched.epp.wire import endpoint_address
from burstsched.sim import SimPool
from burstsched.testing.ports import free_port
from burstsched.workloads.gateway import DESTINATION, EnvoyMode, envoy

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@contextmanager
def epp_process(sims: SimPool, workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    command = [sys.executable, "-m", "burstsched", "epp", "--config", str(REPO / "config" / "default.yaml")]
    command += ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0", "--plaintext"]
    for name, url in list(zip(sims.names, sims.urls, strict=True))[:2]:
        command += ["--endpoint", f"{name}={url}"]
    log = (workdir / "epp.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        log.close()


async def _serving(port: int, service: str, within_s: float = 30.0) -> None:
    with anyio.fail_after(within_s):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub: Any = health_pb2_grpc.HealthStub(channel)  # the stubs type it for sync channels only
            while True:
                try:
                    answer = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                await anyio.sleep(0.1)


async def test_health_then_killed_fail_closed_and_fail_open(
    sims: SimPool, envoy_path: Path, workdir: Path
) -> None:
    decoy = endpoint_address(sims.urls[2])
    body = {"model": "kv-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    seen: dict[str, list[int]] = {}
    with epp_process(sims, workdir) as (process, port):
        for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", ""):
            await _serving(port, service)
        buffered = EnvoyMode(request_body="BUFFERED", response_body="NONE", failure_mode_allow=True)
        modes = {
            "closed": EnvoyMode(),
            "open": EnvoyMode(failure_mode_allow=True),
            "open-unstripped": EnvoyMode(failure_mode_allow=True, strip_destination=False),
            "buffered-open": buffered,
            "buffered-open-unstripped": dataclasses.replace(buffered, strip_destination=False),
        }
        for label, mode in modes.items():
            (workdir / label).mkdir()
            with envoy(envoy_path, port, mode, workdir / label) as gw:
                async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
                    with anyio.fail_after(30):
                        if process.poll() is None:  # the picker answers first
                            ok = await client.post("/v1/chat/completions", json=body)
                            assert ok.status_code == 200, ok.text
                            process.kill()
                            process.wait(timeout=10)
                        statuses = []
                        for _ in range(3):
                            response = await client.post(
                                "/v1/chat/completions", json=body, headers={DESTINATION: decoy}
                            )
                            statuses.append(response.status_code)
                        seen[label] = statuses
    # Fail-closed: the gateway answers 500 itself. Fail-open with the client's header stripped before
    # ext_proc: no destination, so the ORIGINAL_DST cluster has no host (503; in full duplex a stream that
    # fails after its body was handed over is a 500 either way). Fail-open without stripping: the client
    # steers its request to the decoy (in full duplex whenever the failure comes before the body was handed
    # over).
    assert seen["closed"] == [500, 500, 500], seen
    assert set(seen["open"] + seen["buffered-open"]) <= {500, 503}, seen
    assert seen["buffered-open"] == [503, 503, 503], seen
    assert seen["buffered-open-unstripped"] == [200, 200, 200], seen
    steered = (seen["open-unstripped"] + seen["buffered-open-unstripped"]).count(200)
    assert len(sims.requests(2)) == steered
