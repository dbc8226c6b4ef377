"""The picker's TLS: a self-signed certificate made at start by default (as gateways expect), or the given
files; Envoy speaks TLS to it without verifying, a client that trusts the certificate checks its health."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from burstsched.epp.service import running_epp
from burstsched.epp.tls import Tls, self_signed
from burstsched.sim import SimPool
from burstsched.workloads.gateway import EnvoyMode, envoy, gateway_process
from tests.router.helpers import router_config

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
CHAT = {"model": "kv-demo", "messages": [{"role": "user", "content": "over TLS"}], "max_tokens": 2}


async def _readiness(port: int, credentials: grpc.ChannelCredentials | None) -> str:
    """The picker's readiness over a TLS channel trusting ``credentials`` (None: a plaintext channel)."""
    target = f"127.0.0.1:{port}"
    channel = (
        grpc.aio.secure_channel(target, credentials, options=[("grpc.ssl_target_name_override", "localhost")])
        if credentials is not None
        else grpc.aio.insecure_channel(target)
    )
    async with channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)  # the stubs type it for sync channels only
        try:
            answer = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=3.0)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))


def test_the_generated_certificate_names_the_hosts_and_is_self_signed() -> None:
    tls = self_signed(["epp.example.svc"])
    certificate = x509.load_pem_x509_certificate(tls.cert)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "epp.example.svc"} <= set(names.get_values_for_type(x509.DNSName))
    assert "127.0.0.1" in {str(a) for a in names.get_values_for_type(x509.IPAddress)}
    assert certificate.issuer == certificate.subject and tls.generated
    assert b"PRIVATE KEY" in tls.key


async def test_envoy_reaches_a_picker_serving_a_generated_certificate(
    sims: SimPool, envoy_path: Path, workdir: Path
) -> None:
    config = router_config(list(zip(sims.names, sims.urls, strict=True))[:2], "")
    tls = self_signed()
    async with running_epp(config, tls=tls, rng=random.Random(1)) as epp:
        with anyio.fail_after(30):
            assert (
                await _readiness(epp.port, grpc.ssl_channel_credentials(root_certificates=tls.cert))
                == "SERVING"
            )
            assert (
                await _readiness(epp.port, grpc.ssl_channel_credentials(self_signed().cert)) == "UNAVAILABLE"
            )
            assert await _readiness(epp.port, None) == "UNAVAILABLE"  # no plaintext beside TLS
            with envoy(envoy_path, epp.port, EnvoyMode(tls=True), workdir) as gw:
                async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
                    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200, response.text
    assert response.headers["x-burstsched-endpoint"] in sims.names[:2]


async def test_the_given_certificate_files_are_served(
    sims: SimPool, self_signed: tuple[Path, Path], workdir: Path
) -> None:
    cert, key = self_signed
    config = router_config(list(zip(sims.names, sims.urls, strict=True))[:2], "")
    async with running_epp(config, tls=Tls.from_files(cert, key)) as epp:
        with anyio.fail_after(20):
            trusted = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
            assert await _readiness(epp.port, trusted) == "SERVING"


async def test_burstsched_epp_serves_tls_by_default(sims: SimPool, envoy_path: Path) -> None:
    """The command with no TLS option makes its certificate; Envoy configured for TLS gets through."""
    endpoints = list(zip(sims.names, sims.urls, strict=True))[:2]
    with anyio.fail_after(50):
        async with (
            gateway_process(REPO / "config" / "default.yaml", endpoints, mode=EnvoyMode(tls=True)) as url,
            httpx.AsyncClient(timeout=20) as client,
        ):
            response = await client.post(url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 200, response.text
