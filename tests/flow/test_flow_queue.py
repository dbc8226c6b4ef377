"""The flow-control queue: held while the endpoint has no room, released late, by prefix, priority and flow.

The queue runs without its loop here: each test drives release passes itself, on a manual clock, over a
pool of endpoint snapshots it changes by hand (room comes from the router's own figures: requests before
their first token while the prefill speed is unknown, queued prefill tokens once it is known).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import replace

import anyio
import anyio.lowlevel
import pytest

from burstsched.admission import Admitted, ManualClock, Role
from burstsched.admission.placement import first
from burstsched.config import parse_config_text
from burstsched.config.flow_control import FlowControlConfig, HeadroomConfig, QueueBoundsConfig
from burstsched.flow import Disconnected, FlowQueue, FlowRefused, Identity, Released
from burstsched.framework import ApiKind, EndpointSnapshot, PluginContext, PluginRegistry, SchedRequest
from burstsched.scheduling import Scheduler, build_scheduler

pytestmark = pytest.mark.anyio
REGISTRY = PluginRegistry.discover()


def chain_of(*blocks: int) -> tuple[int, ...]:
    return tuple(hash(("chain", *blocks[: i + 1])) & 0xFFFFFFFFFFFFFFFF for i in range(len(blocks)))


def request(rid: str, *blocks: int) -> SchedRequest:
    hashes = chain_of(*blocks)
    return SchedRequest(
        request_id=rid, model="m", api=ApiKind.CHAT, block_hashes=hashes, prompt_tokens=64 * len(hashes)
    )


def doc(rid: str, document: int, question: int = 0) -> SchedRequest:
    """A document-QA prompt: 8 blocks of document ``document``, then its question."""
    return request(rid, *(document * 100 + i for i in range(8)), 10_000 + question)


class Pool:
    """Endpoint snapshots the test sets; full (no room) or not, by requests before their first token."""

    def __init__(self, *names: str) -> None:
        self.endpoints = {n: EndpointSnapshot(n, f"http://{n}", metrics_age=0.0) for n in names}

    def __call__(self, model: str) -> list[EndpointSnapshot]:
        return list(self.endpoints.values())

    def set(self, name: str, **fields: object) -> None:
        self.endpoints[name] = replace(self.endpoints[name], **fields)  # type: ignore[arg-type]

    def full(self, *names: str) -> None:
        for name in names:
            self.set(name, prefilling=2)

    def room(self, *names: str) -> None:
        for name in names:
            self.set(name, prefilling=0)


def scheduler() -> Scheduler:
    return build_scheduler(parse_config_text(""), REGISTRY, PluginContext(rng=random.Random(0)))


def flow_config(**overrides: object) -> FlowControlConfig:
    base = {  # ride_along_tokens 0: these tests hold warm requests too (the rule has its own test)
        "enabled": True,
        "headroom": HeadroomConfig(max_prefill_requests=2, ride_along_tokens=0),
        "max_reorder_ms": 1000.0,
    }
    return FlowControlConfig(**{**base, **overrides})  # type: ignore[arg-type]


def admitted_to(sched: Scheduler, pool: Pool, r: SchedRequest) -> Admitted:
    decision = sched.schedule(r, pool("m"))
    return Admitted(decision, 1, "1.0", Role.LEADER, 1, 0, 0.0)


class Harness:
    def __init__(
        self,
        config: FlowControlConfig | None = None,
        names: tuple[str, ...] = ("e1", "e2"),
        follow_s: float = 0.0,
    ) -> None:
        self.pool = Pool(*names)
        self.sched = scheduler()
        self.clock = ManualClock()
        self.queue = FlowQueue(
            config or flow_config(),
            self.sched,
            self.pool,
            min_shared_blocks=4,
            max_per_endpoint=32,
            follow_s=follow_s,
            clock=self.clock,
        )
        self.results: dict[str, Released | BaseException] = {}

    def submit(self, tg: anyio.abc.TaskGroup, r: SchedRequest, identity: Identity | None = None) -> None:
        async def hold() -> None:
            try:
                self.results[r.request_id] = await self.queue.hold(
                    r, admitted_to(self.sched, self.pool, r), identity or Identity(0, "default"), 100
                )
            except (FlowRefused, Disconnected) as exc:
                self.results[r.request_id] = exc

        tg.start_soon(hold)

    def released(self, rid: str) -> Released:
        result = self.results[rid]
        assert isinstance(result, Released), result
        return result

    def endpoint(self, rid: str) -> str:
        return self.released(rid).decision.ranked[0].name


async def settle() -> None:
    for _ in range(20):
        await anyio.lowlevel.checkpoint()


async def run(h: Harness, steps: Callable[[anyio.abc.TaskGroup], Awaitable[None]]) -> None:
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await steps(tg)
            await settle()
            h.queue.release_pass()  # nothing may be left waiting: release or fail loudly
            await settle()
            assert h.queue.depth == 0, h.queue.describe()


async def test_with_room_a_request_goes_at_once_as_admission_decided() -> None:
    h = Harness()

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("a", 1))
        await settle()

    await run(h, steps)
    assert h.released("a").queued is False


async def test_without_room_a_request_waits_and_goes_where_room_appears() -> None:
    h = Harness()
    h.pool.full("e1", "e2")

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("a", 1))
        await settle()
        h.queue.release_pass()
        await settle()
        assert "a" not in h.results and h.queue.depth == 1
        h.clock.advance(0.3)
        h.pool.room("e2")
        h.queue.release_pass()
        await settle()

    await run(h, steps)
    released = h.released("a")
    assert released.queued and h.endpoint("a") == "e2" and released.waited_s == pytest.approx(0.3)


async def test_when_an_endpoint_gets_room_the_group_warm_there_goes_first() -> None:
    """Late binding by prefix: document 2 is cached on e1 (the index says so); a cold document arrived
    first. e1 gets room for one: it takes document 2 (warm) although it came later; the cold one waits for
    the next room."""
    h = Harness()
    h.sched.on_dispatch(doc("earlier", 2), h.pool.endpoints["e1"])
    h.pool.full("e1", "e2")

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("cold", 7))
        await settle()
        h.clock.advance(0.1)
        h.submit(tg, doc("warm", 2))
        await settle()
        h.pool.set("e1", prefilling=1)  # room for one
        h.queue.release_pass()
        await settle()
        assert set(h.results) == {"warm"} and h.endpoint("warm") == "e1"
        assert h.released("warm").overtook == 1  # the cold one, queued before it, still waits
        h.pool.room("e1", "e2")

    await run(h, steps)


async def test_a_warm_group_waits_for_its_endpoint_rather_than_computing_its_prefix_elsewhere() -> None:
    h = Harness()
    h.sched.on_dispatch(doc("earlier", 2), h.pool.endpoints["e1"])
    h.pool.full("e1", "e2")

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("warm", 2))
        await settle()
        h.pool.room("e2")  # the cold endpoint has room, the warm one not
        h.queue.release_pass()
        await settle()
        assert not h.results  # it waits for e1
        h.pool.room("e1")

    await run(h, steps)
    assert h.endpoint("warm") == "e1"


async def test_an_overdue_request_goes_to_any_endpoint_with_room() -> None:
    h = Harness(flow_config(max_reorder_ms=500.0))
    h.sched.on_dispatch(doc("earlier", 2), h.pool.endpoints["e1"])
    h.pool.full("e1", "e2")

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("warm", 2))
        await settle()
        h.pool.room("e2")
        h.clock.advance(0.5)  # waited max_reorder_ms
        h.queue.release_pass()
        await settle()

    await run(h, steps)
    assert h.endpoint("warm") == "e2"


async def test_requests_of_one_prefix_are_released_together_to_one_endpoint() -> None:
    h = Harness()
    h.pool.full("e1", "e2")

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        for i in range(5):
            h.submit(tg, doc(f"q{i}", 3, question=i))
        await settle()
        h.pool.set("e1", prefilling=1)  # room for one request: the group goes whole
        h.queue.release_pass()
        await settle()

    await run(h, steps)
    assert {h.endpoint(f"q{i}") for i in range(5)} == {"e1"}
    roles = sorted(str(h.released(f"q{i}").role) for i in range(5))
    assert roles == ["leader", "member", "member", "member", "member"]
    assert all(h.released(f"q{i}").shared_blocks == 8 for i in range(1, 5))


async def test_higher_priority_goes_first() -> None:
    h = Harness()
    h.pool.full("e1", "e2")

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("low", 1), Identity(0, "a"))
        await settle()
        h.submit(tg, doc("high", 2), Identity(5, "b"))
        await settle()
        h.pool.set("e1", prefilling=1)
        h.queue.release_pass()
        await settle()
        assert set(h.results) == {"high"}
        h.pool.room("e1", "e2")

    await run(h, steps)


async def test_round_robin_fairness_between_flows() -> None:
    """A noisy flow queued six documents before a quiet flow's one: with room for one request at a time,
    the quiet flow's goes second, not seventh."""
    h = Harness(
        flow_config(headroom=HeadroomConfig(max_prefill_requests=1, ride_along_tokens=0)), names=("e1",)
    )
    h.pool.full("e1")
    order: list[str] = []

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        for i in range(6):
            h.submit(tg, doc(f"noisy{i}", 10 + i), Identity(0, "noisy"))
        await settle()
        h.clock.advance(0.01)
        h.submit(tg, doc("quiet", 50), Identity(0, "quiet"))
        await settle()
        for _ in range(7):
            h.pool.set("e1", prefilling=0)
            h.queue.release_pass()
            await settle()
            order.extend(sorted(set(h.results) - set(order)))

    await run(h, steps)
    assert order.index("quiet") == 1, order


