"""Mixed requests through a real Envoy with ``burstsched epp``: every response byte-identical to the same
request sent to the replica directly, none lost.

    python loadtests/epp_identity.py [--backend sim|vllm] [--requests 1000] [--concurrency 16]
                                     [--max-prompt-bytes 200000] [--max-tokens 64] [--cancel 0.1]
                                     [--mode full-duplex|buffered] [--replica-cpu-quota C] [--json PATH]

Simulated replicas at temperature 0 (their output is a function of the prompt, whichever replica serves it).
The mix: chat and completions, streamed and not, prompts of log-uniform size up to ``--max-prompt-bytes``
(a few at the maximum), and a fraction ``--cancel`` cancelled by the client (streams after their first
chunk, whole requests after a few milliseconds). Every request carries its own ``x-request-id``, so the
response's id is the same both ways; each completed response is then sent again, with the same id, straight
to the replica that served it (``x-burstsched-endpoint``), and the two are compared byte for byte, status,
content type and body. The only field masked is ``created`` (whole seconds of the wall clock, which may
tick between the two). ``prompt_tokens_details`` is off on the replicas, as vLLM's default: its
``cached_tokens`` says what the replica's cache held, which differs on a second sending.

Lost: a request not cancelled whose response is not a complete 200 (a stream must end with ``[DONE]``).
At the end no replica may still run or queue a request (the cancellations reached them).

``--backend vllm``: two real vLLM replicas of the project's tiny model (CPU; ``--replica-cpu-quota`` caps
each), ``prompt_tokens_details`` off as above. Their context is short (``max_model_len`` 8192 tokens), so
prompts are log-uniform from 64 B to ``--max-prompt-bytes`` (default 9000 B, inside the context; every 50th
at that maximum), and every 50th request (index 7 modulo 50) is over the context on purpose
(``--over-context-bytes``, log-uniform, default 12 KB to 200 KB): vLLM answers it with a 400, a legitimate
answer that must be byte-identical too, counted apart. Before the run every prompt is counted by the
replica's own ``POST /tokenize`` (the chat template applied), which says which requests are over the
context and gives the tokenizer's bytes per token. A real engine's answers may still differ between two
sendings: at temperature 0 the text itself (batching and a prefix-cache hit change the numerics), and a
stream's split of the text over its SSE events (vLLM puts every token it has ready into one event when
its output loop is behind). A difference is counted, never hidden (:func:`compare`): ``regrouped`` (a
stream, the same text split otherwise over the events), ``text_only`` (byte-identical once the generated
text is emptied: ids, usage, finish reasons equal) or a mismatch (anything else). Each pair that is not
byte-identical is sent straight to the replica once more, a control: do the replica's own two answers
differ too? The exit status fails on a mismatch or a lost request on either backend, and on any
difference on the simulator (deterministic there).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx

from burstsched.sim import SimConfig, SimPool
from burstsched.workloads.docqa import common_prefix_length
from burstsched.workloads.gateway import EnvoyMode, gateway_process

MODEL = "kv-demo"
_CREATED = re.compile(rb'"created": ?\d+')
MODES = {
    "full-duplex": EnvoyMode(),
    "buffered": EnvoyMode(request_body="BUFFERED", response_body="NONE"),
}
Verdict = Literal["identical", "regrouped", "text_only", "different"]
DEFAULTS = {  # per backend: --max-prompt-bytes, --max-tokens, --over-context-bytes
    "sim": (200_000, 64, None),
    "vllm": (9_000, 32, (12_000, 200_000)),
}


@dataclass(frozen=True, slots=True)
class Spec:
    """One request of the mix."""

    index: int
    path: str
    body: dict[str, Any]
    stream: bool
    cancel: bool
    prompt_bytes: int
    over_context: bool = False
    """Made longer than the model's context on purpose (real vLLM)."""

    @property
    def request_id(self) -> str:
        return f"ident-{self.index}-{uuid.uuid5(uuid.NAMESPACE_URL, str(self.index)).hex[:12]}"

    @property
    def kind(self) -> str:
        return ("chat" if "messages" in self.body else "completions") + ("-stream" * self.stream)


