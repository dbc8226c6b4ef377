"""The ``/metrics`` exposition, compared with expected text after a fixed sequence of events.

The events go through the real :class:`RouterMetrics` (latencies through its ASGI ``send`` wrapper, timed by
an injected clock) and a real scheduler; ``*_created`` lines (wall-clock timestamps) are left out of the
comparison. Run with ``BURSTSCHED_UPDATE_GOLDEN=1`` to rewrite the expected files after a deliberate change.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from starlette.types import Message

from burstsched.config import RouterConfig
from burstsched.framework import ApiKind, EndpointSnapshot, PluginContext, PluginRegistry, SchedRequest
from burstsched.scheduling import build_scheduler
from burstsched.telemetry.metrics import RouterMetrics

GOLDEN = Path(__file__).parent / "golden"


class StepClock:
    """Seconds that move only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def _sink(message: Message) -> None:
    return None


def _stable(exposition: bytes) -> str:
    lines = exposition.decode().splitlines()
    return "\n".join(line for line in lines if "_created" not in line) + "\n"


def _compare(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("BURSTSCHED_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs (rewrite with BURSTSCHED_UPDATE_GOLDEN=1 if meant)"


def _start(status: int, endpoint: str | None, content_type: bytes) -> Message:
    headers = [(b"content-type", content_type)]
    if endpoint is not None:
        headers.append((b"x-burstsched-endpoint", endpoint.encode()))
    return {"type": "http.response.start", "status": status, "headers": headers}


def _body(data: bytes, more: bool) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


def _request(request_id: str, hashes: tuple[int, ...]) -> SchedRequest:
    return SchedRequest(
        request_id, "kv-demo", ApiKind.CHAT, block_hashes=hashes, prompt_tokens=64 * len(hashes)
    )


ENDPOINTS = [
    EndpointSnapshot(
        name="sim-0",
        url="http://127.0.0.1:1",
        metrics_age=0.025,
        in_flight=2,
        block_size=16,
        num_gpu_blocks=1000,
    ),
    EndpointSnapshot(name="sim-1", url="http://127.0.0.1:2", healthy=False, stale=True),
]


def test_fresh_metrics_expose_every_family() -> None:
    _compare("fresh.txt", _stable(RouterMetrics(clock=StepClock()).render()))


@pytest.mark.anyio
async def test_exposition_after_a_fixed_sequence_of_events() -> None:
    clock = StepClock()
    metrics = RouterMetrics(clock=clock)
    metrics.watch_endpoints(lambda: ENDPOINTS)
    scheduler = build_scheduler(
        RouterConfig(), PluginRegistry.discover(), PluginContext(rng=random.Random(0))
    )
    metrics.watch_plugins(scheduler.profile.plugins, lambda: [e.name for e in ENDPOINTS])

    # a streamed request: first token after 62.5 ms, last byte after 1 s (binary-exact steps)
    send = metrics.timed(_sink)
    clock.advance(0.0625)
    await send(_start(200, "sim-0", b"text/event-stream"))
    await send(_body(b"data: {}\n\n", more=True))
    clock.advance(0.9375)
    await send(_body(b"data: [DONE]\n\n", more=True))
    await send(_body(b"", more=False))
    metrics.attempt("sim-0", "ok")
    metrics.request_done("sim-0", "ok")

    # a non-streamed one after a failover: end to end only
    send = metrics.timed(_sink)
    clock.advance(0.25)
    await send(_start(200, "sim-1", b"application/json"))
    await send(_body(b"{}", more=False))
    metrics.attempt("sim-0", "connect_error")
    metrics.attempt("sim-1", "ok")
    metrics.request_done("sim-1", "ok")

    # one the router refused itself: no latency observed
    send = metrics.timed(_sink)
    clock.advance(0.5)
    await send(_start(400, None, b"application/json"))
    await send(_body(b"{}", more=False))
    metrics.request_done(None, "rejected")

    # scheduling: plugin timings, then three decisions on the real scheduler (cold, 2 of 6 blocks, warm)
    metrics.scheduling_duration.observe(0.0003)
    for point, plugin, seconds in [
        ("producer", "approx-prefix-producer", 0.00002),
        ("filter", "health-filter", 0.000002),
        ("scorer", "prefix-cache-scorer", 0.000004),
        ("scorer", "queue-scorer", 0.000004),
        ("picker", "max-score-picker", 0.00003),
        ("producer", "approx-prefix-producer", 0.0002),
    ]:
        metrics.observe_plugin(point, plugin, seconds)
    first, second = _request("a", (1, 2, 3, 4)), _request("b", (1, 2, 5, 6, 7, 8))
    healthy = ENDPOINTS[:1]
    for request in (first, second, first):
        decision = scheduler.schedule(request, healthy)
        metrics.observe_decision(decision)
        scheduler.on_dispatch(request, decision.endpoint)

    # admission: a group of three (leader and two members) and one bypass
    metrics.observe_admission("leader", 0.008, 3)
    metrics.observe_admission("member", 0.0079, 3)
    metrics.observe_admission("member", 0.0062, 3)
    metrics.observe_admission("bypass", 0.00004, 1)

    # precise mode: tokenization outcomes and what the KV-event hub reports
    metrics.tokenized("ok")
    metrics.tokenized("ok")
    metrics.tokenized("fallback")
    metrics.kv_events("sim-0", "BlockStored", 3)
    metrics.kv_events("sim-0", "BlockRemoved", 1)
    metrics.kv_event_lag("sim-0", 0.003)
    metrics.kv_event_gap("sim-0", 2)
    metrics.kv_event_replay("sim-0", "ok")
    metrics.kv_event_replay("sim-1", "failed")
    metrics.kv_stream_reset("sim-1", "gap")
    metrics.kv_event_decode_error("sim-1")

    _compare("after_events.txt", _stable(metrics.render()))


def test_exposition_never_uses_the_vllm_namespace() -> None:
    text = (GOLDEN / "after_events.txt").read_text()
    names = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }
    assert names and all(name.startswith("burstsched_") for name in names)
