"""The in-process OTLP/HTTP receiver, served by uvicorn on 127.0.0.1 for the duration of a test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from burstsched.server.serve import serving
from burstsched.telemetry.receiver import TraceReceiver


@dataclass(frozen=True)
class ServedReceiver:
    receiver: TraceReceiver
    url: str

    @property
    def traces_url(self) -> str:
        return f"{self.url}/v1/traces"


@asynccontextmanager
async def served_receiver() -> AsyncIterator[ServedReceiver]:
    receiver = TraceReceiver()
    async with serving(receiver.app) as url:
        yield ServedReceiver(receiver, url)
