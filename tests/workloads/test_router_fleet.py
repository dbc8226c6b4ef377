"""Several routers as one workload target: all started, requests round-robin, all stopped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from burstsched.workloads.router_fleet import RouterFleetTarget, burstsched_fleet_target
from burstsched.workloads.targets import Endpoints, RouterStarter

ENDPOINTS = [("a", "http://127.0.0.1:1"), ("b", "http://127.0.0.1:2")]


class FakeRouters:
    """Starters that record which routers are running and what endpoints each was given."""

    def __init__(self) -> None:
        self.running: list[str] = []
        self.given: list[Endpoints] = []

    def starter(self, url: str) -> RouterStarter:
        @asynccontextmanager
        async def start(endpoints: Endpoints) -> AsyncIterator[str]:
            self.running.append(url)
            self.given.append(endpoints)
            try:
                yield url
            finally:
                self.running.remove(url)

        def call(endpoints: Endpoints) -> AbstractAsyncContextManager[str]:
            return start(endpoints)

        return call


@pytest.mark.anyio
async def test_requests_go_round_robin_over_routers_all_started_and_stopped() -> None:
    fake = FakeRouters()
    target = RouterFleetTarget("fleet", [fake.starter("http://r0"), fake.starter("http://r1")])
    async with target.open(ENDPOINTS) as route:
        assert fake.running == ["http://r0", "http://r1"]
        assert fake.given == [ENDPOINTS, ENDPOINTS]
        assert [route(i).base_url for i in range(5)] == ["http://r0", "http://r1"] * 2 + ["http://r0"]
        assert route(3).replica is None  # the router picks the replica
    assert fake.running == []


def test_a_burstsched_fleet_is_labelled_with_its_size() -> None:
    target = burstsched_fleet_target(Path("config/rendezvous.yaml"), 2)
    assert target.label == "burstsched:rendezvous x2"
    assert len(target.starters) == 2
    with pytest.raises(ValueError, match="at least one"):
        burstsched_fleet_target(Path("config/rendezvous.yaml"), 0)