@dataclass(slots=True)
class Outcome:
    spec: Spec
    status: int = 0
    content_type: str = ""
    body: bytes = b""
    endpoint: str | None = None
    cancelled: bool = False
    """The client went away before the response's end."""
    error: str | None = None
    latency_s: float = 0.0

    @property
    def complete(self) -> bool:
        if self.status != 200 or self.error is not None or self.cancelled:
            return False
        return not self.spec.stream or self.body.rstrip().endswith(b"data: [DONE]")

    @property
    def context_refused(self) -> bool:
        """A whole 400 answer saying the prompt is longer than the model's context."""
        return (
            self.status == 400
            and self.error is None
            and not self.cancelled
            and b"maximum context length" in self.body
        )


@dataclass(slots=True)
class Report:
    requests: int = 0
    backend: str = "sim"
    cancelled_asked: int = 0
    cancelled_cut: int = 0
    """Cancelled requests whose response was cut by the client before its end."""
    completed: int = 0
    over_context_asked: int = 0
    """Requests made longer than the context on purpose (not cancelled ones included)."""
    over_context_cancelled: int = 0
    """Of those, cancelled by the client."""
    over_context_refused: int = 0
    """Of those not cancelled, answered with vLLM's 400 (compared like the others)."""
    compared: int = 0
    identical: int = 0
    regrouped: list[str] = field(default_factory=list)
    """Streams with the same generated text split otherwise over the events."""
    verdicts: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per kind of request (``chat-stream``, ``completions``, ..., and ``over-context``), each comparison's
    verdict (see :func:`compare`) and how many."""
    control: dict[str, int] = field(default_factory=dict)
    """Each pair that is not byte-identical is sent a second time straight to the same replica: how the
    replica's two direct answers compare, by the verdict of the pair (``<pair's verdict> / <control's>``)."""
    text_only: list[str] = field(default_factory=list)
    """Differences in the generated text alone (ids, usage, finish reasons, event count equal)."""
    lost: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    by_kind: dict[str, int] = field(default_factory=dict)
    largest_prompt_bytes: int = 0
    prompt_tokens: dict[str, Any] = field(default_factory=dict)
    """Real vLLM: the replica's own token counts (``POST /tokenize``) of the prompts and its context."""
    replicas_busy_after: dict[str, float] = field(default_factory=dict)
    served_by: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    latency_s: dict[str, float] = field(default_factory=dict)
    """Through the gateway, requests that completed (or were refused for their length): p50, p95, max."""

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _text(rng: random.Random, n_bytes: int, tag: str) -> str:
    words, size = [f"doc-{tag}"], len(tag) + 4
    while size < n_bytes:
        words.append(f"note{rng.randrange(10**9):09d}")
        size += len(words[-1]) + 1
    return " ".join(words)[:n_bytes]


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def make_specs(
    count: int,
    max_prompt_bytes: int,
    cancel: float,
    seed: int,
    *,
    max_tokens: int = 64,
    over_context_bytes: tuple[int, int] | None = None,
) -> list[Spec]:
    """The mix: APIs and streaming evenly, log-uniform prompt sizes from 64 B (every 50th at the maximum),
    ``max_tokens`` from 1 to ``max_tokens``. With ``over_context_bytes`` (low, high), the request of index 7
    modulo 50 is instead over the context (log-uniform in that range), and that of index 32 modulo 50 at the
    maximum. Without it the draws are those of the simulator's runs before the option existed."""
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        chat, stream = rng.random() < 0.5, rng.random() < 0.5
        over = over_context_bytes is not None and i % 50 == 7
        if over and over_context_bytes is not None:
            size = _log_uniform(rng, *over_context_bytes)
        elif i % 50 == (7 if over_context_bytes is None else 32):
            size = max_prompt_bytes
        else:
            size = _log_uniform(rng, 64, max_prompt_bytes)
        text = _text(rng, size, f"{seed}-{i}")
        body: dict[str, Any] = {"model": MODEL, "max_tokens": rng.randint(1, max_tokens), "temperature": 0}
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if stream:
            body["stream"] = True
        path = "/v1/chat/completions" if chat else "/v1/completions"
        specs.append(Spec(i, path, body, stream, rng.random() < cancel, len(text), over))
    return specs


