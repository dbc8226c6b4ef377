"""What the gateway's limits do to a request the picker holds, and what the picker does about them, behind a
real Envoy in front of simulated replicas: the admission wait against ext_proc's ``message_timeout``, and a
replica that dies in the middle of a stream."""

from __future__ import annotations

import random
import time
from pathlib import Path

import anyio
import httpx
import pytest

from burstsched.config import RouterConfig
from burstsched.epp.service import running_epp
from burstsched.sim import SimPool
from burstsched.workloads.gateway import EnvoyMode, envoy
from tests.router.helpers import eventually, router_config

REPO = Path(__file__).resolve().parents[2]
MODEL = "kv-demo"
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def _config(sims: SimPool, yaml_name: str) -> RouterConfig:
    pool = list(zip(sims.names, sims.urls, strict=True))[:2]
    return router_config(pool, (REPO / "config" / yaml_name).read_text())


def _long_window(sims: SimPool) -> RouterConfig:
    """Burst admission whose window (800 ms) outlasts the gateway's message timeout (300 ms below)."""
    config = _config(sims, "burst.yaml")
    admission = config.admission.model_copy(update={"window_ms": 800, "bypass_warm": False})
    return config.model_copy(update={"admission": admission})


def _cold_chat(seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    text = " ".join(f"line{rng.randrange(10**9):09d}" for _ in range(400))  # long enough to wait in a window
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2}


@pytest.mark.parametrize(
    ("mode", "uncapped_fails"),
    [
        (EnvoyMode(message_timeout_s=0.3), False),
        (EnvoyMode("BUFFERED", "NONE", message_timeout_s=0.3), True),
    ],
    ids=["full-duplex", "buffered"],
)
async def test_a_wait_past_the_message_timeout_fails_unless_capped(
    sims: SimPool, envoy_path: Path, workdir: Path, mode: EnvoyMode, uncapped_fails: bool
) -> None:
    """A request held 800 ms in the window, Envoy's message timeout 300 ms. With a buffered body Envoy times
    the picker's answer to the body message and fails the request (504); in full duplex Envoy 1.40 does not
    time the messages, so it waits. Capped at 100 ms, the wait ends, the request is scheduled alone and
    answered in both modes."""
    outcomes: dict[float, tuple[int, float]] = {}
    for max_wait_s in (5.0, 0.1):
        async with running_epp(_long_window(sims), max_wait_s=max_wait_s) as epp:
            with envoy(envoy_path, epp.port, mode, workdir) as gw:
                async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                    with anyio.fail_after(20):
                        started = time.monotonic()
                        response = await client.post("/v1/chat/completions", json=_cold_chat(int(max_wait_s)))
                        outcomes[max_wait_s] = (response.status_code, time.monotonic() - started)
    uncapped, capped = outcomes[5.0], outcomes[0.1]
    if uncapped_fails:
        assert uncapped[0] == 504, outcomes  # Envoy gave up waiting for the picker's answer
    else:
        assert uncapped[0] == 200 and uncapped[1] >= 0.8, outcomes
    assert capped[0] == 200 and capped[1] < 0.3 + 0.5, outcomes


@pytest.mark.parametrize(
    "mode", [EnvoyMode(), EnvoyMode("BUFFERED", "NONE")], ids=["full-duplex", "buffered-no-response-body"]
)
async def test_a_replica_killed_mid_stream_is_never_a_clean_end(
    sims: SimPool, envoy_path: Path, workdir: Path, mode: EnvoyMode
) -> None:
    """The replica serving a stream dies after its first chunk: the client's response ends without HTTP/1.1's
    last chunk (an error its client raises), never as a complete stream; the picker stops counting the
    request on that replica, and the next request goes to the live one."""
    async with running_epp(_config(sims, "default.yaml")) as epp:
        with envoy(envoy_path, epp.port, mode, workdir) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                with anyio.fail_after(40):
                    body = {
                        "model": MODEL,
                        "messages": [{"role": "user", "content": "story"}],
                        "stream": True,
                    }
                    body["max_tokens"] = 5000
                    received = b""
                    with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
                        async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                            assert stream.status_code == 200
                            name = stream.headers["x-burstsched-endpoint"]
                            async for chunk in stream.aiter_raw():
                                if not received:
                                    await sims.akill(sims.names.index(name))
                                received += chunk
                    assert b"[DONE]" not in received

                    async def released() -> bool:
                        snapshot = epp.router.pool.snapshot(name)
                        return snapshot.in_flight == 0 and not snapshot.healthy

                    await eventually(released, within_s=10)
                    after = await client.post(
                        "/v1/chat/completions",
                        json={
                            "model": MODEL,
                            "messages": [{"role": "user", "content": "again"}],
                            "max_tokens": 2,
                        },
                    )
    assert after.status_code == 200, after.text
    assert after.headers["x-burstsched-endpoint"] != name
