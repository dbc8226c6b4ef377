"""Late burst members: a request of a group placed in an earlier window joins that group's endpoint while the
prefix index does not know where the group went yet (before the replica's response head)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given
from hypothesis import strategies as st

from burstsched.admission import Admission, AdmissionConfig, Admitted, ManualClock, Role
from burstsched.admission.placed_groups import PlacedGroups
from burstsched.config import parse_config_text
from burstsched.framework import ApiKind, EndpointSnapshot, PluginContext, PluginRegistry, SchedRequest
from burstsched.scheduling import Scheduler, build_scheduler

WINDOW_S = 0.01
REGISTRY = PluginRegistry.discover()
CONTEXT = tuple(range(1, 13))


def endpoint(name: str, **fields: object) -> EndpointSnapshot:
    return EndpointSnapshot(name, f"http://{name}", metrics_age=0.0, **fields)  # type: ignore[arg-type]


def chain_of(*blocks: int) -> tuple[int, ...]:
    return tuple(hash(("chain", *blocks[: i + 1])) & 0xFFFFFFFFFFFFFFFF for i in range(len(blocks)))


def request(request_id: str, *blocks: int) -> SchedRequest:
    return SchedRequest(request_id=request_id, model="m", api=ApiKind.CHAT, block_hashes=chain_of(*blocks))


def scheduler() -> Scheduler:
    return build_scheduler(parse_config_text(""), REGISTRY, PluginContext(rng=random.Random(0)))


async def settle() -> None:
    for _ in range(50):
        await anyio.lowlevel.checkpoint()


class Harness:
    """An :class:`Admission` on a manual clock over a fixed pool; requests admitted one window at a time."""

    def __init__(self, admission: Admission, clock: ManualClock) -> None:
        self.admission = admission
        self.clock = clock

    async def window(self, requests: Sequence[SchedRequest]) -> list[Admitted]:
        """Admit ``requests`` together; advance the clock past the window if any of them waits in one."""
        results: dict[str, Admitted] = {}
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:

                async def admit(r: SchedRequest) -> None:
                    results[r.request_id] = await self.admission.admit(r)

                for r in requests:
                    tg.start_soon(admit, r)
                await settle()
                if len(results) < len(requests):
                    self.clock.advance(WINDOW_S)
        return [results[r.request_id] for r in requests]


async def run(
    pool: list[EndpointSnapshot], sched: Scheduler, steps: object, **config: object
) -> list[list[Admitted]]:
    """Run ``steps`` (an async callable taking the harness) and return what it returns."""
    clock = ManualClock()
    settings = AdmissionConfig(window_ms=WINDOW_S * 1000, min_shared_blocks=4, **config)  # type: ignore[arg-type]
    async with Admission(settings, sched, lambda model: pool, clock=clock) as admission:
        result: list[list[Admitted]] = await steps(Harness(admission, clock))  # type: ignore[operator]
    return result


def burst(tag: str, count: int, context: tuple[int, ...] = CONTEXT) -> list[SchedRequest]:
    return [request(f"{tag}{i}", *context, 1000 + i) for i in range(count)]


@pytest.mark.anyio
async def test_a_late_member_joins_the_endpoint_its_group_went_to_before_the_index_knows() -> None:
    """Four members placed on one endpoint in a window; the other four arrive after it sealed and before any
    dispatch reached the index. Old behaviour: cold, placed by load on the other endpoint (computing the
    prefix again). Now: joined, on the group's endpoint, with the shared blocks for the prefill ledger."""
    pool = [endpoint("e1"), endpoint("e2")]
    sched = scheduler()

    async def steps(h: Harness) -> list[list[Admitted]]:
        first = await h.window(burst("a", 4))
        late = [await h.window([r]) for r in burst("b", 4)]
        return [first, [a for (a,) in late]]

    first, late = await run(pool, sched, steps)
    target = first[0].endpoint.name
    assert {a.endpoint.name for a in first} == {target}
    assert [a.role for a in late] == [Role.JOINED] * 4
    assert {a.endpoint.name for a in late} == {target}
    assert {a.group_id for a in late} == {first[0].group_id}
    assert all(a.shared_blocks == len(CONTEXT) for a in late)
    assert [a.group_size for a in late] == [5, 6, 7, 8]
    assert all(a.waited_s == 0 for a in late)  # no window: sent at once


@pytest.mark.anyio
async def test_without_the_memory_late_members_split_the_burst() -> None:
    """The same arrivals with ``late_members_ms: 0``: the late members are a new cold group, placed by load
    away from the endpoint the first four went to (what this change fixes)."""
    pool = [endpoint("e1"), endpoint("e2")]
    sched = scheduler()

    async def steps(h: Harness) -> list[list[Admitted]]:
        first = await h.window(burst("a", 4))
        pool[:] = [
            endpoint(e.name, in_flight=4 if e.name == first[0].endpoint.name else 0) for e in pool
        ]  # the first four in flight there, as the pool counts them
        return [first, await h.window(burst("b", 4))]

    first, late = await run(pool, sched, steps, late_members_ms=0)
    assert {a.endpoint.name for a in late} != {first[0].endpoint.name}