async def send(client: httpx.AsyncClient, base_url: str, spec: Spec, *, cancel: bool) -> Outcome:
    """One request; with ``cancel`` the client leaves after the first chunk (a stream) or a few ms."""
    outcome = Outcome(spec)
    started = time.perf_counter()
    headers = {"x-request-id": spec.request_id}
    try:
        if cancel and not spec.stream:
            with anyio.move_on_after(0.005 + 0.02 * (spec.index % 5) / 4) as scope:
                response = await client.post(base_url + spec.path, json=spec.body, headers=headers)
                outcome.status, outcome.body = response.status_code, response.content
            outcome.cancelled = scope.cancelled_caught
            return outcome
        async with client.stream("POST", base_url + spec.path, json=spec.body, headers=headers) as response:
            outcome.status = response.status_code
            outcome.content_type = response.headers.get("content-type", "")
            outcome.endpoint = response.headers.get("x-burstsched-endpoint")
            chunks = []
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                if cancel:
                    outcome.cancelled = True
                    break
            outcome.body = b"".join(chunks)
    except httpx.HTTPError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.latency_s = time.perf_counter() - started
    return outcome


def _masked(body: bytes) -> bytes:
    return _CREATED.sub(b'"created":0', body)


def same(a: Outcome, b: Outcome) -> bool:
    return a.status == b.status and a.content_type == b.content_type and _masked(a.body) == _masked(b.body)


_TEXT_FIELDS = ("text", "content", "reasoning_content", "reasoning")
_TEXT_VALUE = re.compile(rb'"(' + b"|".join(f.encode() for f in _TEXT_FIELDS) + rb')": ?"(?:[^"\\]|\\.)*"')


def _blank_bytes(body: bytes) -> bytes:
    """``body`` with ``created`` masked and every generated-text string emptied, in place, byte for byte."""
    return _TEXT_VALUE.sub(rb'"\1":""', _masked(body))


def _blank_text(holder: dict[str, Any], index: int, texts: dict[int, str]) -> dict[str, Any]:
    blanked = dict(holder)
    for key in _TEXT_FIELDS:
        if isinstance(blanked.get(key), str):
            texts[index] = texts.get(index, "") + blanked[key]
            blanked[key] = ""
    return blanked


def _blank_generated(document: Any, texts: dict[int, str]) -> Any:
    """``document`` (one JSON body or stream event) with each choice's generated text (and logprobs)
    blanked; the text is appended to ``texts`` by choice index."""
    if not isinstance(document, dict) or not isinstance(document.get("choices"), list):
        return document
    choices = []
    for choice in document["choices"]:
        if not isinstance(choice, dict):
            choices.append(choice)
            continue
        index = int(choice.get("index", 0))
        blanked = _blank_text(choice, index, texts)
        for nested in ("message", "delta"):
            if isinstance(blanked.get(nested), dict):
                blanked[nested] = _blank_text(blanked[nested], index, texts)
        if blanked.get("logprobs") is not None:
            blanked["logprobs"] = "(blanked)"
        choices.append(blanked)
    return {**document, "choices": choices}


def structure(body: bytes, stream: bool) -> tuple[Any, dict[int, str]] | None:
    """The body with ``created`` masked and the generated text blanked, and that text per choice; None
    when it does not parse (a stream's events, ``[DONE]`` kept as such, each parsed)."""
    texts: dict[int, str] = {}
    try:
        if not stream:
            return _blank_generated(json.loads(_masked(body)), texts), texts
        events: list[Any] = []
        for event in _masked(body).split(b"\n\n"):
            if not event.strip():
                continue
            if not event.startswith(b"data: "):
                return None
            payload = event[len(b"data: ") :]
            events.append("[DONE]" if payload == b"[DONE]" else _blank_generated(json.loads(payload), texts))
        return events, texts
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        return None


def _collapsed(items: Sequence[Any]) -> list[Any]:
    """``items`` with each run of equal consecutive items kept once."""
    kept: list[Any] = []
    for item in items:
        if not kept or kept[-1] != item:
            kept.append(item)
    return kept


