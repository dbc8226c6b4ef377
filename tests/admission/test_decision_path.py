"""One decision path: one definition of "saturated", admission on the scheduler's contract, the producers run
once per request (warm or cold)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import anyio
import anyio.lowlevel
import pytest

from burstsched.admission import Admission, AdmissionConfig, Admitted, ManualClock, Role
from burstsched.config import ConfigError, RouterConfig, parse_config_text
from burstsched.framework import (
    ApiKind,
    CycleState,
    Decision,
    EndpointSnapshot,
    PluginContext,
    PluginRegistry,
    PrefixMatch,
    SchedRequest,
    ScoredEndpoint,
)
from burstsched.scheduling import Decider, PreviousPlugins, Scheduler, build_plugins, build_scheduler

WINDOW_S = 0.01
PREFIX = tuple(range(1, 9))
REGISTRY = PluginRegistry.discover()


def endpoint(name: str, **fields: object) -> EndpointSnapshot:
    return EndpointSnapshot(name, f"http://{name}", metrics_age=0.0, **fields)  # type: ignore[arg-type]


def request(request_id: str, *blocks: int) -> SchedRequest:
    chain = tuple(hash(("chain", *blocks[: i + 1])) & 0xFFFFFFFFFFFFFFFF for i in range(len(blocks)))
    return SchedRequest(request_id=request_id, model="m", api=ApiKind.CHAT, block_hashes=chain)


def scheduler(yaml_text: str = "", *, observer: Counter[str] | None = None) -> Scheduler:
    config = parse_config_text(yaml_text + "\nmetrics: {timing_every: 1}\n")  # every call observed

    def observe(point: str, name: str, seconds: float) -> None:
        if observer is not None:
            observer[point] += 1

    return build_scheduler(config, REGISTRY, PluginContext(rng=random.Random(0)), observer=observe)


async def settle() -> None:
    for _ in range(50):
        await anyio.lowlevel.checkpoint()


async def admit_one(
    decider: Decider,
    pool: Sequence[EndpointSnapshot],
    r: SchedRequest,
    *,
    during_window: list[SchedRequest] | None = None,
) -> Admitted:
    """Admit ``r``; if it waits in the window, dispatch ``during_window`` (to the pool's last endpoint) before
    the window seals."""
    clock = ManualClock()
    config = AdmissionConfig(window_ms=WINDOW_S * 1000, min_shared_blocks=4)
    results: list[Admitted] = []
    async with Admission(config, decider, lambda model: pool, clock=clock) as admission:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:

                async def admit() -> None:
                    results.append(await admission.admit(r))

                tg.start_soon(admit)
                await settle()
                if not results:
                    for other in during_window or ():
                        assert isinstance(decider, Scheduler)
                        decider.on_dispatch(other, pool[-1])
                    clock.advance(WINDOW_S)
    return results[0]


# 1. Saturation has one definition.


@pytest.mark.anyio
@pytest.mark.parametrize(("waiting", "bypasses"), [(10, True), (15, True), (16, False)])
async def test_a_warm_request_bypasses_exactly_where_the_filter_keeps_the_endpoint(
    waiting: int, bypasses: bool
) -> None:
    """The default config: saturation at 16 waiting, for the filter and the bypass alike (admission had its
    own 8 before: a warm request on an endpoint the filter keeps waited in the window)."""
    sched = scheduler()
    pool = [endpoint("e1"), endpoint("e2", waiting=waiting)]
    sched.on_dispatch(request("earlier", *PREFIX), pool[1])
    assert sched.saturated(pool[1]) is not bypasses
    kept = sched.profile.filters[1].filter(request("x"), pool, CycleState())
    assert ("e2" in [e.name for e in kept]) is bypasses
    admitted = await admit_one(sched, pool, request("warm", *PREFIX, 9))
    assert (admitted.role is Role.BYPASS) is bypasses


SECTION = """
saturation: {max_waiting: 4, max_kv_usage: 0.5, max_in_flight: 3}
"""

LLMD_STYLE = """
plugins:
  - type: approx-prefix-producer
  - type: saturation-filter
    parameters: {max_waiting: 6, max_kv_usage: 0.96}
  - type: prefix-cache-scorer
  - type: max-score-picker
profile:
  plugins:
    - plugin_ref: approx-prefix-producer
    - plugin_ref: saturation-filter
    - plugin_ref: prefix-cache-scorer
  picker: max-score-picker
"""


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("yaml_text", "max_waiting"),
    [(SECTION, 4), (LLMD_STYLE, 6)],
    ids=["saturation-section", "filter-parameters"],
)
async def test_the_configured_definition_is_the_filters_and_admissions(
    yaml_text: str, max_waiting: int
) -> None:
    sched = scheduler(yaml_text)
    (saturation_filter,) = [f for f in sched.profile.filters if f.name == "saturation-filter"]
    for waiting in (max_waiting - 1, max_waiting):
        pool = [endpoint("e1"), endpoint("e2", waiting=waiting)]
        saturated = waiting >= max_waiting
        kept = saturation_filter.filter(request("x"), pool, CycleState())
        assert sched.saturated(pool[1]) is saturated
        assert ("e2" in [e.name for e in kept]) is not saturated
        sched.on_dispatch(request("earlier", *PREFIX), pool[1])
        admitted = await admit_one(sched, pool, request("warm", *PREFIX, waiting))
        assert (admitted.role is Role.BYPASS) is not saturated


def test_stale_endpoints_are_judged_by_the_routers_in_flight_count() -> None:
    sched = scheduler(SECTION)
    assert not sched.saturated(endpoint("e", stale=True, waiting=100, kv_usage=1.0, in_flight=2))
    assert sched.saturated(endpoint("e", stale=True, in_flight=2, pending=1))


def test_a_section_and_filter_parameters_that_disagree_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"plugins\[1\]\.parameters\.max_waiting is 6 but saturation"):
        parse_config_text(SECTION + LLMD_STYLE)
    agreeing = LLMD_STYLE + "\nsaturation: {max_waiting: 6, max_kv_usage: 0.96}\n"
    assert scheduler(agreeing).saturated(endpoint("e", waiting=6))


def test_two_saturation_filters_that_disagree_are_refused() -> None:
    text = LLMD_STYLE.replace(
        "  - type: prefix-cache-scorer\n",
        "  - type: saturation-filter\n    name: other\n  - type: prefix-cache-scorer\n",
    ).replace(
        "    - plugin_ref: prefix-cache-scorer\n",
        "    - plugin_ref: other\n    - plugin_ref: prefix-cache-scorer\n",
    )
    with pytest.raises(ConfigError, match="saturation has one definition"):
        scheduler(text)


def test_a_reload_that_changes_the_section_rebuilds_the_filter_and_keeps_it_otherwise() -> None:
    old = RouterConfig()
    context = PluginContext(rng=random.Random(0))
    running = build_scheduler(old, REGISTRY, context)
    before = {p.name: p for p in running.profile.plugins}
    new = parse_config_text(SECTION)
    previous = PreviousPlugins(old.plugins, before)
    rebuilt = build_scheduler(new, REGISTRY, context, previous=previous)
    assert "saturation-filter" not in previous.reused and "approx-prefix-producer" in previous.reused
    assert rebuilt.saturated(endpoint("e", waiting=4)) and not running.saturated(endpoint("e", waiting=4))
    same = PreviousPlugins(old.plugins, before)
    build_plugins(old.plugins, REGISTRY, context, previous=same)
    assert "saturation-filter" in same.reused


# 2. Admission uses the scheduler through its contract.


class FakeDecider:
    """A Decider that is not a Scheduler (no profile to reach into): every endpoint warm, some saturated."""

    def __init__(self, saturated: set[str]) -> None:
        self.saturated_names = saturated
        self.asked: list[str] = []
        self.produced = 0

    @property
    def state_version(self) -> int:
        return 0

    def saturated(self, endpoint: EndpointSnapshot) -> bool:
        self.asked.append(endpoint.name)
        return endpoint.name in self.saturated_names

    def produce(self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot]) -> CycleState:
        self.produced += 1
        state = CycleState()
        for e in endpoints:
            n = len(request.block_hashes)
            state.put(e.name, PrefixMatch(n, n, 64))
        return state

    def schedule(
        self,
        request: SchedRequest,
        endpoints: Sequence[EndpointSnapshot],
        *,
        produced: CycleState | None = None,
    ) -> Decision:
        return Decision(tuple(ScoredEndpoint(e, {}, 0.0) for e in endpoints), {})


@pytest.mark.anyio
async def test_admission_asks_the_decider_which_endpoints_are_saturated() -> None:
    pool = [endpoint("e1"), endpoint("e2")]
    open_ = FakeDecider(saturated={"e1"})
    assert (await admit_one(open_, pool, request("warm", *PREFIX))).role is Role.BYPASS
    assert open_.asked == ["e1", "e2"]
    full = FakeDecider(saturated={"e1", "e2"})  # nothing open: the warm request waits in the window
    assert (await admit_one(full, pool, request("warm", *PREFIX))).role is Role.LEADER
    assert full.produced == 1  # no open endpoint: the bypass check did not run them; placement did, once


# 3. The producers run once per cold request too.


@pytest.mark.anyio
async def test_a_cold_request_runs_the_producers_once() -> None:
    counts: Counter[str] = Counter()
    sched = scheduler(observer=counts)
    pool = [endpoint("e1"), endpoint("e2")]
    admitted = await admit_one(sched, pool, request("cold", *PREFIX))
    assert admitted.role is Role.LEADER
    assert counts["producer"] == 1  # the bypass check's run, reused by placement (it was 2)
    assert counts["filter"] > 0


@pytest.mark.anyio
async def test_a_dispatch_during_the_window_makes_placement_run_the_producers_again() -> None:
    """Reuse is only while the scheduler learned nothing: a request sharing the prefix sent to e2 while this
    one waited makes e2 warm for it."""
    counts: Counter[str] = Counter()
    sched = scheduler(observer=counts)
    pool = [endpoint("e1"), endpoint("e2")]
    sibling = request("sibling", *PREFIX, 77)
    admitted = await admit_one(sched, pool, request("cold", *PREFIX, 9), during_window=[sibling])
    assert counts["producer"] == 2
    assert admitted.endpoint.name == "e2" and admitted.decision.prefix is not None
    assert admitted.decision.prefix.matched_blocks == len(PREFIX)


@pytest.mark.anyio
async def test_a_spilling_group_runs_its_producers_once() -> None:
    counts: Counter[str] = Counter()
    sched = scheduler(observer=counts)
    pool = [endpoint("e1"), endpoint("e2")]
    members = [request(f"m{i}", *PREFIX, 100 + i) for i in range(6)]
    clock = ManualClock()
    config = AdmissionConfig(window_ms=WINDOW_S * 1000, min_shared_blocks=4, max_per_endpoint=2)
    results: list[Admitted] = []
    async with Admission(config, sched, lambda model: pool, clock=clock) as admission:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:

                async def admit(r: SchedRequest) -> None:
                    results.append(await admission.admit(r))

                for r in members:
                    tg.start_soon(admit, r)
                await settle()
                clock.advance(WINDOW_S)
    assert Counter(a.endpoint.name for a in results) == {"e1": 3, "e2": 3}  # capped at 2, then grown
    assert Counter(a.role for a in results)[Role.SPILL] >= 1
    assert counts["producer"] == len(members) + 1  # each member's bypass check, then the group's once