async def test_strict_fairness_keeps_arrival_order() -> None:
    h = Harness(
        flow_config(fairness="strict", headroom=HeadroomConfig(max_prefill_requests=1, ride_along_tokens=0)),
        names=("e1",),
    )
    h.pool.full("e1")
    order: list[str] = []

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        for i in range(3):
            h.submit(tg, doc(f"noisy{i}", 10 + i), Identity(0, "noisy"))
        await settle()
        h.submit(tg, doc("quiet", 50), Identity(0, "quiet"))
        await settle()
        for _ in range(4):
            h.pool.set("e1", prefilling=0)
            h.queue.release_pass()
            await settle()
            order.extend(sorted(set(h.results) - set(order)))

    await run(h, steps)
    assert order == ["noisy0", "noisy1", "noisy2", "quiet"]


async def test_sheddable_requests_are_refused_only_when_they_would_wait() -> None:
    h = Harness()

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("passes", 1), Identity(-1, "batch"))
        await settle()
        h.pool.full("e1", "e2")
        h.submit(tg, doc("shed", 2), Identity(-1, "batch"))
        await settle()

    await run(h, steps)
    assert h.released("passes").queued is False
    refused = h.results["shed"]
    assert isinstance(refused, FlowRefused) and refused.status == 429 and refused.retry_after_s == 1