def _is_token_event(payload: bytes) -> bool:
    """A stream event that only carries generated text: no role, no finish reason, no usage."""
    try:
        document = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    if not isinstance(document, dict) or document.get("usage") or not document.get("choices"):
        return False
    texts: dict[int, str] = {}
    _blank_generated(document, texts)
    return any(texts.values()) and all(
        isinstance(c, dict)
        and c.get("finish_reason") is None
        and "role" not in (c.get("delta") or {})
        and "usage" not in c
        for c in document["choices"]
    )


def _shape(body: bytes, stream: bool) -> tuple[list[bytes], set[bytes]]:
    """The body byte for byte with ``created`` masked and the generated text emptied. A stream: its
    events so, without those that only carry text, and apart the set of shapes of those (one when every
    token event is alike): the engine may fold such events into the next one."""
    blank = _blank_bytes(body)
    if not stream:
        return [blank], set()
    kept: list[bytes] = []
    tokens: set[bytes] = set()
    raw = [event for event in _masked(body).split(b"\n\n") if event.strip()]
    blanked = [event for event in blank.split(b"\n\n") if event.strip()]
    if len(raw) != len(blanked):
        return blanked, set()
    for event, shape in zip(raw, blanked, strict=True):
        if event.startswith(b"data: ") and _is_token_event(event[len(b"data: ") :]):
            tokens.add(shape)
        else:
            kept.append(shape)
    return kept, tokens


def compare(a: Outcome, b: Outcome) -> tuple[Verdict, str]:
    """How ``a`` and ``b`` compare, with a line saying how:

    - ``identical``: byte for byte, ``created`` masked;
    - ``regrouped`` (streams): the same generated text and the same bytes around it, but the text split
      otherwise over the SSE events: every event that only carries text (no role, finish reason or usage)
      has one shape once its text is emptied, and the other events are byte-identical once emptied (the
      engine put several tokens in one event, or folded them into the last);
    - ``text_only``: the same, but the generated text differs (ids, usage and finish reasons equal);
    - ``different``: anything else."""
    if same(a, b):
        return "identical", ""
    head = f"via {a.status} {len(a.body)} B, direct {b.status} {len(b.body)} B"
    if a.status != b.status or a.content_type != b.content_type:
        return "different", f"{head}; status or content type ({a.content_type!r} / {b.content_type!r})"
    left, right = structure(a.body, a.spec.stream), structure(b.body, b.spec.stream)
    (kept_a, tokens_a), (kept_b, tokens_b) = _shape(a.body, a.spec.stream), _shape(b.body, b.spec.stream)
    if kept_a != kept_b or len(tokens_a | tokens_b) > 1 or left is None or right is None:
        return "different", f"{head}; first via {a.body[:160]!r} / direct {b.body[:160]!r}"
    if a.spec.stream:
        head += f", {len(left[0])}/{len(right[0])} events"
    if left[1] == right[1]:
        if a.spec.stream:
            return "regrouped", f"{head}; the same text split otherwise over the events"
        return (
            "different",
            f"{head}; the same text, other bytes: via {a.body[:160]!r} / direct {b.body[:160]!r}",
        )
    texts = []
    for index in sorted(set(left[1]) | set(right[1])):
        one, two = left[1].get(index, ""), right[1].get(index, "")
        texts.append(
            f"choice {index}: {len(one)}/{len(two)} chars, first {common_prefix_length(one, two)} equal"
        )
    return "text_only", f"{head}; only the generated text differs ({'; '.join(texts)})"


async def _busy(client: httpx.AsyncClient, urls: Sequence[str], names: Sequence[str]) -> dict[str, float]:
    """Each replica's running + waiting requests (from its /metrics)."""
    busy = {}
    for name, url in zip(names, urls, strict=True):
        text = (await client.get(url + "/metrics")).text
        busy[name] = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
        )
    return busy


