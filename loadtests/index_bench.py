"""Prefix index benchmark: memory per entry, lookup latency and event-loop stalls, old index against new.

    .venv/bin/python loadtests/index_bench.py [--entries 1000000,2000000] [--endpoints 64] [--churn 4000]
                                              [--lookups 2000] [--impls baseline,prefix,precise] [--json PATH]

Three implementations, each measured in a fresh subprocess per index size (so that one's memory and garbage
does not weigh on the next):

- ``baseline``: the dict / set / OrderedDict ``PrefixIndex`` the router used before (copied below as
  :class:`BaselinePrefixIndex`, unchanged apart from its name);
- ``prefix``: today's :class:`~burstsched_plugins.prefix_index.PrefixIndex` (numpy arrays, numba kernels);
- ``precise``: :class:`~burstsched_plugins.precise_index.PreciseIndex`, fed engine hashes (the router hash
  XOR a constant) alongside router hashes, as KV events would.

Workload: requests of 250 blocks (a 4000-token prompt at block size 16). Each opens with 16–199 blocks of
one of 512 shared documents, then blocks of its own; it goes to its document's home endpoint (70%) or to a
random one. Every endpoint's capacity is entries / endpoints, so the index fills up to ``entries`` and then
evicts.

Per implementation and size it reports:

- **bytes per entry**: RSS growth over the fill (``/proc/self/status``) and, in a second subprocess, the
  growth of memory traced by ``tracemalloc`` (numpy reports its arrays to it); for the new indexes also
  their ``nbytes()``; all divided by the entries held;
- **lookup p50 / p99** of ``match`` over all endpoints for a prompt of 250 blocks (block size 16) and of 31
  blocks (block size 128), held in part by four endpoints (all of it, 60%, 30%, 10%);
- **add p50 / p99**: one request's chain (250 blocks) added or stored while the index is full (so each
  call also evicts);
- **stall**: the longest lag of a 1 ms asyncio ticker while filling and then churning (``--churn`` more
  requests, every fourth also removing an older chain in the precise index), with an ``await`` after each
  request's chain; the longest single index call in this thread's CPU time (what the index itself costs,
  without the time a loaded machine gives to other processes); and the longest garbage collection (timed
  with ``gc.callbacks``).

Prints a markdown table; ``--json`` also writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

DOCUMENTS = 512
CHAIN = 250
ENGINE_SALT = 0x5DEECE66D
HOLDERS = (1.0, 0.6, 0.3, 0.1)
FILL_STALLS = ("fill_max_stall_ms", "fill_max_call_cpu_ms", "fill_max_gc_ms", "fill_gc_collections")
CHURN_STALLS = ("churn_max_stall_ms", "churn_max_call_cpu_ms", "churn_max_gc_ms", "churn_gc_collections")


class BaselinePrefixIndex:
    """BASELINE, for comparison only: the router's ``PrefixIndex`` before the compact rewrite, verbatim.

    Per-endpoint LRU sets of block hashes, and a hash → endpoints map for lookups.
    """

    def __init__(self, default_capacity: int) -> None:
        if default_capacity < 1:
            raise ValueError("default_capacity must be at least 1")
        self._default_capacity = default_capacity
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}
        self._owners: dict[int, set[str]] = {}

    def capacity(self, endpoint: str) -> int:
        return self._capacity.get(endpoint, self._default_capacity)

    def add(self, endpoint: str, hashes: Sequence[int]) -> None:
        lru = self._lru.setdefault(endpoint, OrderedDict())
        for block in reversed(hashes):
            if block in lru:
                lru.move_to_end(block)
            else:
                lru[block] = None
                owners = self._owners.get(block)
                if owners is None:
                    self._owners[block] = {endpoint}
                else:
                    owners.add(endpoint)
        self._evict(endpoint)

    def match(self, hashes: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        matched = dict.fromkeys(endpoints, 0)
        alive = set(matched)
        for depth, block in enumerate(hashes):
            owners = self._owners.get(block)
            if not owners:
                break
            alive &= owners
            if not alive:
                break
            for endpoint in alive:
                matched[endpoint] = depth + 1
        return matched

    def size(self, endpoint: str) -> int:
        lru = self._lru.get(endpoint)
        return len(lru) if lru is not None else 0

    def _evict(self, endpoint: str) -> None:
        lru = self._lru.get(endpoint)
        if lru is None:
            return
        limit = self.capacity(endpoint)
        while len(lru) > limit:
            block, _ = lru.popitem(last=False)
            owners = self._owners.get(block)
            if owners is not None:
                owners.discard(endpoint)
                if not owners:
                    del self._owners[block]


class Driver(Protocol):
    """One implementation behind the three calls the benchmark makes."""

    def add(self, endpoint: str, chain: list[int]) -> None: ...
    def forget(self, endpoint: str, chain: list[int]) -> None: ...
    def match(self, chain: list[int], endpoints: Sequence[str]) -> dict[str, int]: ...
    def entries(self) -> int: ...
    def nbytes(self) -> int | None: ...


class BaselineDriver:
    def __init__(self, capacity: int, endpoints: Sequence[str]) -> None:
        self.index = BaselinePrefixIndex(capacity)
        self.endpoints = endpoints

    def add(self, endpoint: str, chain: list[int]) -> None:
        self.index.add(endpoint, chain)

    def forget(self, endpoint: str, chain: list[int]) -> None:
        pass  # the approximate index never removes

    def match(self, chain: list[int], endpoints: Sequence[str]) -> dict[str, int]:
        return self.index.match(chain, endpoints)

    def entries(self) -> int:
        return sum(self.index.size(e) for e in self.endpoints)

    def nbytes(self) -> int | None:
        return None


class PrefixDriver:
    def __init__(self, capacity: int, endpoints: Sequence[str]) -> None:
        from burstsched_plugins.prefix_index import PrefixIndex

        self.index = PrefixIndex(capacity)

    def add(self, endpoint: str, chain: list[int]) -> None:
        self.index.add(endpoint, chain)

    def forget(self, endpoint: str, chain: list[int]) -> None:
        pass

    def match(self, chain: list[int], endpoints: Sequence[str]) -> dict[str, int]:
        return self.index.match(chain, endpoints)

    def entries(self) -> int:
        return self.index.entries()

    def nbytes(self) -> int | None:
        return self.index.nbytes()


class PreciseDriver:
    def __init__(self, capacity: int, endpoints: Sequence[str]) -> None:
        from burstsched_plugins.precise_index import PreciseIndex

        self.index = PreciseIndex(capacity)

    def add(self, endpoint: str, chain: list[int]) -> None:
        self.index.store(endpoint, [h ^ ENGINE_SALT for h in chain], chain)

    def forget(self, endpoint: str, chain: list[int]) -> None:
        self.index.remove(endpoint, [h ^ ENGINE_SALT for h in chain])

    def match(self, chain: list[int], endpoints: Sequence[str]) -> dict[str, int]:
        return self.index.match(chain, endpoints)

    def entries(self) -> int:
        return self.index.entries()

    def nbytes(self) -> int | None:
        return self.index.nbytes()


DRIVERS: dict[str, Callable[[int, Sequence[str]], Driver]] = {
    "baseline": BaselineDriver,
    "prefix": PrefixDriver,
    "precise": PreciseDriver,
}


class Workload:
    """Seeded requests: a shared document's leading blocks, then the request's own; a home endpoint mostly."""

    def __init__(self, endpoints: Sequence[str], seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.endpoints = endpoints
        self.documents = [self._random(CHAIN) for _ in range(DOCUMENTS)]

    def _random(self, count: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
        return self.rng.integers(0, 2**64, count, dtype=np.uint64, endpoint=False)

    def next(self) -> tuple[str, list[int]]:
        document = int(self.rng.integers(DOCUMENTS))
        shared = int(self.rng.integers(16, 200))
        chain = np.concatenate([self.documents[document][:shared], self._random(CHAIN - shared)])
        home = document % len(self.endpoints)
        endpoint = home if self.rng.random() < 0.7 else int(self.rng.integers(len(self.endpoints)))
        return self.endpoints[endpoint], chain.tolist()

    def prompt(self, blocks: int) -> list[int]:
        return [int(h) for h in self._random(blocks)]


class Ticker:
    """A 1 ms asyncio ticker recording how late it wakes (the event loop's longest stall), and GC pauses."""

    def __init__(self) -> None:
        self.max_lag = 0.0
        self.max_gc = 0.0
        self.collections = 0
        self._gc_start = 0.0
        self._task: asyncio.Task[None] | None = None

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.collections += 1
            self.max_gc = max(self.max_gc, time.perf_counter() - self._gc_start)

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            self.max_lag = max(self.max_lag, time.perf_counter() - before - 0.001)

    def start(self) -> None:
        self.max_lag = self.max_gc = 0.0
        self.collections = 0
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


@dataclass
class Result:
    impl: str
    entries_target: int
    entries: int
    endpoints: int
    fill_requests: int
    fill_s: float
    rss_bytes_per_entry: float
    traced_bytes_per_entry: float | None
    nbytes_per_entry: float | None
    match250_p50_us: float
    match250_p99_us: float
    match31_p50_us: float
    match31_p99_us: float
    add_p50_us: float
    add_p99_us: float
    fill_max_stall_ms: float
    fill_max_call_cpu_ms: float
    fill_max_gc_ms: float
    fill_gc_collections: int
    churn_max_stall_ms: float
    churn_max_call_cpu_ms: float
    churn_max_gc_ms: float
    churn_gc_collections: int


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class CallClock:
    """The longest single index call, in this thread's CPU time: the stall it causes, whatever else runs.

    On a loaded machine the ticker's lag also counts time the OS gave to other processes; this does not.
    """

    def __init__(self) -> None:
        self.max_cpu = 0.0

    def run(self, call: Callable[[str, list[int]], object], endpoint: str, chain: list[int]) -> float:
        """Run ``call(endpoint, chain)``; returns its wall time."""
        cpu, wall = time.thread_time(), time.perf_counter()
        call(endpoint, chain)
        wall = time.perf_counter() - wall
        self.max_cpu = max(self.max_cpu, time.thread_time() - cpu)
        return wall


async def fill(driver: Driver, workload: Workload, target: int, clock: CallClock) -> int:
    """Add requests until the index holds 99.5% of ``target`` entries (bounded); returns how many went."""
    sent = 0
    limit = 40 * target // CHAIN
    while sent < limit:
        endpoint, chain = workload.next()
        clock.run(driver.add, endpoint, chain)
        sent += 1
        if sent % 64 == 0 and driver.entries() >= target * 0.995:
            break
        await asyncio.sleep(0)
    return sent


async def churn(driver: Driver, workload: Workload, requests: int, clock: CallClock) -> list[float]:
    """Add ``requests`` more requests to the full index (the precise one also removes older chains)."""
    durations: list[float] = []
    recent: deque[tuple[str, list[int]]] = deque(maxlen=32)
    for i in range(requests):
        endpoint, chain = workload.next()
        durations.append(clock.run(driver.add, endpoint, chain))
        recent.append((endpoint, chain))
        if i % 4 == 3 and len(recent) == recent.maxlen:
            clock.run(driver.forget, *recent[0])
        await asyncio.sleep(0)
    return durations


def time_lookups(
    driver: Driver, workload: Workload, endpoints: Sequence[str], blocks: int, rounds: int
) -> list[float]:
    """``match`` latency of a ``blocks``-block prompt held in part by four endpoints; checks the answer."""
    prompt = workload.prompt(blocks)
    expected = dict.fromkeys(endpoints, 0)
    for endpoint, share in zip(endpoints, HOLDERS, strict=False):
        held = max(1, int(blocks * share))
        driver.add(endpoint, prompt[:held])
        expected[endpoint] = held
    if driver.match(prompt, endpoints) != expected:
        raise AssertionError("the index does not return the planted matches")
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        driver.match(prompt, endpoints)
        samples.append(time.perf_counter() - started)
    return samples


async def measure(
    impl: str, target: int, endpoint_count: int, churn_requests: int, lookups: int
) -> dict[str, Any]:
    endpoints = [f"endpoint-{i}" for i in range(endpoint_count)]
    workload = Workload(endpoints, seed=1)
    DRIVERS[impl](8, endpoints)  # imports, and numba's kernels loaded, outside what is measured
    gc.collect()
    rss_before = rss_bytes()
    driver = DRIVERS[impl](target // endpoint_count, endpoints)
    ticker, fill_clock, churn_clock = Ticker(), CallClock(), CallClock()
    ticker.start()
    started = time.perf_counter()
    sent = await fill(driver, workload, target, fill_clock)
    fill_s = time.perf_counter() - started
    await ticker.stop()
    fill_stall, fill_gc, fill_collections = ticker.max_lag, ticker.max_gc, ticker.collections
    entries = driver.entries()
    rss_growth = rss_bytes() - rss_before
    nbytes = driver.nbytes()
    ticker.start()
    adds = await churn(driver, workload, churn_requests, churn_clock)
    await ticker.stop()
    match250 = time_lookups(driver, workload, endpoints, 250, lookups)
    match31 = time_lookups(driver, workload, endpoints, 31, lookups)
    us, ms = 1e6, 1e3
    return asdict(
        Result(
            impl=impl,
            entries_target=target,
            entries=entries,
            endpoints=endpoint_count,
            fill_requests=sent,
            fill_s=round(fill_s, 2),
            rss_bytes_per_entry=round(rss_growth / entries, 1),
            traced_bytes_per_entry=None,
            nbytes_per_entry=None if nbytes is None else round(nbytes / entries, 1),
            match250_p50_us=round(statistics.median(match250) * us, 1),
            match250_p99_us=round(percentile(match250, 0.99) * us, 1),
            match31_p50_us=round(statistics.median(match31) * us, 1),
            match31_p99_us=round(percentile(match31, 0.99) * us, 1),
            add_p50_us=round(statistics.median(adds) * us, 1),
            add_p99_us=round(percentile(adds, 0.99) * us, 1),
            fill_max_stall_ms=round(fill_stall * ms, 2),
            fill_max_call_cpu_ms=round(fill_clock.max_cpu * ms, 2),
            fill_max_gc_ms=round(fill_gc * ms, 2),
            fill_gc_collections=fill_collections,
            churn_max_stall_ms=round(ticker.max_lag * ms, 2),
            churn_max_call_cpu_ms=round(churn_clock.max_cpu * ms, 2),
            churn_max_gc_ms=round(ticker.max_gc * ms, 2),
            churn_gc_collections=ticker.collections,
        )
    )


async def measure_traced(impl: str, target: int, endpoint_count: int) -> dict[str, Any]:
    """Fill again with ``tracemalloc`` on: traced bytes per entry (slower, so a run of its own)."""
    endpoints = [f"endpoint-{i}" for i in range(endpoint_count)]
    workload = Workload(endpoints, seed=1)
    DRIVERS[impl](8, endpoints)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    driver = DRIVERS[impl](target // endpoint_count, endpoints)
    await fill(driver, workload, target, CallClock())
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return {"traced_bytes_per_entry": round(traced / driver.entries(), 1)}


def run_worker(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One measurement in a fresh interpreter; its last stdout line is the JSON result."""
    command = [sys.executable, __file__, "--worker", json.dumps(spec)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"worker {spec} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def markdown(results: list[dict[str, Any]]) -> str:
    columns: list[tuple[str, str | tuple[str, ...]]] = [
        ("impl", "impl"),
        ("entries", "entries"),
        ("B/entry RSS", "rss_bytes_per_entry"),
        ("B/entry traced", "traced_bytes_per_entry"),
        ("B/entry nbytes", "nbytes_per_entry"),
        ("match 250 p50/p99 µs", ("match250_p50_us", "match250_p99_us")),
        ("match 31 p50/p99 µs", ("match31_p50_us", "match31_p99_us")),
        ("add 250 p50/p99 µs", ("add_p50_us", "add_p99_us")),
        ("fill: max stall / call CPU / GC ms (GCs)", FILL_STALLS),
        ("churn: max stall / call CPU / GC ms (GCs)", CHURN_STALLS),
    ]

    def cell(row: dict[str, Any], key: str | tuple[str, ...]) -> str:
        if isinstance(key, str):
            value = row.get(key)
            return "–" if value is None else str(value)
        parts = [str(row[k]) for k in key]
        return " / ".join(parts[:3]) + f" ({parts[3]})" if len(parts) == 4 else " / ".join(parts)

    lines = ["| " + " | ".join(title for title, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row, key) for _, key in columns) + " |" for row in results]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--entries", default="1000000,2000000", help="index sizes, comma-separated")
    parser.add_argument("--endpoints", type=int, default=64)
    parser.add_argument("--churn", type=int, default=4000, help="requests added to the full index")
    parser.add_argument("--lookups", type=int, default=2000, help="timed matches per prompt length")
    parser.add_argument("--impls", default="baseline,prefix,precise")
    parser.add_argument("--no-trace", action="store_true", help="skip the tracemalloc runs")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per worker")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        if spec.get("traced"):
            result = asyncio.run(measure_traced(spec["impl"], spec["entries"], spec["endpoints"]))
        else:
            result = asyncio.run(
                measure(spec["impl"], spec["entries"], spec["endpoints"], spec["churn"], spec["lookups"])
            )
        print(json.dumps(result))
        return 0
    results = []
    for entries in (int(e) for e in args.entries.split(",")):
        for impl in args.impls.split(","):
            spec = {"impl": impl, "entries": entries, "endpoints": args.endpoints}
            row = run_worker({**spec, "churn": args.churn, "lookups": args.lookups}, args.timeout)
            if not args.no_trace:
                row.update(run_worker({**spec, "traced": True}, args.timeout))
            print(json.dumps(row), file=sys.stderr, flush=True)
            results.append(row)
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
