"""The simulated engine: vLLM v1's scheduler loop over a :class:`BlockCache`, timed by a :class:`CostModel`.

Each step (as ``vllm/v1/core/sched/scheduler.py`` does it):

1. Running requests first, in admission order: a decode takes 1 token of the step's budget
   (``max_num_batched_tokens``), a partly prefilled prompt takes as much as is left (chunked prefill).
   When blocks run out, the most recently admitted running request is preempted (blocks freed, back
   to the head of the waiting queue, recomputed later) until the allocation fits.
   With the ``priority`` scheduling policy the victim is the running request with the largest
   ``(priority, arrival_time)`` instead, and it goes back into the waiting queue in that order.
2. Then, if nothing was preempted, waiting requests in their queue's order (FIFO; with the ``priority``
   policy, lowest ``(priority, arrival_time)`` first, as vLLM's heap) while the budget lasts and fewer
   than ``max_num_seqs`` run. A request scheduled for the first time looks up its longest cached
   prefix, capped at ``prompt_len - 1`` tokens (the last token is always recomputed for its logits),
   whole blocks only; those tokens are hits (``prefix_cache_queries`` += prompt tokens,
   ``prefix_cache_hits`` += hit tokens). Allocation registers the blocks it is about to compute, so
   a request scheduled after it (even in the same step) finds them.
3. The step lasts ``cost.step_s(prefill tokens, decode sequences) * time_scale``. At its end every
   request whose tokens are all computed gets one new token; a request that reached its
   ``max_tokens`` finishes and frees its blocks (tail first). KV events of the step are published.

Aborts, prefix-cache resets and new requests take effect between steps. Like vLLM's engine core, an
idle engine (no request waiting or running) runs no steps, so what a reset queues (``AllBlocksCleared``)
is published with the next step that runs: at once on a busy engine, with the next request's first step
on an idle one. The engine is single-task: all state changes happen on the event loop that runs
:meth:`Engine.run`.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Protocol

from burstsched.prefix.kv_events import KVEvent
from burstsched.sim.block_cache import BlockCache, BlockHasher
from burstsched.sim.clock import Clock
from burstsched.sim.cost_model import CostModel

log = logging.getLogger(__name__)

FinishReason = Literal["stop", "length", "abort"]
_MAX_LAG_S = 0.02


class QueueFullError(Exception):
    """The waiting queue is at its limit (HTTP 429)."""


class EngineClosedError(Exception):
    """The engine no longer accepts requests."""


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token, or the end of a request (``finish_reason`` set)."""

    token_id: int | None
    text: str
    finish_reason: FinishReason | None = None


class TokenSource(Protocol):
    """Where a request's generated tokens come from."""

    def next_token(self) -> tuple[int, str]: ...


