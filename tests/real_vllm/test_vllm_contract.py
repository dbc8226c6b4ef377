"""Contract tests: each runs once on the simulator and once on real vLLM (`backend` is parametrized).

Real vLLM is the reference: where the simulator still differs, the test is marked xfail (strict) for it,
naming the difference, so fixing the simulator turns the mark into a failure that asks for its removal.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
import zmq
import zmq.asyncio

from burstsched.prefix.kv_events import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockStored,
    KVEventMessage,
    decode_batch,
    decode_seq,
    encode_seq,
)
from burstsched.testing.backends import (
    Backend,
    Sample,
    kv_subscriber,
    metric_samples,
    next_message,
    settled_samples,
    sse_chunks,
    tokenize,
    total,
)
from burstsched.workloads.contexts import context_text

pytestmark = pytest.mark.anyio

MAX_TOKENS = 4
# A request that must still be running when a test looks: several seconds of generation on the CPU replica
# (~400-600 tokens/s measured); it is aborted as soon as the test is done with it.
RUNNING_MAX_TOKENS = 4096
STATE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Deltas:
    """A request's usage and what it added to the replica's counters."""

    prompt_tokens: int
    cached_tokens: int | None
    queries: float
    hits: float
    computed: float
    computed_count: float
    finished_length: float


def _chat(backend: Backend, content: str, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    return {
        "model": backend.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _completion(backend: Backend, prompt: str | list[int], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    return {
        "model": backend.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _delta(after: list[Sample], before: list[Sample], name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


async def _measured(client: httpx.AsyncClient, backend: Backend, path: str, body: dict[str, Any]) -> Deltas:
    before = await metric_samples(client, backend)
    chunks, done = await sse_chunks(client, f"{backend.url}{path}", body)
    assert done
    after = await settled_samples(client, backend, before, 1)
    usage = chunks[-1]["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return Deltas(
        prompt_tokens=usage["prompt_tokens"],
        cached_tokens=details.get("cached_tokens"),
        queries=_delta(after, before, "vllm:prefix_cache_queries_total"),
        hits=_delta(after, before, "vllm:prefix_cache_hits_total"),
        computed=_delta(after, before, "vllm:request_prefill_kv_computed_tokens_sum"),
        computed_count=_delta(after, before, "vllm:request_prefill_kv_computed_tokens_count"),
        finished_length=_delta(after, before, "vllm:request_success_total", finished_reason="length"),
    )


async def _reset(client: httpx.AsyncClient, backend: Backend) -> httpx.Response:
    response = await client.post(f"{backend.url}/reset_prefix_cache")
    assert response.status_code == 200, response.text
    return response


def _expected_hit(cached_sequence: list[int], prompt: list[int], block_size: int) -> int:
    """vLLM's hit: whole blocks of the common prefix, never the prompt's last token."""
    common = 0
    for a, b in zip(cached_sequence, prompt, strict=False):
        if a != b:
            break
        common += 1
    return min(common, len(prompt) - 1) // block_size * block_size


async def _replica_state(
    client: httpx.AsyncClient, backend: Backend, holds: Callable[[float, float], bool], timeout_s: float
) -> None:
    """Poll the replica's gauges until ``holds(running, waiting)`` (bounded: fails after ``timeout_s``)."""
    with anyio.fail_after(timeout_s):
        while True:
            samples = await metric_samples(client, backend)
            running = total(samples, "vllm:num_requests_running")
            if holds(running, total(samples, "vllm:num_requests_waiting")):
                return
            await anyio.sleep(0.05)


@asynccontextmanager
async def _running_request(client: httpx.AsyncClient, backend: Backend) -> AsyncIterator[None]:
    """A streamed request the replica counts as running while the body runs; gone when the body ends.

    The body starts once ``vllm:num_requests_running`` shows it (not after a guessed sleep), and with
    RUNNING_MAX_TOKENS it keeps generating for seconds after that. Leaving the stream unread aborts the
    request; the exit waits until the replica is idle again, so the next test finds no request of ours.
    """
    body = _completion(backend, context_text("contract-running", 5, 0), max_tokens=RUNNING_MAX_TOKENS)
    async with client.stream("POST", f"{backend.url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        await _replica_state(client, backend, lambda running, _: running >= 1, STATE_TIMEOUT_S)
        yield
    await _replica_state(client, backend, lambda running, waiting: running == waiting == 0, STATE_TIMEOUT_S)


async def test_tokenize_prompt_and_messages(backend: Backend) -> None:
    text = "The replica cache held 42 blocks after the 3rd burst."
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(f"{backend.url}/tokenize", json={"model": backend.model, "prompt": text})
        assert response.status_code == 200
        body = response.json()
        assert body["count"] == len(body["tokens"]) > 0
        assert body["max_model_len"] == 8192
        chat = await tokenize(client, backend, messages=[{"role": "user", "content": text}])
    assert len(chat) > body["count"]


async def test_unknown_model_is_404(backend: Backend) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"{backend.url}/v1/completions", json={"model": "no-such-model", "prompt": "hi", "max_tokens": 1}
        )
    assert response.status_code == 404
    assert response.json()["error"]["param"] == "model"


