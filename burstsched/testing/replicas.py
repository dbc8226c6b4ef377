"""Replicas for tests of the router: simulated vLLM replicas that record what they receive, and the one fake
for what no vLLM does.

Router tests run against the simulator (:mod:`burstsched.sim`): real uvicorn servers on 127.0.0.1 speaking
vLLM's API, whose failures come from its fault injection (``Faults``: 5xx, stalls before the first byte,
connections cut after N events, a dead ``/metrics``) and ``kill``; each replica records the inference
requests it receives (``SimPool(record_requests=True)``), so a test sees the headers and retries the router
sent. :class:`Replica` is one of them as a test addresses it::

    async with sim_replicas(2) as (a, b):
        await a.fail_with(503)
        ...  # a router in front of a.url, b.url
        assert len(a.requests) == 1 and b.headers_seen[-1]["x-request-id"] == "r-1"

:class:`GatedReplica` is the exception: its streams hold after their first chunk until the test opens the
gate, which is how a test proves the router forwards a stream chunk by chunk rather than buffered. No vLLM
waits on its client's say-so, so it is a minimal fake, not the simulator.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from burstsched.server.serve import serving
from burstsched.sim import Faults, RecordedRequest, SimConfig, SimPool

MODEL = "fake-model"
"""The model the test replicas serve."""

QUICK = SimConfig(served_model_name=MODEL, time_scale=0.02)
"""Replicas 50 times quicker than vLLM's pace: an answer of 64 tokens (no ``max_tokens``) in ~15 ms."""

LONG_ANSWER = 15_000
"""A ``max_tokens`` that keeps a :data:`QUICK` replica generating for seconds (at least 0.2 ms a token): a
stream that is still running when a test's deadline, drain or disconnect ends it."""


@dataclass(frozen=True)
class Replica:
    """One simulated replica of a pool, as a test addresses it."""

    pool: SimPool
    index: int

    @property
    def name(self) -> str:
        return self.pool.names[self.index]

    @property
    def url(self) -> str:
        return self.pool.urls[self.index]

    @property
    def requests(self) -> list[RecordedRequest]:
        """The inference requests received so far, in order (recorded on arrival, before any fault)."""
        return self.pool.requests(self.index)

    @property
    def headers_seen(self) -> list[dict[str, str]]:
        return [r.headers for r in self.requests]

    @property
    def paths_seen(self) -> list[str]:
        return [r.path for r in self.requests]

    async def set_faults(self, faults: Faults) -> None:
        await self.pool.aset_faults(self.index, faults)

    async def fail_with(self, status: int) -> None:
        """Answer every inference request with ``status`` (an OpenAI error body) until faults change."""
        await self.set_faults(Faults(error_rate=1.0, error_status=status))

    async def kill(self) -> None:
        """Stop abruptly, like SIGKILL: connections refused, open ones reset."""
        await self.pool.akill(self.index)

    async def metrics(self) -> dict[str, float]:
        """The replica's ``/metrics``: each sample name's total over its labels."""
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(f"{self.url}/metrics")
        response.raise_for_status()
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals


@asynccontextmanager
async def sim_replicas(count: int, config: SimConfig = QUICK) -> AsyncIterator[list[Replica]]:
    """``count`` simulated replicas named ``sim-0``, ``sim-1``…, recording what they receive."""
    async with SimPool(count, config, record_requests=True) as pool:
        yield [Replica(pool, i) for i in range(count)]


@dataclass
class GatedReplica:
    """A chat replica whose streams send their first chunk, then wait for :attr:`gate`, then the rest."""

    name: str
    gate: anyio.Event = field(default_factory=anyio.Event)
    chunks: int = 3
    url: str = ""

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health),
                Route("/v1/models", self._models),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
            ]
        )

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _models(self, request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "vllm"}]}
        )

    async def _chat(self, request: Request) -> Response:
        await request.body()
        return StreamingResponse(self._events(), media_type="text/event-stream")

    async def _events(self) -> AsyncIterator[bytes]:
        for i in range(self.chunks):
            choice = {"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}
            chunk = {
                "id": "chatcmpl-gated",
                "object": "chat.completion.chunk",
                "model": MODEL,
                "choices": [choice],
            }
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            if i == 0:
                await self.gate.wait()
        yield b"data: [DONE]\n\n"


@asynccontextmanager
async def gated_replica(name: str = "gated") -> AsyncIterator[GatedReplica]:
    """A :class:`GatedReplica` on its own uvicorn server on 127.0.0.1 (in the caller's event loop)."""
    replica = GatedReplica(name)
    async with serving(replica.app()) as url:
        replica.url = url
        yield replica
