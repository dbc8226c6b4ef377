"""``burstsched epp``: serve the router as a gateway's endpoint picker (Envoy ext_proc over gRPC).

The config and its command-line overrides (``--config``, ``--endpoint``, ``--kv-events``,
``--kv-events-replay``, ``--tokenizer``) are defined and read by the same code as ``burstsched serve``'s
(:mod:`burstsched.server.pool_arguments`). The process serves until SIGTERM or SIGINT, then stops taking
streams and gives those in flight ``--grace`` seconds.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
from pathlib import Path

import anyio

from burstsched.config import ConfigError, RouterConfig
from burstsched.discovery import Discovery, InferencePoolDiscovery, InferencePoolError, api_factory
from burstsched.discovery.kubernetes import default_namespace
from burstsched.epp.picker import DEFAULT_MAX_WAIT_S
from burstsched.epp.service import running_epp
from burstsched.epp.tls import Tls, self_signed
from burstsched.server.pool_arguments import add_pool_arguments, lacks_endpoints, load_router_config

DEFAULT_PORT = 9002
"""The port gateways' InferencePool ``endpointPickerRef`` uses by default."""
DEFAULT_METRICS_PORT = 9090
"""llm-d's picker's metrics port."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_pool_arguments(parser)
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="gRPC port: ext_proc and health (default: %(default)s)"
    )
    parser.add_argument(
        "--pool-name",
        metavar="NAME",
        help="discover the endpoints from this InferencePool (inference.networking.k8s.io/v1): its selector "
        "chooses Ready pods, one endpoint per target port; replaces the config's endpoints and discovery",
    )
    parser.add_argument(
        "--pool-namespace", metavar="NS", help="the InferencePool's namespace (default: the pod's own)"
    )
    parser.add_argument(
        "--kube-api-url",
        metavar="URL",
        help="the Kubernetes API (default: the in-cluster config in a pod, else the kubeconfig)",
    )
    parser.add_argument(
        "--fallbacks",
        type=int,
        default=0,
        metavar="N",
        help="also name the N next-best endpoints after the pick, comma-separated, in the destination header "
        "and metadata (default: %(default)s; an original_dst cluster needs 0, it reads one IP:PORT)",
    )
    parser.add_argument(
        "--max-wait",
        type=float,
        default=DEFAULT_MAX_WAIT_S,
        metavar="S",
        help="the longest a request waits in admission (burst window, queue) before it is scheduled alone; "
        "keep it below the gateway's ext_proc message_timeout (default: %(default)s)",
    )
    parser.add_argument(
        "--served-header",
        metavar="NAME",
        help="name, in this response header, the IP:PORT that served the request (the fallback the "
        "gateway reports in envoy.lb x-gateway-destination-endpoint-served, else the pick); the Gateway API "
        "Inference Extension's conformance suite reads x-conformance-test-served-endpoint (default: none)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        metavar="PORT",
        help="Prometheus metrics (GET /metrics, plain HTTP) on this port; 0 for none (default: %(default)s)",
    )
    parser.add_argument(
        "--cert",
        type=Path,
        help="TLS certificate chain (PEM), with --key; without them a self-signed one is made at start",
    )
    parser.add_argument("--key", type=Path, help="TLS private key (PEM)")
    parser.add_argument(
        "--plaintext",
        action="store_true",
        help="serve gRPC without TLS (the gateway's ext_proc cluster then speaks plain HTTP/2)",
    )
    parser.add_argument(
        "--grace", type=float, default=5.0, metavar="S", help="seconds for streams in flight at shutdown"
    )
    parser.add_argument("--log-level", default="warning", help="log level (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_router_config(args)
    except ConfigError as exc:
        print(f"burstsched epp: {exc}", file=sys.stderr)
        return 2
    pooled = args.pool_name is not None
    if not pooled and lacks_endpoints(config):
        print("burstsched epp: no endpoints (give --endpoint or list them in the config)", file=sys.stderr)
        return 2
    if (args.cert is None) != (args.key is None):
        print("burstsched epp: give both --cert and --key, or neither", file=sys.stderr)
        return 2
    if args.plaintext and args.cert is not None:
        print("burstsched epp: --plaintext and --cert/--key exclude each other", file=sys.stderr)
        return 2
    if not 0 <= args.metrics_port < 65536:
        print("burstsched epp: --metrics-port must be a port number, or 0 for none", file=sys.stderr)
        return 2
    if args.max_wait <= 0:
        print("burstsched epp: --max-wait must be positive", file=sys.stderr)
        return 2
    if args.fallbacks < 0:
        print("burstsched epp: --fallbacks must be 0 or more", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        tls = _tls(args)
    except OSError as exc:
        print(f"burstsched epp: cannot read the certificate or key: {exc}", file=sys.stderr)
        return 2
    try:
        anyio.run(_serve, config, args, tls)  # asyncio's own loop: grpc.aio does not support uvloop
    except (OSError, InferencePoolError) as exc:
        print(f"burstsched epp: {exc}", file=sys.stderr)
        return 2
    return 0


def _tls(args: argparse.Namespace) -> Tls | None:
    if args.plaintext:
        return None
    if args.cert is not None and args.key is not None:
        return Tls.from_files(args.cert, args.key)
    return self_signed([args.host])


def _discovery(args: argparse.Namespace) -> Discovery | None:
    """The InferencePool's discovery when ``--pool-name`` names one, else the config's (None)."""
    if args.pool_name is None:
        return None
    return InferencePoolDiscovery(
        api_factory(args.kube_api_url),
        name=args.pool_name,
        namespace=args.pool_namespace or default_namespace(),
    )


async def _serve(config: RouterConfig, args: argparse.Namespace, tls: Tls | None) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with running_epp(
            config,
            host=args.host,
            port=args.port,
            fallbacks=args.fallbacks,
            tls=tls,
            grace_s=args.grace,
            max_wait_s=args.max_wait,
            metrics_port=args.metrics_port or None,
            discovery=_discovery(args),
            served_header=args.served_header,
        ) as epp:
            gc.collect()
            gc.freeze()  # as serve does: the objects alive now stay out of the collector's walks
            security = "plaintext" if tls is None else "TLS, self-signed" if tls.generated else "TLS"
            print(
                f"burstsched epp: serving ext_proc on {epp.target} ({security})", file=sys.stderr, flush=True
            )
            async for _ in signals:
                return
