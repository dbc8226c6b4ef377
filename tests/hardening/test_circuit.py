"""The circuit breaker (clock injected), its place in the pool, and what a vanished endpoint leaves behind."""

from __future__ import annotations

import httpx
import pytest
from burstsched_plugins.prefix_index import PrefixIndex

from burstsched.config import EndpointConfig, PoolConfig
from burstsched.dispatch import HttpxUpstream, getter
from burstsched.pool import CircuitBreaker, CircuitSettings, CircuitState, EndpointPool


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state(breaker: CircuitBreaker) -> CircuitState:
    return breaker.state


def test_consecutive_failures_open_the_circuit_and_a_success_resets_the_count() -> None:
    clock = Clock()
    breaker = CircuitBreaker(CircuitSettings(failure_threshold=3, open_s=1.0, max_open_s=8.0), clock)
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()  # not consecutive any more
    breaker.record_failure()
    breaker.record_failure()
    assert state(breaker) is CircuitState.CLOSED and breaker.admits()
    breaker.record_failure()
    assert state(breaker) is CircuitState.OPEN
    assert not breaker.admits() and not breaker.begin()


def test_half_open_lets_one_probe_through_and_its_verdict_decides() -> None:
    clock = Clock()
    breaker = CircuitBreaker(CircuitSettings(failure_threshold=1, open_s=1.0, max_open_s=3.0), clock)
    breaker.record_failure()
    clock.now += 0.999
    assert state(breaker) is CircuitState.OPEN
    clock.now += 0.001
    assert state(breaker) is CircuitState.HALF_OPEN
    assert breaker.begin()  # the probe
    assert not breaker.admits() and not breaker.begin()  # one at a time
    breaker.record_failure()  # the probe failed: open twice as long
    assert state(breaker) is CircuitState.OPEN
    clock.now += 1.5
    assert state(breaker) is CircuitState.OPEN
    clock.now += 0.5
    assert breaker.begin()
    breaker.record_failure()  # 4 s would exceed max_open_s: 3 s
    clock.now += 2.9
    assert state(breaker) is CircuitState.OPEN
    clock.now += 0.1
    assert breaker.begin()
    breaker.record_success()
    assert state(breaker) is CircuitState.CLOSED
    breaker.record_failure()  # closed again, the wait is back to open_s
    clock.now += 1.0
    assert state(breaker) is CircuitState.HALF_OPEN


def test_a_probe_without_verdict_frees_the_slot() -> None:
    clock = Clock()
    breaker = CircuitBreaker(CircuitSettings(failure_threshold=1, open_s=10.0, max_open_s=10.0), clock)
    breaker.record_failure()
    clock.now += 10.0
    assert state(breaker) is CircuitState.HALF_OPEN
    assert breaker.begin()
    breaker.end()  # the client went away: no verdict
    assert breaker.begin()
    breaker.record_success()
    assert state(breaker) is CircuitState.CLOSED


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        CircuitSettings(failure_threshold=0)
    with pytest.raises(ValueError):
        CircuitSettings(open_s=2.0, max_open_s=1.0)


def _handler(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/health":
        return httpx.Response(200)
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "object": "model"}]})
    return httpx.Response(200, text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")


@pytest.mark.anyio
async def test_pool_hides_an_open_circuit_from_scheduling_and_reports_endpoints_going_down() -> None:
    clock = Clock()
    down: list[str] = []
    endpoints = [EndpointConfig(url="http://a:1", name="a"), EndpointConfig(url="http://b:1", name="b")]
    fetch = getter(HttpxUpstream(httpx.MockTransport(_handler)))
    pool = EndpointPool(
        endpoints,
        PoolConfig(),
        fetch,
        clock=clock,
        circuit=CircuitSettings(failure_threshold=2, open_s=5.0, max_open_s=5.0),
        on_down=down.append,
    )
    await pool.refresh()
    assert [s.healthy for s in pool.snapshots()] == [True, True]
    pool.report_failure("a", unreachable=False)
    pool.report_failure("a", unreachable=False)
    assert pool.circuit_state("a") is CircuitState.OPEN
    assert [s.healthy for s in pool.snapshots()] == [False, True]
    assert pool.healthy_count() == 2  # reachable, just kept out of scheduling
    assert pool.begin_attempt("a") is None
    assert down == []  # an open circuit is not a vanished endpoint
    clock.now += 5.0
    claimed = pool.begin_attempt("a")
    assert claimed is CircuitState.HALF_OPEN
    assert not pool.snapshot("a").healthy  # the probe is out
    pool.end_attempt("a", claimed)
    assert pool.snapshot("a").healthy

    pool.report_failure("b", unreachable=True)  # a refused connection
    assert down == ["b"] and not pool.snapshot("b").healthy
    pool.report_failure("b", unreachable=True)
    assert down == ["b"]  # told once per disappearance
    await pool.check_health("b")
    assert not pool.snapshot("b").healthy  # reachable again, but its circuit (2 failures) is open
    clock.now += 5.0
    assert pool.snapshot("b").healthy
    pool.report_failure("a", unreachable=False)  # a is half-open: a failure reopens it at once
    assert pool.circuit_state("a") is CircuitState.OPEN


def test_prefix_index_forgets_an_endpoint() -> None:
    index = PrefixIndex(100)
    index.add("a", [1, 2, 3])
    index.add("b", [1, 2])
    index.remove_endpoint("a")
    assert index.size("a") == 0 and index.size("b") == 2
    assert index.match([1, 2, 3], ["a", "b"]) == {"a": 0, "b": 2}
    index.remove_endpoint("unknown")
    index.add("a", [1])
    assert index.match([1, 2], ["a", "b"]) == {"a": 1, "b": 2}