@asynccontextmanager
async def sim_pool(replicas: int, time_scale: float) -> AsyncIterator[SimPool]:
    config = SimConfig(
        time_scale=time_scale,
        num_gpu_blocks=16384,
        max_model_len=120_000,
        enable_prompt_tokens_details=False,
    )
    async with SimPool(replicas, config) as pool:
        yield pool


@asynccontextmanager
async def vllm_pool(replicas: int, cpu_quota: float | None) -> AsyncIterator[list[tuple[str, str]]]:
    """Real vLLM replicas (child processes, stopped by PID on exit); yields (name, URL) pairs."""
    from burstsched.testing.vllm_replica import VllmConfig, VllmPool

    config = VllmConfig(prompt_tokens_details=False, cpu_quota_cores=cpu_quota)
    async with VllmPool(replicas, config) as pool:
        yield pool.endpoints


async def count_prompt_tokens(
    client: httpx.AsyncClient, url: str, specs: Sequence[Spec]
) -> tuple[dict[int, int | None], dict[str, Any]]:
    """Each spec's prompt tokens as the replica at ``url`` counts them (``POST /tokenize``, the chat
    template applied to messages; None where it refuses the prompt), and a summary: the context, token
    ranges in and over it, the bytes per token of the completions prompts (no template)."""
    counts: dict[int, int | None] = {}
    max_model_len = 0
    refused: list[str] = []
    for spec in specs:
        key = "messages" if "messages" in spec.body else "prompt"
        response = await client.post(url + "/tokenize", json={"model": MODEL, key: spec.body[key]})
        if response.status_code != 200:
            counts[spec.index] = None
            refused.append(f"{spec.index}: {response.status_code} {response.text[:200]}")
            continue
        answer = response.json()
        counts[spec.index] = int(answer["count"])
        max_model_len = int(answer.get("max_model_len") or max_model_len)
    inside = [n for s in specs if (n := counts[s.index]) is not None and not s.over_context]
    over = [n for s in specs if (n := counts[s.index]) is not None and s.over_context]
    plain = [(s.prompt_bytes, n) for s in specs if (n := counts[s.index]) is not None and "prompt" in s.body]
    return counts, {
        "max_model_len": max_model_len,
        "in_context_min_max": [min(inside, default=0), max(inside, default=0)],
        "over_context_counted_min_max": [min(over, default=0), max(over, default=0)],
        "tokenize_refused": refused,
        "completions_bytes_per_token": (
            round(sum(b for b, _ in plain) / sum(n for _, n in plain), 3) if plain else None
        ),
    }


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": at(0.5), "p95": at(0.95), "max": round(ordered[-1], 3)}