@pytest.mark.anyio
@pytest.mark.parametrize("why", ["saturated", "unhealthy", "expired", "full", "warmer elsewhere", "other"])
async def test_a_late_member_does_not_join_when_it_should_not(why: str) -> None:
    """No join: the group's endpoint saturated (16 waiting) or unhealthy, the memory expired, the group at
    max_per_endpoint, another endpoint holding more of the prompt than the group shares (the index
    decides), or a request of another prefix."""
    pool = [endpoint("e1"), endpoint("e2")]
    sched = scheduler()

    async def steps(h: Harness) -> list[list[Admitted]]:
        first = await h.window(burst("a", 4))
        target = first[0].endpoint.name
        other = next(e for e in pool if e.name != target)
        if why == "saturated":
            pool[:] = [endpoint(e.name, waiting=16 if e.name == target else 0) for e in pool]
        elif why == "unhealthy":
            pool[:] = [endpoint(e.name, healthy=e.name != target) for e in pool]
        elif why == "expired":
            h.clock.advance(2.0)
        elif why == "warmer elsewhere":
            sched.on_dispatch(request("older", *CONTEXT, 1000), other)
        late = request("late", *CONTEXT, 2000) if why != "other" else request("late", *range(50, 62))
        return [first, await h.window([late])]

    _, (late,) = await run(pool, sched, steps, max_per_endpoint=4 if why == "full" else 32)
    assert late.role is not Role.JOINED
    if why == "warmer elsewhere":
        assert late.role is Role.BYPASS  # warm on the other endpoint: the index's own bypass


@pytest.mark.anyio
async def test_reset_forgets_the_placed_groups() -> None:
    pool = [endpoint("e1"), endpoint("e2")]
    sched = scheduler()

    async def steps(h: Harness) -> list[list[Admitted]]:
        first = await h.window(burst("a", 2))
        h.admission.reset()
        return [first, await h.window(burst("b", 1))]

    _, (late,) = await run(pool, sched, steps)
    assert late.role is Role.LEADER


def test_placed_groups_find_the_longest_shared_prefix_and_expire() -> None:
    groups = PlacedGroups(min_shared_blocks=4, hold_s=1.0)
    prefix = chain_of(*CONTEXT)
    groups.record("1.0", prefix, "e1", 3, now=0.0)
    assert groups.find(chain_of(*CONTEXT, 7), now=0.5) is not None
    found = groups.find(chain_of(*CONTEXT[:6], 99, 98), now=0.5)
    assert found is not None and found[1] == 6 and found[0].endpoint == "e1"
    assert groups.find(chain_of(*CONTEXT[:3], 99, 98), now=0.5) is None  # differs before block 4
    assert groups.find(chain_of(*CONTEXT), now=1.0) is None  # expired
    assert len(groups) == 0
    short = PlacedGroups(min_shared_blocks=4, hold_s=1.0)
    short.record("1.1", prefix[:3], "e1", 1, now=0.0)  # too short to be a group
    assert len(short) == 0
    off = PlacedGroups(min_shared_blocks=4, hold_s=0.0)
    off.record("1.2", prefix, "e1", 1, now=0.0)
    assert not off.enabled and len(off) == 0


def test_placed_groups_sweep_keeps_the_table_bounded() -> None:
    groups = PlacedGroups(min_shared_blocks=1, hold_s=1.0)
    for i in range(10_000):
        groups.record(str(i), chain_of(i), "e1", 1, now=i * 0.01)
    assert len(groups) <= 2 * 101  # only the last second's groups, give or take one sweep


@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=20),
    st.lists(st.integers(0, 3), min_size=0, max_size=20),
)
def test_shared_with_is_the_common_leading_run(a: list[int], b: list[int]) -> None:
    groups = PlacedGroups(min_shared_blocks=1, hold_s=1.0)
    groups.record("g", chain_of(*a), "e1", 1, now=0.0)
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    found = groups.find(chain_of(*b), now=0.0)
    if common == 0:
        assert found is None
    else:
        assert found is not None and found[1] == common


@pytest.mark.anyio
async def test_a_member_whose_window_opened_before_its_group_was_placed_joins_at_its_own_placement() -> None:
    """Seen on real vLLM in precise mode (the router tokenizes before admission, so members trickle in): a
    member arrives after its group's window sealed but before that window's placement ran, and opens a
    window of its own. When that window is placed, the group's placement is known: the member joins it
    instead of being placed alone by load (on the other endpoint)."""
    pool = [endpoint("e1"), endpoint("e2")]
    sched = scheduler()
    clock = ManualClock()
    settings = AdmissionConfig(window_ms=WINDOW_S * 1000, min_shared_blocks=4)
    results: dict[str, Admitted] = {}
    first_member, second_member = burst("a", 2)
    async with Admission(settings, sched, lambda model: pool, clock=clock) as admission:

        async def admit(r: SchedRequest) -> None:
            results[r.request_id] = await admission.admit(r)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(admit, first_member)
                await settle()
                clock.advance(WINDOW_S)  # the first window seals; its placement is started, not run yet
                tg.start_soon(admit, second_member)
                await settle()
                clock.advance(WINDOW_S)
    first, second = results["a0"], results["a1"]
    assert first.role is Role.LEADER
    assert second.role is Role.JOINED and second.waited_s >= WINDOW_S  # placed at its own window's end
    assert second.window_id != first.window_id and second.group_id == first.group_id
    assert second.endpoint.name == first.endpoint.name