@dataclass(eq=False)
class EngineRequest:
    """A request inside the engine, with the timestamps vLLM's metrics are made of."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    tokens: TokenSource
    finish_reason_at_max: Literal["stop", "length"] = "length"
    cache_salt: str | None = None
    lora_name: str | None = None
    arrival_time: float = 0.0
    priority: int = 0
    """Lower is served earlier, under the ``priority`` scheduling policy only (vLLM's request field)."""
    all_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    block_hashes: list[int] = field(default_factory=list)
    num_cached_tokens: int = -1
    num_cache_creation_tokens: int = 0
    num_preemptions: int = 0
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    epoch: int = 0
    queued_time: float = 0.0
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def prefill_computed_tokens(self) -> int:
        """New KV tokens computed for the prompt (``vllm:request_prefill_kv_computed_tokens``)."""
        return max(0, self.num_prompt_tokens - max(0, self.num_cached_tokens))


def _urgency(req: EngineRequest) -> tuple[int, float]:
    """The priority policy's order (vLLM's ``Request.__lt__``): lower priority value first, then arrival."""
    return (req.priority, req.arrival_time)


class EngineStats(Protocol):
    """What the engine reports, as vLLM's stat loggers receive it."""

    def prefix_cache_lookup(self, queries: int, hits: int) -> None: ...

    def preemption(self) -> None: ...

    def first_token(self, req: EngineRequest) -> None: ...

    def token(self, req: EngineRequest, interval: float | None) -> None:
        """One generated token; ``interval`` since the previous one (None for the first)."""
        ...

    def finished(self, req: EngineRequest) -> None: ...

    def step(self, num_tokens: int) -> None: ...

    def adapters(self, running: list[str], waiting: list[str], max_loras: int) -> None:
        """After each step of an engine serving LoRA adapters: the adapters of its running and waiting
        requests (each once, in queue order), as vLLM's iteration stats carry them."""
        ...


class NullStats:
    """Stats that go nowhere."""

    def prefix_cache_lookup(self, queries: int, hits: int) -> None:
        return None

    def preemption(self) -> None:
        return None

    def first_token(self, req: EngineRequest) -> None:
        return None

    def token(self, req: EngineRequest, interval: float | None) -> None:
        return None

    def finished(self, req: EngineRequest) -> None:
        return None

    def step(self, num_tokens: int) -> None:
        return None

    def adapters(self, running: list[str], waiting: list[str], max_loras: int) -> None:
        return None


EventSink = Callable[[list[KVEvent]], None]


@dataclass(slots=True)
class _Scheduled:
    req: EngineRequest
    num_new_tokens: int
    epoch: int
    is_decode: bool


@dataclass(slots=True)
class StepPlan:
    """What one step computes."""

    scheduled: list[_Scheduled] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_seqs: int = 0


@dataclass(frozen=True, slots=True)
class EngineLimits:
    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_waiting_requests: int = 0
    enable_prefix_caching: bool = True
    max_loras: int = 0
    """LoRA adapters that may run at once (0: the engine serves no adapter)."""
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    """vLLM's ``--scheduling-policy``: ``priority`` orders the waiting queue and picks preemption victims by
    each request's ``(priority, arrival_time)``."""


class Engine:
    """One replica's engine core. Start :meth:`run` as a task; stop it with :meth:`close`."""

    def __init__(
        self,
        limits: EngineLimits,
        cost: CostModel,
        *,
        clock: Clock,
        time_scale: float = 1.0,
        seed: int = 0,
        stats: EngineStats | None = None,
        event_sink: EventSink | None = None,
    ) -> None:
        self.limits = limits
        self.cost = cost
        self.time_scale = time_scale
        self.clock = clock
        self.cache = BlockCache(
            limits.num_gpu_blocks, limits.block_size, enable_caching=limits.enable_prefix_caching
        )
        self.hasher = BlockHasher(limits.block_size, seed)
        self._stats: EngineStats = stats or NullStats()
        self._sink = event_sink
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []
        self._requests: dict[str, EngineRequest] = {}
        self._aborts: set[str] = set()
        self._resets: list[tuple[bool, asyncio.Future[bool]]] = []
        self._wakeup = asyncio.Event()
        self._busy_until: float | None = None
        self._in_step = False
        self._stolen_s = 0.0  # the core's time taken by other work during the current step
        self._closed = False
        self.num_steps = 0

    # -- observation ---------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_cache_usage(self) -> float:
        return self.cache.usage

    @property
    def closed(self) -> bool:
        return self._closed

    # -- requests ------------------------------------------------------------------------------------
    def add_request(self, req: EngineRequest) -> None:
        """Queue ``req``; raises :class:`QueueFullError` past the waiting limit."""
        if self._closed:
            raise EngineClosedError("engine is stopped")
        limit = self.limits.max_waiting_requests
        if limit and len(self._waiting) >= limit:
            raise QueueFullError(f"waiting queue is full ({limit} requests)")
        if req.request_id in self._requests:
            raise ValueError(f"request id {req.request_id!r} is already in the engine")
        self.hasher.extend(req.block_hashes, req.all_token_ids, req.cache_salt)
        req.queued_time = self.clock.now()
        req.status = Status.WAITING
        self._requests[req.request_id] = req
        self._enqueue(req, at_head=False)
        self._wakeup.set()

    def abort(self, request_id: str) -> None:
        """Drop a request between steps (a client went away); its blocks are freed."""
        req = self._requests.get(request_id)
        if req is not None and req.status is not Status.FINISHED:
            self._aborts.add(request_id)
            self._wakeup.set()

    async def reset_prefix_cache(self, *, reset_running_requests: bool = False) -> bool:
        """Clear the prefix cache between steps; False while running requests hold blocks.

        With ``reset_running_requests`` the running requests are preempted first (as vLLM does). A
        successful reset queues one ``AllBlocksCleared``, published with the next engine step.
        """
        if self._closed:
            return False
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._resets.append((reset_running_requests, future))
        self._wakeup.set()
        return await future

    # -- the loop ------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Run steps until cancelled."""
        try:
            while True:
                self._between_steps()
                plan = self._schedule() if (self._running or self._waiting) else StepPlan()
                if not plan.scheduled:
                    # No step: queued events (a reset's AllBlocksCleared) wait for the next one, as in vLLM.
                    self._busy_until = None
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                step = self.cost.step_s(plan.prefill_tokens, plan.decode_seqs, len(plan.scheduled))
                duration = step * self.time_scale
                now = self.clock.now()
                # Back-to-back steps start where the last one ended, so sleep overshoot does not add up;
                # after a stall of the event loop the engine catches up at most _MAX_LAG_S.
                start = now if self._busy_until is None else max(self._busy_until, now - _MAX_LAG_S)
                end = start + duration
                self._in_step = True
                try:
                    await self.clock.sleep_until(end)
                    while self._stolen_s > 0:  # other work took the core meanwhile: the step ends later
                        end += self._stolen_s
                        self._stolen_s = 0.0
                        await self.clock.sleep_until(end)
                finally:
                    self._in_step = False
                self._busy_until = end
                self._finish_step(plan)
                self._publish()
        finally:
            self._shutdown()

    def steal(self, seconds: float) -> None:
        """Other work on the engine's core took ``seconds`` (the API server rendering ``/metrics``, when the
        two share a core): the step in progress ends that much later; an idle engine loses nothing."""
        if self._in_step:
            self._stolen_s += seconds

    def close(self) -> None:
        """Refuse new requests and end every request in flight (its stream gets ``abort``)."""
        self._shutdown()

    # -- internals -----------------------------------------------------------------------------------
    def _between_steps(self) -> None:
        for request_id in sorted(self._aborts):
            req = self._requests.get(request_id)
            if req is not None and req.status is not Status.FINISHED:
                self._end(req, "abort", notify=False)
        self._aborts.clear()
        resets, self._resets = self._resets, []
        for reset_running, future in resets:
            if reset_running:
                while self._running:
                    self._preempt(self._running[-1])
            ok = self.cache.reset()
            if not ok:
                log.warning("prefix cache reset refused: %d blocks held", self.cache.num_held_blocks)
            if not future.done():
                future.set_result(ok)

    def _schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.limits.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            while not self._allocate(req, num_new, []):
                victim = self._victim()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            if req.status is not Status.RUNNING:
                break
            self._add_to_plan(plan, req, num_new)
            budget -= num_new
            i += 1
        if preempted:
            return plan
        max_loras = self.limits.max_loras
        loras = {r.lora_name for r in self._running if r.lora_name is not None}
        skipped: list[EngineRequest] = []
        while self._waiting and budget > 0 and len(self._running) < self.limits.max_num_seqs:
            req = self._waiting[0]
            lora = req.lora_name
            if lora is not None and lora not in loras and len(loras) >= max_loras:
                skipped.append(self._waiting.popleft())  # as vLLM: another adapter would exceed max_loras
                continue
            hit_ids: list[int] = []
            if req.num_computed_tokens == 0:
                hit_ids = self.cache.longest_hit(req.block_hashes, req.num_tokens - 1)
            num_hit_tokens = len(hit_ids) * self.limits.block_size
            num_new = min(req.num_tokens - num_hit_tokens, budget)
            if not self._allocate(req, num_new, hit_ids):
                break
            self._waiting.popleft()
            if req.num_preemptions == 0:
                self._stats.prefix_cache_lookup(req.num_tokens, num_hit_tokens)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit_tokens
            if req.scheduled_time is None:
                req.scheduled_time = self.clock.now()
            req.num_computed_tokens = num_hit_tokens
            req.status = Status.RUNNING
            self._running.append(req)
            if lora is not None:
                loras.add(lora)
            self._add_to_plan(plan, req, num_new)
            budget -= num_new
        self._waiting.extendleft(reversed(skipped))
        return plan

    def _add_to_plan(self, plan: StepPlan, req: EngineRequest, num_new: int) -> None:
        last_token_only = req.num_computed_tokens + 1 == req.num_tokens
        is_decode = num_new == 1 and bool(req.output_token_ids) and last_token_only
        plan.scheduled.append(_Scheduled(req, num_new, req.epoch, is_decode))
        if is_decode:
            plan.decode_seqs += 1
        else:
            plan.prefill_tokens += num_new

    def _allocate(self, req: EngineRequest, num_new_tokens: int, hit_ids: list[int]) -> bool:
        """vLLM's ``allocate_slots``: blocks for the new tokens, then cache the blocks they fill."""
        bs = self.limits.block_size
        total = req.num_computed_tokens + len(hit_ids) * bs + num_new_tokens
        need = max(0, -(-total // bs) - len(req.block_ids) - len(hit_ids))
        if not self.cache.can_allocate(need, hit_ids):
            return False
        if hit_ids:
            self.cache.touch(hit_ids)
            req.block_ids.extend(hit_ids)
            req.num_cached_blocks = len(req.block_ids)
        req.block_ids.extend(self.cache.allocate(need))
        num_full = min(total, req.num_tokens) // bs
        start = req.num_cached_blocks
        if num_full > start and self.cache.enable_caching:
            self.hasher.extend(req.block_hashes, req.all_token_ids, req.cache_salt)
            self.cache.cache_blocks(
                req.block_ids[start:num_full],
                req.block_hashes[start:num_full],
                req.all_token_ids[start * bs : num_full * bs],
                req.block_hashes[start - 1] if start else None,
            )
            req.num_cached_blocks = num_full
        return True

    def _preempt(self, req: EngineRequest) -> None:
        self._running.remove(req)
        self._free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.epoch += 1
        req.status = Status.WAITING
        self._enqueue(req, at_head=True)
        self._stats.preemption()

    def _by_priority(self) -> bool:
        return self.limits.scheduling_policy == "priority"

    def _victim(self) -> EngineRequest:
        """The running request to preempt: the last admitted (FCFS), or the least urgent (priority)."""
        if self._by_priority():
            return max(self._running, key=_urgency)
        return self._running[-1]

    def _enqueue(self, req: EngineRequest, *, at_head: bool) -> None:
        """Into the waiting queue: at its tail (new) or head (preempted) under FCFS; in
        ``(priority, arrival_time)`` order under the priority policy."""
        if self._by_priority():
            bisect.insort_right(self._waiting, req, key=_urgency)
        elif at_head:
            self._waiting.appendleft(req)
        else:
            self._waiting.append(req)

    def _free(self, req: EngineRequest) -> None:
        self.cache.free(reversed(req.block_ids))
        req.block_ids = []
        req.num_cached_blocks = 0

    def _finish_step(self, plan: StepPlan) -> None:
        self.num_steps += 1
        tokens = 0
        for item in plan.scheduled:
            req = item.req
            if req.status is not Status.RUNNING or req.epoch != item.epoch:
                continue
            tokens += item.num_new_tokens
            req.num_computed_tokens += item.num_new_tokens
            if req.num_computed_tokens < req.num_tokens:
                continue
            token_id, text = req.tokens.next_token()
            first = not req.output_token_ids
            req.output_token_ids.append(token_id)
            req.all_token_ids.append(token_id)
            self.hasher.extend(req.block_hashes, req.all_token_ids, req.cache_salt)
            now = self.clock.now()
            previous = req.last_token_time
            if first:
                req.first_token_time = now
                req.num_cache_creation_tokens = self._cache_creation_tokens(req)
                self._stats.first_token(req)
            req.last_token_time = now
            self._stats.token(req, None if previous is None else now - previous)
            if len(req.output_token_ids) >= req.max_tokens:
                req.events.put_nowait(TokenEvent(token_id, text, req.finish_reason_at_max))
                self._end(req, req.finish_reason_at_max, notify=False)
            else:
                req.events.put_nowait(TokenEvent(token_id, text))
        self._stats.step(tokens)
        if self.limits.max_loras:
            self._stats.adapters(
                _adapter_names(self._running), _adapter_names(self._waiting), self.limits.max_loras
            )

    def _cache_creation_tokens(self, req: EngineRequest) -> int:
        """vLLM's ``num_cache_creation_tokens`` at the first token: prompt tokens in the request's cached
        full blocks, less its hits."""
        cached = min(req.num_cached_blocks * self.limits.block_size, req.num_prompt_tokens)
        return max(0, cached - max(0, req.num_cached_tokens))

    def _end(self, req: EngineRequest, reason: FinishReason, *, notify: bool) -> None:
        if req.status is Status.RUNNING:
            self._running.remove(req)
        elif req.status is Status.WAITING:
            self._waiting.remove(req)
        self._free(req)
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.finished_time = self.clock.now()
        req.epoch += 1
        self._requests.pop(req.request_id, None)
        if reason != "abort":
            self._stats.finished(req)
        if notify:
            req.events.put_nowait(TokenEvent(None, "", reason))

    def _publish(self) -> None:
        events = self.cache.take_events()
        if events and self._sink is not None:
            self._sink(events)

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for req in list(self._requests.values()):
            if req.status is not Status.FINISHED:
                self._end(req, "abort", notify=True)
        for _, future in self._resets:
            if not future.done():
                future.set_result(False)
        self._resets.clear()


def _adapter_names(requests: Iterable[EngineRequest]) -> list[str]:
    """The LoRA adapters of ``requests``, each once, in order."""
    return list(dict.fromkeys(r.lora_name for r in requests if r.lora_name is not None))
