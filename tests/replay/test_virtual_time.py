"""The virtual-time loop: timers run in order at their virtual instants, at once; threads hold the clock."""

from __future__ import annotations

import asyncio
import threading

from burstsched.replay.virtual_time import VirtualTimeLoop, run_virtual


def test_an_hour_of_sleeps_runs_in_order_at_their_virtual_instants() -> None:
    async def main() -> list[tuple[float, int]]:
        loop = asyncio.get_running_loop()
        woke: list[tuple[float, int]] = []

        async def sleeper(index: int, delay: float) -> None:
            await asyncio.sleep(delay)
            woke.append((loop.time(), index))

        async with asyncio.TaskGroup() as tg:
            for index, delay in enumerate([3600.0, 0.5, 1800.0, 0.5, 10.0]):
                tg.create_task(sleeper(index, delay))
        return woke

    woke = run_virtual(main)
    assert [index for _, index in woke] == [1, 3, 4, 2, 0]
    assert [when for when, _ in woke] == [0.5, 0.5, 10.0, 1800.0, 3600.0]


def test_the_clock_starts_where_asked_and_timeouts_fire_on_it() -> None:
    async def main() -> tuple[float, bool]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            async with asyncio.timeout(30.0):
                await asyncio.Event().wait()
        except TimeoutError:
            return start, loop.time() - start >= 30.0
        return start, False

    assert run_virtual(main, start=100.0) == (100.0, True)


def test_a_thread_s_result_lands_at_the_instant_it_was_asked_for() -> None:
    """While a thread works, the loop waits for real: a timer due later does not fire first."""
    release = threading.Event()

    async def main() -> tuple[float, bool, float]:
        loop = asyncio.get_running_loop()
        timer = asyncio.create_task(asyncio.sleep(5.0))
        loop.call_later(0.0, release.set)  # the thread may finish only after the loop has gone idle once
        asked = loop.time()
        value = await loop.run_in_executor(None, lambda: release.wait(10.0) and 7.0)
        answered_at = loop.time()
        await timer
        return answered_at - asked, timer.done(), value

    elapsed, timer_done, value = run_virtual(main)
    assert elapsed == 0.0
    assert timer_done and value == 7.0


def test_the_loop_reports_pending_threads() -> None:
    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        gate = threading.Event()
        future = loop.run_in_executor(None, gate.wait, 10.0)
        during = loop.threads_pending
        gate.set()
        await future
        return during, loop.threads_pending

    assert run_virtual(main) == (1, 0)
