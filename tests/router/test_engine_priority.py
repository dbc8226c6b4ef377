"""flow_control.engine_priority end to end: the band reaches a simulated replica that runs vLLM's priority
scheduling policy, one sequence at a time, and decides the replica's own order.

The router's queue is off here, so the order is the replica's alone. A long answer holds the replica; two
requests of a low band (1) arrive, then one of a high band (10) (each seen on the replica before the next is
sent). With the band passed on, the high one finishes before the second low one (and before both when the
long answer still runs as it arrives); without, the replica serves them in arrival order.
"""

from __future__ import annotations

import dataclasses

import anyio
import httpx
import pytest

from burstsched.config import FlowControlConfig
from burstsched.server.serve import running_router
from burstsched.testing.replicas import MODEL, QUICK, Replica, sim_replicas

from .helpers import eventually, router_config

pytestmark = pytest.mark.anyio
ONE_AT_A_TIME = dataclasses.replace(QUICK, max_num_seqs=1, scheduling_policy="priority")


async def _finish_order(engine_priority: bool) -> list[str]:
    flow = FlowControlConfig(
        enabled=False, objectives={"low": 1, "high": 10}, engine_priority=engine_priority
    )
    async with sim_replicas(1, ONE_AT_A_TIME) as replicas:
        replica: Replica = replicas[0]
        config = router_config([(replica.name, replica.url)], flow_control=flow)
        async with (
            running_router(config) as router,
            httpx.AsyncClient(base_url=router.url, timeout=60) as client,
        ):
            finished: list[str] = []

            async def send(name: str, objective: str | None, max_tokens: int) -> None:
                body = {"model": MODEL, "prompt": f"{name} " * 40, "max_tokens": max_tokens}
                headers = {"x-llm-d-inference-objective": objective} if objective else {}
                response = await client.post("/v1/completions", json=body, headers=headers)
                assert response.status_code == 200, response.text
                finished.append(name)

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for seen, (name, objective, tokens) in enumerate(
                        [("long", None, 2000), ("low-1", "low", 8), ("low-2", "low", 8), ("high", "high", 8)],
                        1,
                    ):
                        tg.start_soon(send, name, objective, tokens)

                        async def arrived(count: int = seen) -> bool:
                            return len(replica.requests) >= count

                        await eventually(arrived)
            return finished


async def test_the_band_orders_the_replicas_queue_when_passed_on() -> None:
    with_band = await _finish_order(engine_priority=True)
    assert with_band.index("high") < with_band.index("low-2"), with_band
    assert await _finish_order(engine_priority=False) == ["long", "low-1", "low-2", "high"]