async def run(
    endpoints: Sequence[tuple[str, str]],
    gateway_url: str,
    specs: Sequence[Spec],
    *,
    concurrency: int,
    settle_s: float = 10.0,
    backend: str = "sim",
    prompt_tokens: dict[int, int | None] | None = None,
    max_model_len: int = 0,
    dump: Path | None = None,
) -> Report:
    """Send ``specs`` through the gateway (``concurrency`` at a time), then each completed one directly.

    With ``prompt_tokens`` (and ``max_model_len``) a request the replica counted over its context, or
    refused to count, is expected to get the 400; one made over the context on purpose that the replica
    counted inside it is a mismatch of the mix itself, reported as such. ``dump``: a folder where both
    bodies of each pair that is not byte-identical are written (``<request id>.via``, ``.direct``, and
    ``.direct2``, the control: the same request sent straight to the replica once more)."""
    report = Report(requests=len(specs), backend=backend)
    direct_urls = dict(endpoints)
    limiter = anyio.Semaphore(concurrency)
    latencies: list[float] = []
    allow_text = backend != "sim"
    started = time.perf_counter()

    def over_context(spec: Spec) -> bool:
        if prompt_tokens is None:
            return spec.over_context
        count = prompt_tokens.get(spec.index)
        return count is None or count >= max_model_len

    # Idle connections are dropped after 2 s, below vLLM's 5 s keep-alive: a request must not meet the
    # server's close of an idle connection (uvicorn's, VLLM_HTTP_TIMEOUT_KEEP_ALIVE).
    limits = httpx.Limits(max_connections=concurrency * 2, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:

        async def one(spec: Spec) -> None:
            async with limiter:
                via = await send(client, gateway_url, spec, cancel=spec.cancel)
                report.by_kind[spec.kind] = report.by_kind.get(spec.kind, 0) + 1
                report.largest_prompt_bytes = max(report.largest_prompt_bytes, spec.prompt_bytes)
                expect_refusal = over_context(spec)
                report.over_context_asked += spec.over_context
                if spec.over_context != expect_refusal:
                    report.mismatches.append(
                        f"{spec.request_id}: made {'over' if spec.over_context else 'inside'} the context, "
                        f"counted {prompt_tokens and prompt_tokens.get(spec.index)} tokens"
                    )
                answered = via.context_refused if expect_refusal else via.complete
                if spec.cancel:
                    report.cancelled_asked += 1
                    report.over_context_cancelled += spec.over_context
                    report.cancelled_cut += via.cancelled
                    if not via.cancelled and not answered:
                        report.lost.append(f"{spec.request_id}: {via.status} {via.error}")
                    return
                if not answered:
                    report.lost.append(f"{spec.request_id}: {via.status} {via.error} {via.body[:200]!r}")
                    return
                latencies.append(via.latency_s)
                if expect_refusal:
                    report.over_context_refused += 1
                else:
                    report.completed += 1
                if via.endpoint is None or via.endpoint not in direct_urls:
                    report.mismatches.append(f"{spec.request_id}: served by {via.endpoint!r}")
                    return
                report.served_by[via.endpoint] = report.served_by.get(via.endpoint, 0) + 1
                direct = await send(client, direct_urls[via.endpoint], spec, cancel=False)
                report.compared += 1
                verdict, how = compare(via, direct)
                kind = report.verdicts.setdefault("over-context" if expect_refusal else spec.kind, {})
                kind[verdict] = kind.get(verdict, 0) + 1
                if verdict != "identical":
                    again = await send(client, direct_urls[via.endpoint], spec, cancel=False)
                    key = f"{verdict} / {compare(direct, again)[0]}"
                    report.control[key] = report.control.get(key, 0) + 1
                    if dump is not None:
                        (dump / f"{spec.request_id}.via").write_bytes(via.body)
                        (dump / f"{spec.request_id}.direct").write_bytes(direct.body)
                        (dump / f"{spec.request_id}.direct2").write_bytes(again.body)
                if verdict == "identical":
                    report.identical += 1
                elif verdict == "regrouped" and allow_text:
                    report.regrouped.append(f"{spec.request_id} ({spec.kind}): {how}")
                elif verdict == "text_only" and allow_text:
                    report.text_only.append(f"{spec.request_id} ({spec.kind}): {how}")
                else:
                    report.mismatches.append(f"{spec.request_id} ({spec.kind}, {verdict}): {how}")

        async with anyio.create_task_group() as tg:
            for spec in specs:
                tg.start_soon(one, spec)
        report.seconds = time.perf_counter() - started
        report.latency_s = _quantiles(latencies)
        names, urls = [n for n, _ in endpoints], [u for _, u in endpoints]
        with anyio.move_on_after(settle_s):
            while True:
                report.replicas_busy_after = await _busy(client, urls, names)
                if not any(report.replicas_busy_after.values()):
                    break
                await anyio.sleep(0.2)
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(DEFAULTS), default="sim")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--max-prompt-bytes", type=int, default=None, help="default 200000 (sim), 9000 (vllm)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="drawn from 1 to this; default 64 (sim), 32 (vllm)"
    )
    parser.add_argument(
        "--over-context-bytes",
        default=None,
        help="LOW-HIGH bytes of the requests over the context (vllm only; default 12000-200000)",
    )
    parser.add_argument("--cancel", type=float, default=0.1, help="fraction cancelled by the client")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=0.02, help="simulator time scale")
    parser.add_argument("--replica-cpu-quota", type=float, default=None, help="real vLLM: cores per replica")
    parser.add_argument("--mode", choices=sorted(MODES), default="full-duplex")
    parser.add_argument("--config", type=Path, default=Path("config") / "default.yaml")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--dump", type=Path, default=None, help="folder for both bodies of each difference")
    args = parser.parse_args(argv)
    max_prompt, max_tokens, over = DEFAULTS[args.backend]
    args.max_prompt_bytes = args.max_prompt_bytes or max_prompt
    args.max_tokens = args.max_tokens or max_tokens
    if args.over_context_bytes is not None:
        if args.backend == "sim":
            parser.error("--over-context-bytes needs --backend vllm")
        low, high = (int(part) for part in args.over_context_bytes.split("-", 1))
        over = (low, high)
    args.over_context_bytes = over
    return args


