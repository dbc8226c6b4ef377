"""The admission window: sealing, bounds, the queue limit, cancellation and bypass."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from burstsched.admission.clock import ManualClock
from burstsched.admission.errors import AdmissionClosed, AdmissionError, AdmissionQueueFull
from burstsched.admission.window import AdmissionWindow, Batch

WINDOW_S = 0.010


async def settle() -> None:
    """Let every ready task run until it blocks again.

    Without I/O or real timers the event loop runs ready tasks in order, so a fixed number of turns is enough
    (a request takes a handful of turns from arrival to its result); unlike wait_all_tasks_blocked this does
    not sleep.
    """
    for _ in range(50):
        await anyio.lowlevel.checkpoint()


@dataclass
class Recorder:
    """A place callback that records every batch and answers each request with (window id, item)."""

    batches: list[Batch[str]] = field(default_factory=list)
    fail_with: Exception | None = None
    drop: set[str] = field(default_factory=set)

    async def __call__(self, batch: Batch[str]) -> Mapping[str, tuple[int, str]]:
        self.batches.append(batch)
        await anyio.lowlevel.checkpoint()
        if self.fail_with is not None:
            raise self.fail_with
        return {ticket: (batch.window_id, item) for ticket, item in batch.entries if item not in self.drop}

    def items(self, index: int) -> list[str]:
        return [item for _, item in self.batches[index].entries]


def make_window(
    place: Recorder,
    clock: ManualClock,
    *,
    max_batch: int = 8,
    queue_limit: int = 100,
    bypass: Callable[[str], bool] | None = None,
) -> AdmissionWindow[str, tuple[int, str]]:
    return AdmissionWindow(
        place,
        window_s=WINDOW_S,
        max_batch=max_batch,
        queue_limit=queue_limit,
        retry_after_s=3,
        bypass=bypass,
        clock=clock,
    )


class Results:
    def __init__(self) -> None:
        self.values: dict[str, tuple[int, str]] = {}
        self.errors: dict[str, BaseException] = {}

    async def submit(self, window: AdmissionWindow[str, tuple[int, str]], item: str) -> None:
        try:
            self.values[item] = await window.submit(item)
        except AdmissionError as error:
            self.errors[item] = error


@pytest.mark.anyio
async def test_window_seals_after_window_s_by_the_clock() -> None:
    clock, place, results = ManualClock(), Recorder(), Results()
    with anyio.fail_after(5):
        async with make_window(place, clock) as window, anyio.create_task_group() as tg:
            for item in ("a", "b", "c"):
                tg.start_soon(results.submit, window, item)
            await settle()
            clock.advance(WINDOW_S * 0.9)
            await settle()
            assert place.batches == [] and window.held == 3
            clock.advance(WINDOW_S * 0.1)
            await settle()
            assert len(place.batches) == 1
            assert place.items(0) == ["a", "b", "c"]
            assert place.batches[0].sealed_at - place.batches[0].opened_at == pytest.approx(WINDOW_S)
    assert results.values == {"a": (1, "a"), "b": (1, "b"), "c": (1, "c")}
    assert window.held == 0


@pytest.mark.anyio
async def test_max_batch_seals_early_and_the_next_request_opens_a_new_window() -> None:
    clock, place, results = ManualClock(), Recorder(), Results()
    with anyio.fail_after(5):
        async with make_window(place, clock, max_batch=3) as window, anyio.create_task_group() as tg:
            for item in ("a", "b", "c", "d"):
                tg.start_soon(results.submit, window, item)
            await settle()
            assert [place.items(0)] == [["a", "b", "c"]]
            assert {results.values[k][0] for k in "abc"} == {1} and "d" not in results.values
            clock.advance(WINDOW_S)
            await settle()
    assert [place.items(i) for i in range(2)] == [["a", "b", "c"], ["d"]]
    assert results.values["d"] == (2, "d")
    assert clock.sleepers == 0


@pytest.mark.anyio
async def test_queue_full_raises_a_distinct_error_with_retry_after() -> None:
    clock, place, results = ManualClock(), Recorder(), Results()
    with anyio.fail_after(5):
        async with make_window(place, clock, queue_limit=2) as window, anyio.create_task_group() as tg:
            for item in ("a", "b", "c"):
                tg.start_soon(results.submit, window, item)
            await settle()
            clock.advance(WINDOW_S)
    assert sorted(results.values) == ["a", "b"]
    error = results.errors["c"]
    assert isinstance(error, AdmissionQueueFull)
    assert (error.retry_after_s, error.limit) == (3, 2)


@pytest.mark.anyio
async def test_a_cancelled_waiter_leaves_its_window_cleanly() -> None:
    clock, place, results = ManualClock(), Recorder(), Results()
    with anyio.fail_after(5):
        async with make_window(place, clock) as window, anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def cancellable(item: str) -> None:
                with scope:
                    await results.submit(window, item)

            tg.start_soon(cancellable, "gone")
            tg.start_soon(results.submit, window, "stays")
            await settle()
            assert window.held == 2
            scope.cancel()
            await settle()
            assert window.held == 1
            clock.advance(WINDOW_S)
    assert [place.items(0)] == [["stays"]]
    assert results.values == {"stays": (1, "stays")}


@pytest.mark.anyio
async def test_the_last_waiter_leaving_closes_the_window_without_placement() -> None:
    clock, place = ManualClock(), Recorder()
    with anyio.fail_after(5):
        async with make_window(place, clock) as window:
            with anyio.move_on_after(0.05):
                await window.submit("alone")
            assert window.held == 0 and window.open_window is None
            await settle()
            assert clock.sleepers == 0
            clock.advance(WINDOW_S)
    assert place.batches == []


@pytest.mark.anyio
async def test_warm_requests_bypass_the_window() -> None:
    clock, place, results = ManualClock(), Recorder(), Results()
    with anyio.fail_after(5):
        async with make_window(place, clock, bypass=lambda item: item.startswith("warm")) as window:
            async with anyio.create_task_group() as tg:
                tg.start_soon(results.submit, window, "cold")
                await settle()
                await results.submit(window, "warm")
                assert "warm" in results.values and "cold" not in results.values
                assert place.batches[0].bypass and place.items(0) == ["warm"]
                clock.advance(WINDOW_S)
    assert not place.batches[1].bypass and place.items(1) == ["cold"]


@pytest.mark.anyio
async def test_every_waiter_gets_the_placement_error() -> None:
    clock, place, results = ManualClock(), Recorder(fail_with=AdmissionError("no pool")), Results()
    with anyio.fail_after(5):
        async with make_window(place, clock) as window, anyio.create_task_group() as tg:
            for item in ("a", "b"):
                tg.start_soon(results.submit, window, item)
            await settle()
            clock.advance(WINDOW_S)
    assert results.values == {}
    assert {k: str(v) for k, v in results.errors.items()} == {"a": "no pool", "b": "no pool"}


@pytest.mark.anyio
async def test_a_request_placement_left_out_gets_an_error() -> None:
    clock, place, results = ManualClock(), Recorder(drop={"b"}), Results()
    with anyio.fail_after(5):
        async with make_window(place, clock) as window, anyio.create_task_group() as tg:
            for item in ("a", "b"):
                tg.start_soon(results.submit, window, item)
            await settle()
            clock.advance(WINDOW_S)
    assert list(results.values) == ["a"] and list(results.errors) == ["b"]


@pytest.mark.anyio
async def test_closing_places_the_open_window_and_refuses_new_requests() -> None:
    clock, place, results = ManualClock(), Recorder(), Results()
    window = make_window(place, clock)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async with window:
                tg.start_soon(results.submit, window, "a")
                await settle()
        with pytest.raises(AdmissionClosed):
            await window.submit("late")
    assert results.values == {"a": (1, "a")}


@pytest.mark.anyio
async def test_real_clock_window_places_every_request() -> None:
    """On the event loop's clock: assert counts and order only, never durations."""
    place, results = Recorder(), Results()
    window: AdmissionWindow[str, tuple[int, str]] = AdmissionWindow(
        place, window_s=0.005, max_batch=4, queue_limit=100
    )
    with anyio.fail_after(10):
        async with window, anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(results.submit, window, f"r{i}")
    assert sorted(results.values) == sorted(f"r{i}" for i in range(10))
    assert all(len(b.entries) <= 4 for b in place.batches)
    assert sorted(item for b in place.batches for _, item in b.entries) == sorted(results.values)
    assert all(results.values[item][0] == b.window_id for b in place.batches for _, item in b.entries)


