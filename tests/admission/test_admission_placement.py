"""Group placement on the real scheduler core with the default plugins, and the Admission facade."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from collections.abc import Sequence

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from burstsched.admission import (
    Admission,
    AdmissionConfig,
    AdmissionQueueFull,
    Admitted,
    GroupPlacer,
    Limits,
    ManualClock,
    NoEndpointAvailable,
    Role,
    group_cap,
)
from burstsched.config import RouterConfig
from burstsched.framework import ApiKind, EndpointSnapshot, PluginContext, PluginRegistry, SchedRequest
from burstsched.scheduling import Scheduler, build_scheduler

MODEL = "m"


def scheduler(seed: int = 0, *, saturation: bool = True) -> Scheduler:
    """The scheduler the router builds from its default configuration (optionally without the
    saturation filter, which makes loaded endpoints ineligible and so changes what "room" means)."""
    config = RouterConfig()
    if not saturation:
        refs = [r for r in config.profile.plugins if r.plugin_ref != "saturation-filter"]
        config = config.model_copy(update={"profile": config.profile.model_copy(update={"plugins": refs})})
    return build_scheduler(config, PluginRegistry.discover(), PluginContext(rng=random.Random(seed)))


def endpoint(name: str, *, waiting: int = 0, running: int = 0, kv_usage: float = 0.0) -> EndpointSnapshot:
    return EndpointSnapshot(
        name=name,
        url=f"http://127.0.0.1/{name}",
        metrics_age=0.0,
        waiting=waiting,
        running=running,
        kv_usage=kv_usage,
    )


def request(request_id: str, *blocks: int, model: str = MODEL) -> SchedRequest:
    chain = tuple(hash(("chain", *blocks[: i + 1])) & 0xFFFFFFFFFFFFFFFF for i in range(len(blocks)))
    return SchedRequest(request_id=request_id, model=model, api=ApiKind.CHAT, block_hashes=chain)


def burst(name: str, prefix: Sequence[int], size: int) -> list[SchedRequest]:
    return [request(f"{name}{i}", *prefix, 1000 + i) for i in range(size)]


def placer(sched: Scheduler, pool: Sequence[EndpointSnapshot], limits: Limits | None = None) -> GroupPlacer:
    return GroupPlacer(sched, lambda model: pool, min_shared_blocks=4, limits=limits or Limits(32, 2.0))


def tickets(requests: Sequence[SchedRequest]) -> list[tuple[str, SchedRequest]]:
    return [(r.request_id, r) for r in requests]


PREFIX_A = tuple(range(1, 9))
PREFIX_B = tuple(range(101, 109))


def test_a_cold_burst_goes_to_one_endpoint() -> None:
    pool = [endpoint("e1"), endpoint("e2"), endpoint("e3")]
    placed = placer(scheduler(), pool).place(tickets(burst("a", PREFIX_A, 8)))
    assert len({p.decision.endpoint.name for p in placed.values()}) == 1
    assert Counter(p.role for p in placed.values()) == {Role.LEADER: 1, Role.MEMBER: 7}
    assert {(p.group, p.group_size, p.shared_blocks) for p in placed.values()} == {(0, 8, 8)}


def test_a_warm_group_goes_to_its_replica_unless_saturated() -> None:
    sched = scheduler()
    sched.on_dispatch(request("earlier", *PREFIX_A, 7), endpoint("e2"))
    idle = [endpoint("e1"), endpoint("e2"), endpoint("e3")]
    placed = placer(sched, idle).place(tickets(burst("a", PREFIX_A, 4)))
    assert {p.decision.endpoint.name for p in placed.values()} == {"e2"}

    saturated = [endpoint("e1"), endpoint("e2", waiting=40, kv_usage=0.99), endpoint("e3")]
    placed = placer(sched, saturated).place(tickets(burst("a", PREFIX_A, 4)))
    (target,) = {p.decision.endpoint.name for p in placed.values()}
    assert target != "e2"


def test_a_cold_group_goes_to_the_least_loaded_endpoint() -> None:
    pool = [
        endpoint("e1", waiting=5, running=8),
        endpoint("e2", waiting=0, running=2),
        endpoint("e3", waiting=9),
    ]
    placed = placer(scheduler(), pool).place(tickets(burst("a", PREFIX_A, 3)))
    assert {p.decision.endpoint.name for p in placed.values()} == {"e2"}


def test_distinct_groups_of_a_window_spread_over_the_pool() -> None:
    pool = [endpoint(f"e{i}") for i in range(4)]
    requests = [r for g in range(4) for r in burst(f"g{g}.", tuple(range(g * 100, g * 100 + 6)), 3)]
    placed = placer(scheduler(), pool).place(tickets(requests))
    by_group: dict[int, set[str]] = {}
    for p in placed.values():
        by_group.setdefault(p.group, set()).add(p.decision.endpoint.name)
    assert all(len(names) == 1 for names in by_group.values())
    assert len({next(iter(names)) for names in by_group.values()}) == 4


def test_a_hot_group_spills_and_each_decision_leads_with_its_endpoint() -> None:
    pool = [endpoint("e1"), endpoint("e2"), endpoint("e3")]
    placed = placer(scheduler(), pool, Limits(max_per_endpoint=4)).place(tickets(burst("a", PREFIX_A, 10)))
    assert sorted(Counter(p.decision.endpoint.name for p in placed.values()).values()) == [2, 4, 4]
    assert Counter(p.role for p in placed.values()) == {Role.LEADER: 1, Role.MEMBER: 3, Role.SPILL: 6}
    for p in placed.values():
        assert sorted(s.name for s in p.decision.ranked) == ["e1", "e2", "e3"]


def test_requests_of_different_models_are_placed_on_their_own_endpoints() -> None:
    pools = {"m1": [endpoint("a1"), endpoint("a2")], "m2": [endpoint("b1")]}
    sched = scheduler()
    gp = GroupPlacer(sched, lambda model: pools[model], min_shared_blocks=4, limits=Limits(8))
    requests = [request("x", *PREFIX_A, model="m1"), request("y", *PREFIX_A, model="m2")]
    placed = gp.place(tickets(requests))
    assert placed["x"].decision.endpoint.name in {"a1", "a2"}
    assert placed["y"].decision.endpoint.name == "b1"
    assert placed["x"].group != placed["y"].group
    with pytest.raises(NoEndpointAvailable):
        GroupPlacer(sched, lambda model: [], min_shared_blocks=4, limits=Limits(8)).place(tickets(requests))


snapshots = st.builds(
    lambda i, waiting, running, kv, in_flight, stale: EndpointSnapshot(
        name=f"e{i}",
        url="http://127.0.0.1",
        waiting=waiting,
        running=running,
        kv_usage=kv,
        in_flight=in_flight,
        stale=stale,
    ),
    st.integers(0, 0),
    st.integers(0, 300),
    st.integers(0, 300),
    st.floats(0.0, 1.0),
    st.integers(0, 300),
    st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(
    pool=st.lists(snapshots, min_size=1, max_size=5).map(
        lambda es: [dataclasses.replace(e, name=f"e{i}") for i, e in enumerate(es)]
    ),
    chains=st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=7), min_size=1, max_size=20),
    max_per_endpoint=st.integers(1, 8),
    warm=st.lists(st.tuples(st.integers(0, 4), st.lists(st.integers(0, 2), max_size=7)), max_size=4),
)
def test_placement_properties(
    pool: list[EndpointSnapshot],
    chains: list[list[int]],
    max_per_endpoint: int,
    warm: list[tuple[int, list[int]]],
) -> None:
    sched = scheduler(saturation=False)  # the caps alone; the saturation filter has its own tests
    for index, blocks in warm:
        sched.on_dispatch(request("warm", *blocks), pool[index % len(pool)])
    requests = [request(f"r{i}", *blocks) for i, blocks in enumerate(chains)]
    limits = Limits(max_per_endpoint, 1.5)
    placed = placer(sched, pool, limits).place(tickets(requests))
    assert sorted(placed) == sorted(r.request_id for r in requests)
    names = {e.name for e in pool}
    for p in placed.values():
        assert {s.name for s in p.decision.ranked} <= names
        for scored in p.decision.ranked:
            assert all(0.0 <= value <= 1.0 for value in scored.scores.values())
    groups: dict[int, Counter[str]] = {}
    for p in placed.values():
        groups.setdefault(p.group, Counter())[p.decision.endpoint.name] += 1
    shared = [sum(counts.values()) for counts in groups.values() if sum(counts.values()) > 1]
    cap = group_cap(sum(shared), len(pool), len(shared), limits)
    for group, counts in groups.items():
        size = sum(counts.values())
        assert {p.group_size for p in placed.values() if p.group == group} == {size}
        # Kept together unless it spills; never past the cap while another endpoint has room.
        assert len(counts) == min(len(pool), math.ceil(size / cap))
        if max(counts.values()) > cap:
            assert all(counts[name] >= cap for name in names)


# The facade, on a manual clock.

WINDOW_MS = 10.0


def config(**overrides: object) -> AdmissionConfig:
    return AdmissionConfig.model_validate({"window_ms": WINDOW_MS, "min_shared_blocks": 4, **overrides})


async def settle() -> None:
    for _ in range(50):
        await anyio.lowlevel.checkpoint()


@pytest.mark.anyio
async def test_admit_places_a_burst_together_after_the_window() -> None:
    clock, pool = ManualClock(), [endpoint("e1"), endpoint("e2")]
    results: dict[str, Admitted] = {}
    async with Admission(config(), scheduler(), lambda model: pool, clock=clock) as admission:

        async def admit(r: SchedRequest) -> None:
            results[r.request_id] = await admission.admit(r)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                for r in burst("a", PREFIX_A, 4) + burst("b", PREFIX_B, 2):
                    tg.start_soon(admit, r)
                await settle()
                assert results == {} and admission.held == 6
                clock.advance(WINDOW_MS / 1000)
    a = [results[f"a{i}"] for i in range(4)]
    b = [results[f"b{i}"] for i in range(2)]
    assert len({x.endpoint.name for x in a}) == 1 and len({x.endpoint.name for x in b}) == 1
    assert a[0].endpoint.name != b[0].endpoint.name
    assert {x.window_id for x in a + b} == {1}
    assert len({x.group_id for x in a}) == 1 and a[0].group_id != b[0].group_id
    assert sorted(x.role for x in a) == sorted([Role.LEADER, Role.MEMBER, Role.MEMBER, Role.MEMBER])
    assert [x.waited_s for x in a + b] == [pytest.approx(WINDOW_MS / 1000)] * 6


@pytest.mark.anyio
async def test_warm_and_short_requests_bypass_the_window() -> None:
    clock, pool = ManualClock(), [endpoint("e1"), endpoint("e2")]
    sched = scheduler()
    sched.on_dispatch(request("earlier", *PREFIX_A), pool[1])
    async with Admission(config(), sched, lambda model: pool, clock=clock) as admission:
        with anyio.fail_after(5):
            warm = await admission.admit(request("warm", *PREFIX_A, 5))
            short = await admission.admit(request("short", 1, 2, 3))
    assert (warm.role, warm.endpoint.name, warm.group_id, warm.waited_s) == (Role.BYPASS, "e2", None, 0.0)
    assert short.role is Role.BYPASS


@pytest.mark.anyio
async def test_a_warm_request_on_a_saturated_replica_waits_in_the_window() -> None:
    clock = ManualClock()
    pool = [endpoint("e1"), endpoint("e2", waiting=50)]  # saturated: 50 >= saturation.max_waiting 16
    sched = scheduler()
    sched.on_dispatch(request("earlier", *PREFIX_A), pool[1])
    results: list[Admitted] = []
    async with Admission(config(), sched, lambda model: pool, clock=clock) as admission:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:

                async def admit() -> None:
                    results.append(await admission.admit(request("warm", *PREFIX_A, 5)))

                tg.start_soon(admit)
                await settle()
                assert results == []
                clock.advance(WINDOW_MS / 1000)
    assert results[0].role is Role.LEADER and results[0].window_id == 1


@pytest.mark.anyio
async def test_admission_off_schedules_each_request_alone() -> None:
    pool = [endpoint("e1")]
    async with Admission(config(enabled=False), scheduler(), lambda model: pool, clock=ManualClock()) as adm:
        admitted = await adm.admit(request("x", *PREFIX_A))
    assert (admitted.window_id, admitted.role, admitted.endpoint.name) == (None, Role.BYPASS, "e1")


@pytest.mark.anyio
async def test_admit_raises_queue_full_and_no_endpoint() -> None:
    clock = ManualClock()
    pool: list[EndpointSnapshot] = []
    errors: list[Exception] = []
    async with Admission(config(queue_limit=1), scheduler(), lambda model: pool, clock=clock) as admission:

        async def admit(r: SchedRequest) -> None:
            try:
                await admission.admit(r)
            except (AdmissionQueueFull, NoEndpointAvailable) as error:
                errors.append(error)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(admit, request("first", *PREFIX_A))
                await settle()
                tg.start_soon(admit, request("second", *PREFIX_B))
                await settle()
                clock.advance(WINDOW_MS / 1000)
    assert [type(e) for e in errors] == [AdmissionQueueFull, NoEndpointAvailable]
    assert isinstance(errors[0], AdmissionQueueFull) and errors[0].retry_after_s == 1


def test_config_is_strict_and_documented() -> None:
    assert AdmissionConfig().window_ms <= 20
    with pytest.raises(ValueError, match="extra"):
        AdmissionConfig.model_validate({"window": 5})
    with pytest.raises(ValueError):
        AdmissionConfig.model_validate({"window_ms": 0})
    with pytest.raises(ValueError):
        AdmissionConfig.model_validate({"fair_share_factor": 0.5})
    assert AdmissionConfig.model_validate({"fair_share_factor": None}).fair_share_factor is None
    assert all(field.description for field in AdmissionConfig.model_fields.values())


@pytest.mark.anyio
async def test_admission_on_the_event_loop_clock() -> None:
    """Real timers: a full window seals by count, a lone request by its timer; counts only, no durations."""
    pool = [endpoint("e1"), endpoint("e2")]
    results: list[Admitted] = []

    async def admit(admission: Admission, r: SchedRequest) -> None:
        results.append(await admission.admit(r))

    with anyio.fail_after(10):
        # A long window that only the count can seal in time, so a slow machine cannot split the burst.
        async with Admission(
            config(window_ms=1000.0, max_batch=8), scheduler(), lambda model: pool
        ) as admission:
            async with anyio.create_task_group() as tg:
                for r in burst("a", PREFIX_A, 8):
                    tg.start_soon(admit, admission, r)
        async with Admission(config(window_ms=5.0), scheduler(), lambda model: pool) as admission:
            await admit(admission, request("lone", *PREFIX_B))
    assert len(results) == 9
    assert len({x.endpoint.name for x in results[:8]}) == 1
    assert {x.window_id for x in results[:8]} == {1}
    assert results[8].role is Role.LEADER and results[8].group_size == 1