async def test_ttl_no_endpoint_and_bounds_refuse_with_the_right_status() -> None:
    h = Harness(
        flow_config(ttl_ms=1000.0, no_endpoint_wait_ms=200.0, bands={0: QueueBoundsConfig(max_requests=2)})
    )
    h.pool.full("e1", "e2")

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("expires", 1))
        h.submit(tg, doc("no-endpoint", 2))
        h.submit(tg, doc("over-bound", 3))
        await settle()
        h.clock.advance(1.0)
        h.queue.release_pass()  # "expires" waited its ttl; all endpoints still healthy: 429
        await settle()
        h.submit(tg, doc("later", 4))
        await settle()
        h.pool.set("e1", healthy=False)
        h.pool.set("e2", healthy=False)
        h.clock.advance(0.25)
        h.queue.release_pass()
        await settle()

    await run(h, steps)
    statuses = {rid: getattr(r, "status", None) for rid, r in h.results.items()}
    assert statuses == {"over-bound": 429, "expires": 429, "no-endpoint": 429, "later": 503}, statuses
    reasons = {rid: getattr(r, "reason", None) for rid, r in h.results.items()}
    assert reasons["over-bound"] == "full" and reasons["later"] == "no_endpoint"


async def test_a_client_that_disconnects_while_queued_leaves_at_once() -> None:
    h = Harness()
    h.pool.full("e1", "e2")
    disconnect = anyio.Event()

    async def receive() -> dict[str, object]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        async def hold() -> None:
            r = doc("gone", 1)
            try:
                await h.queue.hold(r, admitted_to(h.sched, h.pool, r), Identity(0, "f"), 10, receive)
            except Disconnected as exc:
                h.results["gone"] = exc

        tg.start_soon(hold)
        await settle()
        assert h.queue.depth == 1
        disconnect.set()
        await settle()
        assert h.queue.depth == 0
        h.pool.room("e1", "e2")

    await run(h, steps)
    assert isinstance(h.results["gone"], Disconnected)


async def test_describe_names_bands_flows_and_waits() -> None:
    h = Harness()
    h.pool.full("e1", "e2")

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("a", 1), Identity(2, "tenant-a"))
        h.submit(tg, doc("b", 2), Identity(0, "tenant-b"))
        await settle()
        h.clock.advance(0.25)
        view = h.queue.describe()
        assert view["requests"] == 2 and view["bytes"] == 200
        bands = view["bands"]
        assert isinstance(bands, dict) and list(bands) == ["2", "0"]
        assert bands["2"]["flows"] == {"tenant-a": 1} and bands["2"]["oldest_wait_s"] == 0.25
        assert view["since_start"] == {}
        h.clock.advance(0.5)
        h.pool.room("e1", "e2")
        h.queue.release_pass()
        await settle()

    await run(h, steps)
    tally = h.queue.describe()["since_start"]
    assert isinstance(tally, dict)
    assert tally["released"]["requests"] == 2 and tally["released"]["longest_wait_s"] == 0.75


