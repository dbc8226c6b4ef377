"""Several routers over the same replicas: ``count`` ``burstsched serve`` processes, clients round-robin.

Each router is its own process with its own state (prefix index, picker memory, in-flight counts), as
several router replicas behind a plain load balancer would be; nothing passes between them. A workload
reaches them through :class:`RouterFleetTarget` (request ``i`` goes to router ``i mod count``) or, to pick
the router per request itself, through :func:`router_fleet`'s list of base URLs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from burstsched.workloads.router_process import router_process
from burstsched.workloads.targets import Dispatch, Endpoints, Route, RouterStarter


@asynccontextmanager
async def start_all(starters: Sequence[RouterStarter], endpoints: Endpoints) -> AsyncIterator[list[str]]:
    """Start every router in front of ``endpoints`` (one after the other); yield their base URLs in order;
    stop them all on exit."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(start(endpoints)) for start in starters]


def burstsched_starters(config: Path, count: int, extra_args: Sequence[str] = ()) -> list[RouterStarter]:
    """``count`` independent ``burstsched serve --config CONFIG`` processes (``extra_args`` on each)."""
    if count < 1:
        raise ValueError("a fleet needs at least one router")
    return [partial(router_process, config, extra_args=tuple(extra_args)) for _ in range(count)]


def router_fleet(
    config: Path, endpoints: Endpoints, count: int, extra_args: Sequence[str] = ()
) -> AbstractAsyncContextManager[list[str]]:
    """``count`` burstsched processes over ``endpoints``: an async context yielding their base URLs."""
    return start_all(burstsched_starters(config, count, extra_args), endpoints)


@dataclass(frozen=True, slots=True)
class RouterFleetTarget:
    """A workload target of several routers; request ``i`` goes to router ``i mod len(starters)``."""

    label: str
    starters: Sequence[RouterStarter]

    @asynccontextmanager
    async def open(self, endpoints: Endpoints) -> AsyncIterator[Route]:
        async with start_all(self.starters, endpoints) as urls:
            dispatches = [Dispatch(url) for url in urls]
            yield lambda index: dispatches[index % len(dispatches)]


def burstsched_fleet_target(
    config: Path, count: int, extra_args: Sequence[str] = (), label: str | None = None
) -> RouterFleetTarget:
    """``count`` burstsched routers with ``config``, labelled ``burstsched:<stem> xN``."""
    return RouterFleetTarget(
        label or f"burstsched:{config.stem} x{count}", burstsched_starters(config, count, extra_args)
    )
