"""Routing targets a workload is run against: a router reached at one URL, or client-side random routing.

A target is named on the command line as ``kind[:option]`` (``burstsched:config/default.yaml``,
``random``, ``sglang:cache_aware``, ``vllm-router:cache_aware``). Opening a target in front of a pool's
endpoints yields a :data:`Route`, which says where each request goes; a router target starts its router
(a child process) on open and stops it on close. Which kinds exist is the caller's business: this module
knows burstsched and client-side random; peer routers come in as :class:`RouterTarget` built elsewhere.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from burstsched.workloads.router_process import router_process

Endpoints = Sequence[tuple[str, str]]
"""(name, base URL) of each replica."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Where one request goes, and the replica it lands on when the client itself chose it."""

    base_url: str
    replica: str | None = None


Route = Callable[[int], Dispatch]
"""Request index → where to send it."""


class Target(Protocol):
    """Something requests can be routed through."""

    @property
    def label(self) -> str: ...

    def open(self, endpoints: Endpoints) -> AbstractAsyncContextManager[Route]: ...


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A target as named on the command line."""

    kind: str
    option: str | None = None

    @property
    def label(self) -> str:
        if self.option is None:
            return self.kind
        option = Path(self.option).stem if self.kind == "burstsched" else self.option
        return f"{self.kind}:{option}"


def parse_targets(text: str) -> list[TargetSpec]:
    """``"burstsched:config/default.yaml,random"`` → specs, in order; duplicates and blanks refused."""
    specs: list[TargetSpec] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise ValueError(f"empty target in {text!r}")
        kind, _, option = item.partition(":")
        spec = TargetSpec(kind.strip(), option.strip() or None)
        if spec in specs:
            raise ValueError(f"target {item!r} given twice")
        specs.append(spec)
    return specs


RouterStarter = Callable[[Endpoints], AbstractAsyncContextManager[str]]
"""Starts a router in front of the endpoints; yields its base URL; stops it on exit."""


@dataclass(frozen=True, slots=True)
class RouterTarget:
    """A router reached at one URL: every request goes there and the router picks the replica."""

    label: str
    start: RouterStarter

    @asynccontextmanager
    async def open(self, endpoints: Endpoints) -> AsyncIterator[Route]:
        async with self.start(endpoints) as url:
            dispatch = Dispatch(url)
            yield lambda _index: dispatch


@dataclass(frozen=True, slots=True)
class ClientRandomTarget:
    """Client-side random routing: each request straight to a replica drawn by a seeded RNG."""

    seed: int = 0
    label: str = "random"

    @asynccontextmanager
    async def open(self, endpoints: Endpoints) -> AsyncIterator[Route]:
        if not endpoints:
            raise ValueError("random routing needs at least one endpoint")
        choices = [Dispatch(url, name) for name, url in endpoints]
        seed = self.seed

        def route(index: int) -> Dispatch:
            return random.Random(f"random-route:{seed}:{index}").choice(choices)

        yield route


def burstsched_target(config: Path, label: str | None = None, extra_args: Sequence[str] = ()) -> RouterTarget:
    """burstsched (``burstsched serve --config CONFIG``) as a child process in front of the endpoints;
    ``extra_args`` go on its command line (e.g. the pool's ``--kv-events`` and ``--tokenizer``)."""
    return RouterTarget(
        label or f"burstsched:{config.stem}", partial(router_process, config, extra_args=tuple(extra_args))
    )