async def test_chat_stream_shape_with_usage(backend: Backend) -> None:
    content = "Which host looks worst?"
    async with httpx.AsyncClient(timeout=60) as client:
        prompt = await tokenize(client, backend, messages=[{"role": "user", "content": content}])
        chunks, done = await sse_chunks(client, f"{backend.url}/v1/chat/completions", _chat(backend, content))
    assert done
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["model"] == backend.model for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
    assert finishes == ["length"]
    assert [i for i, c in enumerate(chunks) if c.get("usage")] == [len(chunks) - 1]
    last = chunks[-1]
    assert last["choices"] == []
    usage = last["usage"]
    assert usage["prompt_tokens"] == len(prompt)
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["total_tokens"] == len(prompt) + MAX_TOKENS
    assert usage["prompt_tokens_details"]["cached_tokens"] % backend.block_size == 0
    texts = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert 1 <= len([t for t in texts if t]) <= MAX_TOKENS


async def test_completions_stream_shape_with_usage(backend: Backend) -> None:
    text = "Observation 7: the queue depth rose"
    async with httpx.AsyncClient(timeout=60) as client:
        prompt = await tokenize(client, backend, prompt=text)
        chunks, done = await sse_chunks(client, f"{backend.url}/v1/completions", _completion(backend, text))
    assert done
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert len({c["id"] for c in chunks}) == 1
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
    assert finishes == ["length"]
    assert all(isinstance(c["choices"][0]["text"], str) for c in chunks[:-1])
    last = chunks[-1]
    assert last["choices"] == []
    assert last["usage"]["prompt_tokens"] == len(prompt)
    assert last["usage"]["completion_tokens"] == MAX_TOKENS
    assert last["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_prefix_cache_counters_per_request(backend: Backend) -> None:
    bs = backend.block_size
    context = context_text("contract-deltas", 10, 0)
    first, second = context + "\nQuestion: What changed first?", context + "\nQuestion: Who should be paged?"
    async with httpx.AsyncClient(timeout=60) as client:
        await _reset(client, backend)
        ids1 = await tokenize(client, backend, messages=[{"role": "user", "content": first}])
        ids2 = await tokenize(client, backend, messages=[{"role": "user", "content": second}])
        assert len(ids1) > 3 * bs

        cold = await _measured(client, backend, "/v1/chat/completions", _chat(backend, first))
        assert (cold.prompt_tokens, cold.cached_tokens) == (len(ids1), 0)
        assert (cold.queries, cold.hits, cold.computed) == (len(ids1), 0, len(ids1))
        assert (cold.computed_count, cold.finished_length) == (1, 1)

        warm = await _measured(client, backend, "/v1/chat/completions", _chat(backend, second))
        expected = _expected_hit(ids1, ids2, bs)
        assert expected >= 3 * bs
        assert (warm.prompt_tokens, warm.cached_tokens) == (len(ids2), expected)
        assert (warm.queries, warm.hits, warm.computed) == (len(ids2), expected, len(ids2) - expected)

        again = await _measured(client, backend, "/v1/chat/completions", _chat(backend, second))
        expected = (len(ids2) - 1) // bs * bs
        assert (again.cached_tokens, again.hits, again.computed) == (expected, expected, len(ids2) - expected)


async def test_last_full_block_is_recomputed(backend: Backend) -> None:
    """A prompt of exactly k blocks, fully cached, hits k-1 blocks: vLLM always computes the last token."""
    bs = backend.block_size
    async with httpx.AsyncClient(timeout=60) as client:
        await _reset(client, backend)
        ids = (await tokenize(client, backend, prompt=context_text("contract-exact", 16, 0)))[: 2 * bs]
        assert len(ids) == 2 * bs
        cold = await _measured(client, backend, "/v1/completions", _completion(backend, ids, 1))
        warm = await _measured(client, backend, "/v1/completions", _completion(backend, ids, 1))
    assert (cold.hits, cold.computed, cold.cached_tokens) == (0, 2 * bs, 0)
    assert (warm.queries, warm.hits, warm.computed, warm.cached_tokens) == (2 * bs, bs, bs, bs)


async def test_metrics_the_scheduler_reads(backend: Backend) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        await sse_chunks(client, f"{backend.url}/v1/completions", _completion(backend, "warm up"))
        samples = await settled_samples(client, backend, [], 1)
    names = {s.name for s in samples}
    required = {
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:request_success_total",
        "vllm:request_prefill_kv_computed_tokens_sum",
        "vllm:request_prefill_kv_computed_tokens_count",
        "vllm:request_prefill_kv_computed_tokens_bucket",
    }
    assert required <= names, sorted(required - names)
    assert "vllm:gpu_cache_usage_perc" not in names
    info = [s for s in samples if s.name == "vllm:cache_config_info"]
    assert len(info) == 1 and info[0].value == 1
    assert info[0].labels["block_size"] == str(backend.block_size)
    assert info[0].labels["num_gpu_blocks"] == str(backend.num_gpu_blocks)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        gauges = [s for s in samples if s.name == name]
        assert len(gauges) == 1 and gauges[0].labels["model_name"] == backend.model
        assert gauges[0].value == 0  # idle: cached blocks nobody holds count as free
    reasons = {s.labels.get("finished_reason") for s in samples if s.name == "vllm:request_success_total"}
    assert {"stop", "length", "abort"} <= reasons


async def test_gauges_while_a_request_runs(backend: Backend) -> None:
    async with httpx.AsyncClient(timeout=60) as client, _running_request(client, backend):
        samples = await metric_samples(client, backend)
    assert total(samples, "vllm:num_requests_running") == 1
    assert total(samples, "vllm:num_requests_waiting") == 0
    usage = total(samples, "vllm:kv_cache_usage_perc")
    held = usage * (backend.num_gpu_blocks - 1)  # block 0 is reserved
    assert 0 < usage <= 1
    assert held == pytest.approx(round(held), abs=1e-6) and round(held) >= 2


async def test_reset_prefix_cache_forgets_blocks(backend: Backend) -> None:
    text = context_text("contract-reset", 6, 0)
    async with httpx.AsyncClient(timeout=60) as client:
        await _reset(client, backend)
        await _measured(client, backend, "/v1/completions", _completion(backend, text))
        warm = await _measured(client, backend, "/v1/completions", _completion(backend, text))
        assert warm.hits > 0 and warm.cached_tokens == warm.hits
        await _reset(client, backend)
        cold = await _measured(client, backend, "/v1/completions", _completion(backend, text))
    assert (cold.hits, cold.cached_tokens, cold.computed) == (0, 0, cold.prompt_tokens)


async def test_reset_prefix_cache_reports_success(backend: Backend) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        idle = await client.post(f"{backend.url}/reset_prefix_cache")
        async with _running_request(client, backend):
            busy = await client.post(f"{backend.url}/reset_prefix_cache")
            during = await metric_samples(client, backend)
        after = await client.post(f"{backend.url}/reset_prefix_cache")
    # Running before the reset was sent and still running once it answered: it was judged while busy.
    assert total(during, "vllm:num_requests_running") == 1
    assert (idle.status_code, idle.json()) == (200, {"success": True})
    assert (busy.status_code, busy.json()) == (200, {"success": False})
    assert (after.status_code, after.json()) == (200, {"success": True})


async def _collect(sock: Any, until: Any, timeout_s: float = 10.0) -> list[KVEventMessage]:
    messages: list[KVEventMessage] = []
    with anyio.fail_after(timeout_s):
        while not until(messages):
            message = await next_message(sock, timeout_s)
            if message is not None:
                messages.append(message)
    return messages


def _stored(messages: list[KVEventMessage]) -> list[BlockStored]:
    return [e for m in messages for e in m.batch.events if isinstance(e, BlockStored)]


async def test_kv_events_decode(backend: Backend) -> None:
    bs = backend.block_size
    assert backend.kv_events_endpoint is not None
    async with httpx.AsyncClient(timeout=60) as client, kv_subscriber(backend.kv_events_endpoint) as sock:
        await _reset(client, backend)
        # A SUB socket misses what is published before it has joined: send one-block requests until one shows.
        for attempt in range(20):
            join = [3000 + attempt, *range(100, 100 + bs + 1)]
            await sse_chunks(client, f"{backend.url}/v1/completions", _completion(backend, join, 1))
            if await next_message(sock, 1.0) is not None:
                break
        else:
            raise AssertionError("no KV event reached the subscriber")
        while await next_message(sock, 0.5) is not None:
            pass

        ids = (await tokenize(client, backend, prompt=context_text("contract-kv", 16, 0)))[: 3 * bs + 44]
        assert len(ids) == 3 * bs + 44
        await sse_chunks(client, f"{backend.url}/v1/completions", _completion(backend, ids, 1))
        messages = await _collect(sock, lambda ms: sum(len(e.block_hashes) for e in _stored(ms)) >= 3)

        await _reset(client, backend)
        await sse_chunks(client, f"{backend.url}/v1/completions", _completion(backend, "next step", 1))
        cleared = await _collect(
            sock, lambda ms: any(isinstance(e, AllBlocksCleared) for m in ms for e in m.batch.events)
        )

    stored = _stored(messages)
    assert sum(len(e.block_hashes) for e in stored) == 3
    assert [t for e in stored for t in e.token_ids] == ids[: 3 * bs]
    assert all(e.block_size == bs and len(e.token_ids) == len(e.block_hashes) * bs for e in stored)
    assert all(e.medium == "GPU" for e in stored)
    assert stored[0].parent_block_hash is None
    for parent, child in zip(stored, stored[1:], strict=False):
        assert child.parent_block_hash == parent.block_hashes[-1]
    hashes = [h for e in stored for h in e.block_hashes]
    assert len(set(hashes)) == 3 and all(0 <= h < 2**64 for h in hashes)
    seqs = [m.seq for m in messages + cleared]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


async def test_all_blocks_cleared_goes_out_with_the_next_step(backend: Backend) -> None:
    assert backend.kv_events_endpoint is not None
    async with httpx.AsyncClient(timeout=60) as client, kv_subscriber(backend.kv_events_endpoint) as sock:
        for attempt in range(20):  # join: see the event of a new one-block prompt
            join = [3100 + attempt, *range(300, 300 + backend.block_size + 1)]
            await sse_chunks(client, f"{backend.url}/v1/completions", _completion(backend, join, 1))
            if await next_message(sock, 1.0) is not None:
                break
        else:
            raise AssertionError("no KV event reached the subscriber")
        while await next_message(sock, 0.5) is not None:
            pass
        await _reset(client, backend)
        await _reset(client, backend)
        before_step = await next_message(sock, 1.0)
        await sse_chunks(client, f"{backend.url}/v1/completions", _completion(backend, "next step", 1))
        with_step = await next_message(sock, 10.0)
    assert before_step is None
    assert with_step is not None
    assert [type(e) for e in with_step.batch.events] == [AllBlocksCleared, AllBlocksCleared]


async def test_kv_event_replay_answers_with_the_topic_frame(backend: Backend) -> None:
    """A DEALER asking the replay socket from 0 gets ``[b"", topic, seq, payload]`` per buffered batch, then
    ``[b"", b"", -1, b""]`` (vLLM 0.32's frames; the router's event stream reads them)."""
    assert backend.kv_events_endpoint is not None and backend.kv_replay_endpoint is not None
    async with httpx.AsyncClient(timeout=60) as client, kv_subscriber(backend.kv_events_endpoint) as sock:
        for attempt in range(20):  # until the subscription has joined and seen a batch
            prompt = [4000 + attempt, *range(200, 200 + backend.block_size + 1)]
            await sse_chunks(client, f"{backend.url}/v1/completions", _completion(backend, prompt, 1))
            seen = await next_message(sock, 1.0)
            if seen is not None:
                break
        else:
            raise AssertionError("no KV event reached the subscriber")
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(backend.kv_replay_endpoint)
    try:
        await dealer.send_multipart([b"", encode_seq(0)])
        answers = []
        with anyio.fail_after(10):
            while True:
                frames = await dealer.recv_multipart()
                answers.append(frames)
                if decode_seq(frames[-2]) == REPLAY_END_SEQ:
                    break
    finally:
        dealer.close(linger=0)
        ctx.term()
    *batches, end = answers
    assert end == [b"", b"", encode_seq(REPLAY_END_SEQ), b""]
    assert batches and all(len(frames) == 4 and frames[0] == b"" for frames in batches)
    assert {frames[1] for frames in batches} == {seen.topic.encode()}
    seqs = [decode_seq(frames[2]) for frames in batches]
    assert seqs == sorted(seqs) and seen.seq in seqs
    assert all(decode_batch(frames[3]).events for frames in batches)