async def test_a_warm_group_moves_when_its_endpoints_queue_costs_more_than_its_prefill_elsewhere() -> None:
    """Document 2 is cached on e1, but e1 has 10 000 prompt tokens queued (its prefill speed is known);
    e2 has room and nothing queued: computing the document on e2 is sooner than waiting, so it moves."""
    config = flow_config(headroom=HeadroomConfig(max_prefill_ms=100.0, ride_along_tokens=0))
    h = Harness(config)
    h.sched.on_dispatch(doc("earlier", 2), h.pool.endpoints["e1"])
    h.pool.set("e1", prefill_tokens_per_s=1000.0, queued_prefill_tokens=10_000)
    h.pool.set("e2", prefill_tokens_per_s=1000.0, queued_prefill_tokens=200)  # no room yet

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("warm", 2))
        await settle()
        assert not h.results
        h.pool.set("e2", queued_prefill_tokens=0)
        h.queue.release_pass()
        await settle()

    await run(h, steps)
    assert h.endpoint("warm") == "e2"


async def test_a_warm_request_rides_along_without_room_a_cold_one_waits() -> None:
    """ride_along_tokens: document 2 is cached on e1 (one block of its prompt left to compute), e1 has no
    room: the warm request goes at once, as vLLM computes it in the engine steps of the prefill ahead; a
    cold one waits. An endpoint blocked by its KV usage takes neither."""
    h = Harness(flow_config(headroom=HeadroomConfig(max_prefill_requests=2, ride_along_tokens=64)))
    h.sched.on_dispatch(doc("earlier", 2), h.pool.endpoints["e1"])
    h.pool.full("e1", "e2")

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("warm", 2))
        h.submit(tg, doc("cold", 9))
        await settle()
        assert set(h.results) == {"warm"} and h.released("warm").queued is False
        h.pool.set("e1", kv_usage=0.99)
        h.submit(tg, doc("warm-blocked", 2, question=1))
        await settle()
        assert "warm-blocked" not in h.results
        h.pool.set("e1", kv_usage=0.0)
        h.pool.room("e1", "e2")

    await run(h, steps)
    assert h.endpoint("warm") == "e1"


async def test_a_burst_member_rides_along_unless_its_group_waits_in_the_queue() -> None:
    """A member of a burst group (its leader computes the group's 8 shared blocks on e1 now) has only its
    question to compute there: it goes at once though e1 has no room. A member whose group waits in the
    queue (its leader held) waits with it, and they are released together, to one endpoint."""
    h = Harness(flow_config(headroom=HeadroomConfig(max_prefill_requests=2, ride_along_tokens=64)))
    h.pool.full("e1", "e2")

    def member_of(r: SchedRequest) -> Admitted:
        decision = h.sched.schedule(r, h.pool("m"))
        return Admitted(decision, 1, "1.0", Role.MEMBER, 2, 8, 0.0)

    def submit_member(tg: anyio.abc.TaskGroup, r: SchedRequest) -> None:
        async def hold() -> None:
            h.results[r.request_id] = await h.queue.hold(r, member_of(r), Identity(0, "default"), 100)

        tg.start_soon(hold)

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        submit_member(tg, doc("member", 3, question=1))
        await settle()
        assert h.released("member").queued is False  # its leader is computing the document: it rides along
        h.submit(tg, doc("leader", 4))  # a cold leader: no room, it waits
        await settle()
        assert "leader" not in h.results
        submit_member(tg, doc("member-of-waiting", 4, question=1))
        await settle()
        assert "member-of-waiting" not in h.results  # its group waits: so does it
        h.pool.room("e1", "e2")
        h.queue.release_pass()
        await settle()

    await run(h, steps)
    assert h.endpoint("leader") == h.endpoint("member-of-waiting")