# A schedule: arrivals (some of which get cancelled later), clock steps in milliseconds.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(1, 4)),
        st.tuples(st.just("advance"), st.integers(1, 15)),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(schedule=steps, max_batch=st.integers(1, 6))
def test_window_never_loses_duplicates_or_delays_a_request(
    schedule: list[tuple[str, int]], max_batch: int
) -> None:
    clock, place, results = ManualClock(), Recorder(), Results()
    arrived_at: dict[str, float] = {}
    scopes: list[tuple[str, anyio.CancelScope]] = []
    cancelled: set[str] = set()

    async def waiter(
        window: AdmissionWindow[str, tuple[int, str]], item: str, scope: anyio.CancelScope
    ) -> None:
        with scope:
            await results.submit(window, item)

    async def main() -> None:
        with anyio.fail_after(10):
            async with (
                make_window(place, clock, max_batch=max_batch) as window,
                anyio.create_task_group() as tg,
            ):
                for kind, value in schedule:
                    if kind == "arrive":
                        for _ in range(value):
                            item = f"r{len(arrived_at)}"
                            arrived_at[item] = clock.now()
                            scope = anyio.CancelScope()
                            scopes.append((item, scope))
                            tg.start_soon(waiter, window, item, scope)
                    elif kind == "advance":
                        for _ in range(value):
                            clock.advance(0.001)
                            await settle()
                    elif scopes:
                        item, scope = scopes[value % len(scopes)]
                        if item not in results.values:
                            cancelled.add(item)
                        scope.cancel()
                    await settle()
                for _ in range(round(WINDOW_S * 1000)):
                    clock.advance(0.001)
                    await settle()

    anyio.run(main)
    placed = [item for batch in place.batches for _, item in batch.entries]
    assert len(placed) == len(set(placed))
    # Every request not cancelled was placed and got its own result, from its own window.
    assert set(arrived_at) - cancelled <= set(placed)
    assert set(results.values) == set(arrived_at) - cancelled
    for batch in place.batches:
        assert 1 <= len(batch.entries) <= max_batch
        for _, item in batch.entries:
            assert batch.sealed_at - arrived_at[item] <= WINDOW_S + 1e-6
            if item in results.values:
                assert results.values[item] == (batch.window_id, item)
    assert results.errors == {}