async def main(args: argparse.Namespace) -> Report:
    if args.dump is not None:
        args.dump.mkdir(parents=True, exist_ok=True)
    specs = make_specs(
        args.requests,
        args.max_prompt_bytes,
        args.cancel,
        args.seed,
        max_tokens=args.max_tokens,
        over_context_bytes=args.over_context_bytes,
    )
    if args.backend == "sim":
        async with sim_pool(args.replicas, args.time_scale) as pool:
            endpoints = list(zip(pool.names, pool.urls, strict=True))
            async with gateway_process(args.config, endpoints, mode=MODES[args.mode]) as url:
                return await run(endpoints, url, specs, concurrency=args.concurrency, dump=args.dump)
    async with vllm_pool(args.replicas, args.replica_cpu_quota) as endpoints:
        async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
            counts, tokens = await count_prompt_tokens(client, endpoints[0][1], specs)
        async with gateway_process(args.config, endpoints, mode=MODES[args.mode]) as url:
            report = await run(
                endpoints,
                url,
                specs,
                concurrency=args.concurrency,
                backend="vllm",
                prompt_tokens=counts,
                max_model_len=int(tokens["max_model_len"]),
                dump=args.dump,
            )
        report.prompt_tokens = tokens
        return report


def summary_lines(report: Report) -> list[str]:
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(report.by_kind.items()))
    lines = [
        f"backend {report.backend}; requests {report.requests} ({kinds}); "
        f"largest prompt {report.largest_prompt_bytes} B",
    ]
    if report.prompt_tokens:
        tokens = report.prompt_tokens
        lines.append(
            f"context {tokens['max_model_len']} tokens; prompts inside it "
            f"{tokens['in_context_min_max'][0]}-{tokens['in_context_min_max'][1]} tokens; "
            f"completions prompts {tokens['completions_bytes_per_token']} B/token; "
            f"over it {report.over_context_asked} made on purpose ({report.over_context_cancelled} of them "
            f"cancelled), {report.over_context_refused} answered with the 400; "
            f"/tokenize refused {len(tokens['tokenize_refused'])}"
        )
    lines += [
        f"cancelled by the client: {report.cancelled_asked} asked, "
        f"{report.cancelled_cut} cut before their end",
        f"completed {report.completed}; compared with the replica directly {report.compared}, "
        f"byte-identical {report.identical}; streams with the same text split otherwise over their events "
        f"{len(report.regrouped)}; differing in the generated text only {len(report.text_only)}; "
        f"different otherwise {len(report.mismatches)}",
        f"verdicts by kind: {json.dumps(report.verdicts, sort_keys=True)}",
        f"those not byte-identical sent straight to the replica twice (pair's verdict / the two direct "
        f"answers'): {dict(sorted(report.control.items()))}",
        f"lost {len(report.lost)}; served by {dict(sorted(report.served_by.items()))}",
        f"replicas still running or queueing afterwards: {report.replicas_busy_after}",
        f"{report.seconds:.1f} s; latency through the gateway {report.latency_s}",
    ]
    return lines


def failed(report: Report) -> bool:
    return bool(report.lost or report.mismatches or any(report.replicas_busy_after.values()))


if __name__ == "__main__":
    arguments = parse_args()
    measured = anyio.run(main, arguments)
    print("\n".join(summary_lines(measured)))
    for line in (measured.lost + measured.mismatches + measured.text_only + measured.regrouped)[:40]:
        print("  ", line)
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(measured.as_json(), indent=2) + "\n")
    raise SystemExit(1 if failed(measured) else 0)