async def test_a_request_follows_its_group_prefix_to_where_it_went() -> None:
    """A burst's members may reach the queue before their leader, or after the queue released it: either
    way they go where their group went, or the second endpoint computes the whole prefix again. (1) A member
    of document 5 rides along to the endpoint admission chose; its leader, admitted to the other endpoint
    (it arrives later, all endpoints full), follows the member there at once. (2) A queued cold leader of
    document 6 is released to e2, the endpoint that got room; a late member admitted to e1 follows it to e2.
    After ``follow_s`` the table forgets: a request goes where it was admitted."""
    h = Harness(
        flow_config(headroom=HeadroomConfig(max_prefill_requests=2, ride_along_tokens=64)), follow_s=2.0
    )
    h.pool.full("e1", "e2")

    def hold_as(tg: anyio.abc.TaskGroup, r: SchedRequest, role: Role, endpoint: str) -> None:
        decision = first(h.sched.schedule(r, h.pool("m")), endpoint)
        admitted = Admitted(decision, 1, "1.0", role, 2, 8 if role is not Role.LEADER else 0, 0.0)

        async def hold() -> None:
            h.results[r.request_id] = await h.queue.hold(r, admitted, Identity(0, "default"), 100)

        tg.start_soon(hold)

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        hold_as(tg, doc("member-5", 5, question=1), Role.MEMBER, "e1")
        await settle()
        assert h.endpoint("member-5") == "e1" and not h.released("member-5").queued
        hold_as(tg, doc("leader-5", 5), Role.LEADER, "e2")
        await settle()
        assert h.endpoint("leader-5") == "e1" and not h.released("leader-5").queued
        hold_as(tg, doc("leader-6", 6), Role.LEADER, "e1")
        await settle()
        assert "leader-6" not in h.results  # cold, no room: it waits
        h.pool.room("e2")
        h.queue.release_pass()
        await settle()
        assert h.endpoint("leader-6") == "e2"
        h.pool.full("e2")
        hold_as(tg, doc("late-6", 6, question=2), Role.JOINED, "e1")
        await settle()
        assert h.endpoint("late-6") == "e2" and not h.released("late-6").queued
        h.clock.advance(2.5)  # past follow_s: admission's choice stands
        hold_as(tg, doc("later-6", 6, question=3), Role.JOINED, "e1")
        await settle()
        assert h.endpoint("later-6") == "e1"

    await run(h, steps)


async def test_a_bands_room_share_keeps_the_rest_of_an_endpoints_room_for_higher_bands() -> None:
    """Band 0 may fill half of an endpoint's room (``room_share`` 0.5). e1 has one of its two prefill slots
    in use: a band-0 request waits while a band-10 one, arrived after it, goes; past ``max_reorder_ms`` the
    band-0 request takes the room anyway (no band waits forever for its share)."""
    config = flow_config(bands={0: QueueBoundsConfig(room_share=0.5)})
    h = Harness(config, names=("e1",))
    h.pool.set("e1", prefilling=1)

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("standard", 1), Identity(0, "default"))
        h.submit(tg, doc("urgent", 2), Identity(10, "default"))
        await settle()
        h.queue.release_pass()
        await settle()
        assert set(h.results) == {"urgent"} and h.released("urgent").overtook == 1
        h.pool.set("e1", prefilling=1)  # the urgent one's prefill ended; the other slot is still busy
        h.clock.advance(0.5)
        h.queue.release_pass()
        await settle()
        assert "standard" not in h.results  # half the room in use: not for band 0
        h.clock.advance(0.6)  # past max_reorder_ms (1 s)
        h.queue.release_pass()
        await settle()
        assert h.released("standard").queued and h.endpoint("standard") == "e1"

    await run(h, steps)


async def test_past_max_wait_ms_a_request_goes_with_no_room_anywhere() -> None:
    """``max_wait_ms`` 1500: with both endpoints full, a request waits through ``max_reorder_ms`` (1 s:
    overdue, but no endpoint has room) and goes at 1.5 s to its best endpoint anyway; one that came later
    still waits. Without the setting it would wait for room until its TTL."""
    h = Harness(flow_config(max_wait_ms=1500.0))
    h.pool.full("e1", "e2")

    async def steps(tg: anyio.abc.TaskGroup) -> None:
        h.submit(tg, doc("old", 1))
        await settle()
        h.clock.advance(0.5)
        h.submit(tg, doc("new", 2))
        await settle()
        h.clock.advance(0.7)  # old: 1.2 s, overdue; nothing has room
        h.queue.release_pass()
        await settle()
        assert not h.results
        h.clock.advance(0.3)  # old: 1.5 s
        h.queue.release_pass()
        await settle()
        assert set(h.results) == {"old"} and h.released("old").waited_s == pytest.approx(1.5)
        assert h.queue.depth == 1
        h.pool.room("e1", "e2")

    await run(h, steps)
