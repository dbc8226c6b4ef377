"""Fuzzing the OpenAI endpoints: 10,000 generated bodies and header sets, in process (ASGI), against fake
replicas (an in-process upstream transport). No response may be a 500 (or any 5xx: the replicas are fine),
every error must have OpenAI's shape, and the router must be healthy afterwards.

Deterministic: ``derandomize=True`` and no example database.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from burstsched.config import AdmissionConfig, AuthConfig, LimitsConfig
from burstsched.dispatch import HttpxUpstream
from burstsched.front.app import create_app

from .helpers import config_for, eventually

pytestmark = pytest.mark.anyio

MODEL = "fake-model"
KEY = "fuzz-key"
BATCH = 10
EXAMPLES = 1000  # x BATCH requests each: 10,000 generated bodies and header sets
PATHS = ("/v1/chat/completions", "/v1/completions")


def _replica(request: httpx.Request) -> httpx.Response:
    """Two healthy fake replicas behind an in-process transport."""
    path = request.url.path
    if path == "/health":
        return httpx.Response(200)
    if path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": MODEL, "object": "model"}]})
    if path == "/metrics":
        return httpx.Response(200, text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
    if path not in PATHS or request.url.host not in ("replica-a", "replica-b"):
        return httpx.Response(599, text="the router asked for something it must never ask for")
    body = json.loads(request.content)
    if body.get("stream") is True:
        chunk = {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}
        content = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, text=content, headers={"content-type": "text/event-stream"})
    return httpx.Response(200, json={"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]})


@dataclass
class Router:
    client: httpx.AsyncClient
    statuses: dict[int, int]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def router() -> AsyncIterator[Router]:
    config = config_for(
        [("a", "http://replica-a:8000"), ("b", "http://replica-b:8000")],
        auth=AuthConfig(api_keys=[KEY]),
        admission=AdmissionConfig(window_ms=1),
        limits=LimitsConfig(max_body_bytes=65_536),
    )
    app = create_app(config, upstream=HttpxUpstream(httpx.MockTransport(_replica)))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router", timeout=10) as client:

            async def ready() -> bool:
                return (await client.get("/ready")).status_code == 200

            await eventually(ready)
            yield Router(client, {})


# --- strategies ---------------------------------------------------------------------------------------------

# Built from scalar draws (``st.builds``) rather than collection strategies: a draw of a list or dict costs
# hypothesis several times more, and 10,000 cases must stay well under a minute on two cores.
ABSENT = object()
"""A field left out of the body."""

WORDS = st.sampled_from(
    ["", "hello", "user", MODEL, "x" * 3000, "\u0000", "\ufeff", "é😀", "\ud800", "http://evil.example"]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.5, 1e308])
    | WORDS
)
KEYS = st.sampled_from(["", "a", "role", "content", "type", "text", "stream", "model"])
VALUES: st.SearchStrategy[Any] = (
    SCALARS
    | st.builds(lambda a, b: [a, b], SCALARS, SCALARS)
    | st.builds(lambda k, v: {k: v}, KEYS, SCALARS)
    | st.builds(lambda a: [a], SCALARS)
    | st.just([])
    | st.just({})
)
"""JSON-ish values up to two levels deep (deeper nesting comes from the fixed samples in RAW)."""
TEXT = WORDS | st.text(max_size=10)
ROLE = st.sampled_from(["user", "system", "assistant", "tool"]) | VALUES | st.just(ABSENT)
CONTENT = (
    TEXT
    | st.builds(lambda t, kind: [{"type": kind, "text": t}], TEXT, st.sampled_from(["text", "image_url", 3]))
    | VALUES
    | st.just(ABSENT)
)


def _message(role: Any, content: Any) -> dict[str, Any]:
    return {k: v for k, v in (("role", role), ("content", content)) if v is not ABSENT}


MESSAGES = (
    st.builds(lambda m: [m], st.builds(_message, ROLE, CONTENT))
    | st.builds(lambda a, b: [a, b], st.builds(_message, ROLE, CONTENT), st.builds(_message, ROLE, CONTENT))
    | VALUES
)
PROMPT = (
    TEXT
    | st.builds(lambda a, b: [a, b], TEXT, TEXT)
    | st.builds(lambda a, b, c: [a, b, c], *[st.integers(min_value=-5, max_value=2**33)] * 3)
    | st.builds(lambda a, b: [[a, b], [b]], *[st.integers(min_value=0, max_value=50_000)] * 2)
    | VALUES
)
FIELD = {
    "model": st.sampled_from([MODEL, MODEL, "other-model", ""]) | VALUES,
    "messages": MESSAGES,
    "prompt": PROMPT,
    "stream": st.booleans() | VALUES,
    "stream_options": st.builds(lambda v: {"include_usage": v}, VALUES) | VALUES,
    "max_tokens": VALUES,
    "cache_salt": TEXT | VALUES,
    "tools": VALUES,
    "base_url": st.just("http://evil.example"),
}


def _body(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not ABSENT}


BODY = st.builds(_body, **{name: strategy | st.just(ABSENT) for name, strategy in FIELD.items()})


def _encode(body: dict[str, Any], ensure_ascii: bool) -> bytes:
    return json.dumps(body, ensure_ascii=ensure_ascii).encode("utf-8", errors="surrogatepass")


RAW = st.one_of(
    st.builds(_encode, BODY, st.booleans()),
    st.binary(max_size=64),
    st.builds(lambda v: json.dumps(v).encode(), VALUES),
    st.builds(lambda b, n: _encode(b, True)[:n], BODY, st.integers(0, 40)),  # cut short
    st.sampled_from(
        [
            b"",
            b"[" * 5000,
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "\\ud800"}]}',
            b'{"model": "\\udfff", "prompt": "x"}',
            b'{"model": "fake-model", "prompt": "\xff\xfe"}',
            b'{"model": "fake-model", "prompt": NaN, "stream": Infinity}',
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": true}',
            b"\xef\xbb\xbf{}",
            b'{"model": "fake-model", "messages": [{"role": "user", "content": '
            + b"[" * 900
            + b"]" * 900
            + b"}]}",
            b'{"model": "fake-model", "prompt": "x", "tools": ' + b'{"a":' * 800 + b"1" + b"}" * 800 + b"}",
        ]
    ),
)
HEADER_NAMES = st.sampled_from(
    [
        b"content-type",
        b"content-length",
        b"authorization",
        b"x-request-id",
        b"traceparent",
        b"tracestate",
        b"host",
        b"x-forwarded-host",
        b"accept",
        b"accept-encoding",
        b"transfer-encoding",
        b"connection",
        b"expect",
        b"x-burstsched-endpoint",
        b"cookie",
    ]
)
HEADER_VALUES = st.binary(max_size=8) | st.sampled_from(
    [
        b"application/json",
        b"text/plain",
        b"-1",
        b"99999999999999999999",
        b"chunked",
        b"100-continue",
        b"0",
        b"a\r\nx-injected: 1",
        b"\xff\xfe",
        b"http://evil.example",
    ]
)
HEADER = st.tuples(HEADER_NAMES, HEADER_VALUES)
HEADERS: st.SearchStrategy[list[tuple[bytes, bytes]]] = (
    st.just([]) | st.builds(lambda h: [h], HEADER) | st.builds(lambda a, b: [a, b], HEADER, HEADER)
)
AUTH = st.sampled_from([b"Bearer " + KEY.encode()] * 16 + [b"Bearer nope", b"bearer  " + KEY.encode(), b""])
OPTIONAL_STREAM = st.booleans() | st.just(ABSENT)
CHAT_BODY = st.builds(
    lambda contents, stream, include_usage, max_tokens, salt: _body(
        model=MODEL,
        messages=[{"role": "user", "content": c} for c in contents],
        stream=stream,
        stream_options={"include_usage": include_usage} if include_usage is not ABSENT else ABSENT,
        max_tokens=max_tokens,
        cache_salt=salt,
    ),
    TEXT.map(lambda t: [t]) | st.builds(lambda a, b: [a, b], TEXT, TEXT),
    OPTIONAL_STREAM,
    OPTIONAL_STREAM,
    st.integers(min_value=1, max_value=64) | st.just(ABSENT),
    TEXT | st.just(ABSENT),
)
COMPLETION_BODY = st.builds(
    lambda prompt, stream, max_tokens: _body(
        model=MODEL, prompt=prompt, stream=stream, max_tokens=max_tokens
    ),
    PROMPT,
    OPTIONAL_STREAM,
    st.integers(min_value=1, max_value=64) | st.just(ABSENT),
)


def _mutate(body: dict[str, Any], mutation: tuple[str, Any] | None) -> dict[str, Any]:
    return body if mutation is None else {**body, mutation[0]: mutation[1]}


MUTATION = st.none() | st.tuples(
    st.sampled_from(["model", "messages", "prompt", "stream", "cache_salt", "x"]), VALUES
)
PLAUSIBLE = st.one_of(
    st.tuples(st.just(PATHS[0]), st.builds(_mutate, CHAT_BODY, MUTATION)),
    st.tuples(st.just(PATHS[1]), st.builds(_mutate, COMPLETION_BODY, MUTATION)),
).map(lambda pair: (pair[0], "POST", _encode(pair[1], False)))
ANYTHING = st.tuples(
    st.sampled_from([*PATHS, *PATHS, "/v1/models", "/health", "/v1/chat/completions/x", "/admin/reset"]),
    st.sampled_from(["POST"] * 9 + ["GET", "PUT"]),
    RAW,
)
CASE = st.builds(lambda head, headers, auth: (*head, headers, auth), PLAUSIBLE | ANYTHING, HEADERS, AUTH)


def _check(status: int, content: bytes, headers: httpx.Headers) -> None:
    assert status < 500, (status, content[:300])
    if status == 200:
        return
    error = json.loads(content)["error"]
    assert set(error) == {"message", "type", "param", "code"}, content[:300]
    assert isinstance(error["message"], str) and isinstance(error["type"], str)


async def _send(router: Router, case: tuple[str, str, bytes, list[tuple[bytes, bytes]], bytes]) -> None:
    path, method, content, extra, auth = case
    request = router.client.build_request(method, path, content=content)
    headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(content)).encode()))
    if auth:
        headers.append((b"authorization", auth))
    headers += [(k, v) for k, v in extra if k != b"authorization" or not auth]
    request.headers = httpx.Headers(headers)
    response = await router.client.send(request)
    router.statuses[response.status_code] = router.statuses.get(response.status_code, 0) + 1
    _check(response.status_code, response.content, response.headers)


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cases=st.lists(CASE, min_size=BATCH, max_size=BATCH))
async def test_fuzzed_requests_never_get_a_5xx_and_the_router_stays_healthy(
    router: Router, cases: list[tuple[str, str, bytes, list[tuple[bytes, bytes]], bytes]]
) -> None:
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for case in cases:
                tg.start_soon(_send, router, case)
        assert (await router.client.get("/health")).status_code == 200  # after every batch


async def test_after_the_fuzz_the_router_is_healthy_and_serves(router: Router) -> None:
    """Runs after the fuzz test (module order), on the same router."""
    total = sum(router.statuses.values())
    if total == 0:
        pytest.skip("run together with the fuzz test above")
    print(f"fuzz: {total} requests, statuses {dict(sorted(router.statuses.items()))}")
    assert total >= EXAMPLES * BATCH
    assert router.statuses.get(200, 0) > EXAMPLES  # a good share of the generated requests was served
    await _still_serving(router)


async def _still_serving(router: Router) -> None:
    client = router.client
    assert (await client.get("/health")).status_code == 200
    body = {"model": MODEL, "messages": [{"role": "user", "content": "still there?"}]}
    for stream in (False, True):
        response = await client.post(
            "/v1/chat/completions",
            json={**body, "stream": stream},
            headers={"authorization": f"Bearer {KEY}"},
        )
        assert response.status_code == 200
