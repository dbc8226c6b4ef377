"""The HTTP API of a replica: shapes, errors, metrics, tokenize, faults, aborts (real uvicorn servers)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from burstsched.sim import Faults, SimConfig, SimPool
from burstsched.sim.tokenizer import BuiltinTokenizer

from .engine_helpers import wait_until
from .http_helpers import MODEL, chat, chat_body, client, metrics, metrics_when, stream_events

pytestmark = pytest.mark.anyio

FAST = SimConfig(time_scale=0.01)
CONTEXT = "Context 42. " + " ".join(f"Observation {i}: the queue depth rose on host {i}." for i in range(40))


@pytest.fixture
def pool() -> Iterator[SimPool]:
    with SimPool(1, FAST) as p:
        yield p


# vLLM 0.32's error types by status (measured): its serving code's and FastAPI's request validation's 400s.
VLLM_ERROR_TYPES = {
    400: {"BadRequestError", "Bad Request"},
    404: {"NotFoundError"},
    413: {"Request Entity Too Large"},
    429: {"Too Many Requests"},
    500: {"InternalServerError"},
    502: {"Bad Gateway"},
    503: {"ServiceUnavailableError"},
}


def assert_openai_error(
    response: httpx.Response, status: int, error_type: str | None = None
) -> dict[str, object]:
    """An OpenAI-shaped error body with vLLM's vocabulary: ``type`` by status, ``code`` the status."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert list(error) == ["message", "type", "param", "code"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == status
    assert error["type"] in VLLM_ERROR_TYPES[status]
    if error_type is not None:
        assert error["type"] == error_type
    return dict(error)


async def test_chat_stream_has_vllm_shape_and_usage_chunk(pool: SimPool) -> None:
    async with client() as http:
        body = chat_body(CONTEXT, max_tokens=5, stream=True)
        chunks, lines = await stream_events(http, pool.urls[0], "/v1/chat/completions", body)
    assert lines[-1] == "data: [DONE]"
    first, *tokens, last = chunks
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["choices"][0]["finish_reason"] is None
    assert len(tokens) == 5
    assert all(c["choices"][0]["delta"]["content"] for c in tokens)
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 4 + ["length"]
    assert {c["id"] for c in chunks} == {first["id"]} and first["id"].startswith("chatcmpl-")
    assert all(c["model"] == MODEL and "usage" not in c for c in [first, *tokens])
    assert last["choices"] == []
    usage = last["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    # Cold: nothing cached; every full block of the prompt computed and written to the cache.
    created = usage["prompt_tokens"] // FAST.block_size * FAST.block_size
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": created}


async def test_completion_stream_and_non_stream_shapes(pool: SimPool) -> None:
    async with client() as http:
        body = {"model": MODEL, "prompt": CONTEXT, "max_tokens": 3, "stream": True}
        chunks, lines = await stream_events(http, pool.urls[0], "/v1/completions", body)
        assert lines[-1] == "data: [DONE]"
        assert [c["object"] for c in chunks] == ["text_completion"] * 3
        assert all(c["id"].startswith("cmpl-") and c["choices"][0]["text"] for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        response = await http.post(f"{pool.urls[0]}/v1/completions", json={**body, "stream": False})
        result = response.json()
        assert result["object"] == "text_completion"
        assert result["usage"]["completion_tokens"] == 3
        # The same prompt again: everything but the last block is a hit.
        assert result["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def _usages(http: httpx.AsyncClient, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The usage of one request in each place vLLM reports it: the non-streaming response, the streamed
    usage chunk, and a continuous-usage chunk."""
    plain = {k: v for k, v in body.items() if k != "stream_options"}
    response = (await http.post(f"{url}{path}", json={**plain, "stream": False})).json()
    streamed, _ = await stream_events(http, url, path, {**body, "stream": True})
    options = {"include_usage": True, "continuous_usage_stats": True}
    continuous, _ = await stream_events(http, url, path, {**body, "stream": True, "stream_options": options})
    return {
        "response": response["usage"],
        "final_chunk": streamed[-1]["usage"],
        "continuous": continuous[0]["usage"],
    }


@pytest.mark.parametrize("details", [True, False])
async def test_usage_shapes_follow_enable_prompt_tokens_details(details: bool) -> None:
    config = SimConfig(time_scale=0.01, enable_prompt_tokens_details=details)
    chat_req = chat_body(CONTEXT, max_tokens=2, stream=True)
    completion_req = {
        "model": MODEL,
        "prompt": CONTEXT,
        "max_tokens": 2,
        "stream_options": {"include_usage": True},
    }
    async with SimPool(1, config) as p, client() as http:
        url = p.urls[0]
        chat_usage = await _usages(http, url, "/v1/chat/completions", chat_req)
        completion_usage = await _usages(http, url, "/v1/completions", completion_req)
    counts = {"prompt_tokens", "total_tokens", "completion_tokens"}
    # Continuous usage never carries prompt_tokens_details; chat's carries completion_tokens_details null.
    assert chat_usage["continuous"] == {
        "prompt_tokens": chat_usage["response"]["prompt_tokens"],
        "total_tokens": chat_usage["response"]["prompt_tokens"],
        "completion_tokens": 0,
        "completion_tokens_details": None,
    }
    assert set(completion_usage["continuous"]) == counts
    if not details:
        assert chat_usage["response"]["prompt_tokens_details"] is None
        assert completion_usage["response"]["prompt_tokens_details"] is None
        assert set(chat_usage["final_chunk"]) == set(completion_usage["final_chunk"]) == counts
        return
    # The first request caches its full blocks; the next hits them (never the last token) and caches the
    # rest of its full blocks: created = full-block tokens - hits.
    full_blocks = chat_usage["response"]["prompt_tokens"] // 16 * 16
    chat_cached = chat_usage["final_chunk"]["prompt_tokens_details"]["cached_tokens"]
    assert chat_cached == (chat_usage["response"]["prompt_tokens"] - 1) // 16 * 16 > 0
    assert chat_usage["response"]["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": full_blocks,
        "multimodal_tokens": None,
    }
    assert chat_usage["response"]["completion_tokens_details"] is None
    assert chat_usage["final_chunk"]["prompt_tokens_details"] == {
        "cached_tokens": chat_cached,
        "created_cache_tokens": full_blocks - chat_cached,
    }
    completion_details = completion_usage["response"]["prompt_tokens_details"]
    assert completion_details == {"cached_tokens": 0, "created_cache_tokens": None, "multimodal_tokens": None}
    assert list(completion_usage["final_chunk"]["prompt_tokens_details"]) == ["cached_tokens"]


async def test_non_stream_chat_and_request_id_echo(pool: SimPool) -> None:
    async with client() as http:
        response = await http.post(
            f"{pool.urls[0]}/v1/chat/completions",
            json=chat_body(CONTEXT, max_tokens=4),
            headers={"X-Request-Id": "r-1"},
        )
    assert response.headers["x-request-id"] == "r-1"
    body = response.json()
    assert body["id"] == "chatcmpl-r-1"
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4


async def test_without_max_tokens_a_request_stops_by_itself(pool: SimPool) -> None:
    async with client() as http:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        response = await http.post(f"{pool.urls[0]}/v1/chat/completions", json=body)
    result = response.json()
    assert result["choices"][0]["finish_reason"] == "stop"
    assert result["usage"]["completion_tokens"] == FAST.default_output_tokens


async def test_warm_hits_and_metric_deltas_match_usage(pool: SimPool) -> None:
    url = pool.urls[0]
    async with client() as http:
        before = await metrics(http, url)
        cold = (await chat(http, url, CONTEXT + "\nQuestion: one?", max_tokens=6))["usage"]
        warm = (await chat(http, url, CONTEXT + "\nQuestion: two, please?", max_tokens=6))["usage"]
        after = await metrics(http, url)

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    prompt = cold["prompt_tokens"] + warm["prompt_tokens"]
    cached = cold["prompt_tokens_details"]["cached_tokens"] + warm["prompt_tokens_details"]["cached_tokens"]
    assert cold["prompt_tokens_details"]["cached_tokens"] == 0
    shared = len(CONTEXT) // 4  # the shared context is most of the prompt
    assert warm["prompt_tokens_details"]["cached_tokens"] >= shared // 16 * 16 - 64
    assert warm["prompt_tokens_details"]["cached_tokens"] % FAST.block_size == 0
    assert delta("vllm:prefix_cache_queries_total") == prompt
    assert delta("vllm:prefix_cache_hits_total") == cached
    assert delta("vllm:prompt_tokens_total") == prompt
    assert delta("vllm:prompt_tokens_cached_total") == cached
    assert delta("vllm:generation_tokens_total") == 12
    assert delta("vllm:request_success_total[finished_reason=length]") == 2
    assert delta("vllm:request_prefill_kv_computed_tokens_sum") == prompt - cached
    assert delta("vllm:request_prefill_kv_computed_tokens_count") == 2
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("vllm:e2e_request_latency_seconds_count") == 2
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0.0
    info = [k for k in after if k.startswith("vllm:cache_config_info")]
    assert len(info) == 1 and "[block_size=16]" in info[0] and "[num_gpu_blocks=1365]" in info[0]


async def test_tokenize_counts_and_chat_template(pool: SimPool) -> None:
    url = pool.urls[0]
    async with client() as http:
        plain = (await http.post(f"{url}/tokenize", json={"model": MODEL, "prompt": "hello world"})).json()
        msgs = [{"role": "user", "content": "hello world"}]
        templated = (await http.post(f"{url}/tokenize", json={"messages": msgs})).json()
        usage = (await chat(http, url, "hello world", max_tokens=1))["usage"]
        bad = await http.post(f"{url}/tokenize", json={"prompt": "a", "messages": msgs})
    assert plain["tokens"] == BuiltinTokenizer().encode("hello world", add_special_tokens=True)
    assert plain["count"] == len(plain["tokens"]) == 3  # "hello", " worl", "d"
    assert plain["max_model_len"] == FAST.effective_max_model_len
    # ChatML: <|im_start|>user\n … <|im_end|>\n<|im_start|>assistant\n
    assert templated["count"] > plain["count"]
    assert templated["count"] == usage["prompt_tokens"]
    assert_openai_error(bad, 400)


async def test_models_version_health(pool: SimPool) -> None:
    url = pool.urls[0]
    async with client() as http:
        models = (await http.get(f"{url}/v1/models")).json()
        version = (await http.get(f"{url}/version")).json()
        health = await http.get(f"{url}/health")
        unknown = await http.get(f"{url}/v2/nothing")
        wrong_method = await http.get(f"{url}/v1/chat/completions")
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == FAST.effective_max_model_len
    assert version == {"version": "0.32.0"}
    assert health.status_code == 200
    # vLLM leaves unknown paths and wrong methods to FastAPI: {"detail": ...}, not an OpenAI error.
    assert (unknown.status_code, unknown.json()) == (404, {"detail": "Not Found"})
    assert (wrong_method.status_code, wrong_method.json()) == (405, {"detail": "Method Not Allowed"})
    assert "POST" in wrong_method.headers["allow"]


# (body, status, vLLM's error type, param): "Bad Request" where vLLM's request validation (FastAPI) rejects
# the body, "BadRequestError" where its serving code does.
MSG = '"messages": [{"role": "user", "content": "x"}]'
BAD_BODIES: list[tuple[bytes, int, str, str | None]] = [
    (b"", 400, "Bad Request", "body"),
    (b"{", 400, "Bad Request", "body.1"),  # where the JSON error is, as vLLM's request validation says
    (b"\xff\xfe{}", 400, "Bad Request", "body"),
    (b"[]", 400, "Bad Request", "body"),
    (b'{"messages": "hi"}', 400, "Bad Request", "body.messages"),
    (b'{"messages": []}', 400, "BadRequestError", "messages"),
    (b'{"model": "kv-demo"}', 400, "Bad Request", "body.messages"),
    (b'{"messages": [{"content": "x"}]}', 400, "Bad Request", "body.messages[0].role"),
    (b'{"messages": [{"role": "user", "content": 5}]}', 400, "Bad Request", "body.messages[0].content"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 400, "BadRequestError", None),
    (f'{{{MSG}, "max_tokens": -1}}'.encode(), 400, "BadRequestError", "max_tokens"),
    (f'{{{MSG}, "max_tokens": 0}}'.encode(), 400, "BadRequestError", "max_tokens"),
    (f'{{{MSG}, "max_tokens": "5"}}'.encode(), 400, "Bad Request", "body.max_tokens"),
    (f'{{{MSG}, "max_tokens": true}}'.encode(), 400, "Bad Request", "body.max_tokens"),
    (f'{{{MSG}, "stream": "yes"}}'.encode(), 400, "Bad Request", "body.stream"),
    (f'{{{MSG}, "temperature": -1}}'.encode(), 400, "BadRequestError", "temperature"),
    (f'{{{MSG}, "temperature": NaN}}'.encode(), 400, "Bad Request", None),  # not JSON; sim refuses
    (f'{{{MSG}, "n": 2}}'.encode(), 400, "BadRequestError", "n"),
    (
        f'{{{MSG}, "stream_options": {{"include_usage": true}}}}'.encode(),
        400,
        "BadRequestError",
        "stream_options",
    ),
    (f'{{"model": "other", {MSG}}}'.encode(), 404, "NotFoundError", "model"),
    (f'{{"model": 7, {MSG}}}'.encode(), 400, "Bad Request", "body.model"),
]


@pytest.mark.parametrize(("raw", "status", "error_type", "param"), BAD_BODIES)
async def test_bad_chat_bodies_get_vllm_errors(
    pool: SimPool, raw: bytes, status: int, error_type: str, param: str | None
) -> None:
    async with client() as http:
        response = await http.post(
            f"{pool.urls[0]}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
    error = assert_openai_error(response, status, error_type)
    if param is not None:
        assert error["param"] == param


async def test_unknown_model_is_vllms_not_found_error(pool: SimPool) -> None:
    url = pool.urls[0]
    async with client() as http:
        responses = [
            await http.post(f"{url}/v1/completions", json={"model": "nope", "prompt": "hi", "max_tokens": 1}),
            await http.post(f"{url}/v1/chat/completions", json={**chat_body("hi"), "model": "nope"}),
            await http.post(f"{url}/tokenize", json={"model": "nope", "prompt": "hi"}),
        ]
    for response in responses:
        assert response.json() == {
            "error": {
                "message": f"The model `nope` does not exist. Valid aliases: {MODEL}.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        }


async def test_bad_completion_bodies_and_too_long_prompts() -> None:
    config = SimConfig(time_scale=0.01, max_model_len=64)
    async with SimPool(1, config) as small, client() as http:
        url = small.urls[0]
        cases: list[tuple[object, int, str | None]] = [
            ({"prompt": ""}, 400, "prompt"),
            ({}, 400, "prompt"),
            ({"prompt": []}, 400, "prompt"),
            ({"prompt": ["a", "b"]}, 400, "prompt"),
            ({"prompt": [1, -2]}, 400, "body.prompt"),
            ({"prompt": "x", "echo": True}, 400, "echo"),
            ({"prompt": " ".join(["word"] * 100)}, 400, "input_tokens"),
            ({"prompt": [1] * 65, "max_tokens": 1}, 400, "input_tokens"),
            ({"prompt": [1] * 64}, 400, "max_tokens"),  # no room left for a single output token
            ({"prompt": [1, 2, 3], "max_tokens": 2}, 200, None),
        ]
        for body, status, param in cases:
            response = await http.post(f"{url}/v1/completions", json=body)
            if status == 200:
                assert response.status_code == 200 and response.json()["usage"]["prompt_tokens"] == 3
            else:
                assert assert_openai_error(response, status)["param"] == param
        too_long = await http.post(f"{url}/v1/completions", json={"prompt": [1] * 66})
        assert too_long.json()["error"]["message"] == (
            "This model's maximum context length is 64 tokens. However, your prompt contains 66 input "
            "tokens, which exceeds this limit even without any output tokens. Please reduce the length of "
            "the input prompt. (parameter=input_tokens, value=66)"
        )
        # vLLM's tokenizer stops at max_model_len + 1 tokens: for that count it says "at least".
        just_over = await http.post(f"{url}/v1/completions", json={"prompt": [1] * 65})
        assert "your prompt contains at least 65 input tokens" in just_over.json()["error"]["message"]
        # A max_tokens that does not fit is capped to the room left, as vLLM 0.32 does, not refused.
        capped = (
            await http.post(f"{url}/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 62})
        ).json()
        assert capped["usage"]["completion_tokens"] == 61
        assert capped["choices"][0]["finish_reason"] == "length"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
        max_leaves=12,
    )
    | st.fixed_dictionaries(
        {},
        optional={
            "model": st.none() | st.text(max_size=8) | st.integers(),
            "messages": st.lists(
                st.dictionaries(
                    st.sampled_from(["role", "content", "name"]), st.none() | st.text() | st.integers()
                ),
                max_size=2,
            ),
            "max_tokens": st.none() | st.integers(-3, 5) | st.text(max_size=3),
            "stream": st.booleans() | st.integers(),
            "prompt": st.none() | st.text(max_size=30) | st.lists(st.integers(-2, 50), max_size=5),
        },
    ),
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/tokenize", "/sim/faults"]),
)
def test_no_body_ever_gets_a_500(pool: SimPool, body: object, path: str) -> None:
    if path == "/sim/faults":
        body = body if not isinstance(body, dict) else {k: v for k, v in body.items() if k != "error_rate"}
    with httpx.Client(timeout=30) as http:
        response = http.post(f"{pool.urls[0]}{path}", content=json.dumps(body))
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            assert_openai_error(response, response.status_code)
        http.post(f"{pool.urls[0]}/sim/faults", json={})


async def test_waiting_queue_limit_answers_429() -> None:
    config = SimConfig(time_scale=1.0, max_num_seqs=1, max_waiting_requests=1)
    async with SimPool(1, config) as p, client() as http:
        url = p.urls[0]
        statuses: list[int] = []

        async def one() -> None:
            response = await http.post(f"{url}/v1/chat/completions", json=chat_body("hi", max_tokens=2000))
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert_openai_error(response, 429)
                assert response.headers["retry-after"] == "1"

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(one)
            await wait_until(lambda: 429 in statuses, limit_s=20)
            tg.cancel_scope.cancel()
        assert statuses.count(429) >= 1


async def test_client_disconnect_aborts_the_request() -> None:
    config = SimConfig(time_scale=0.05)
    async with SimPool(1, config) as p, client() as http:
        url = p.urls[0]
        body = chat_body(CONTEXT, max_tokens=5000, stream=True)
        async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            lines = response.aiter_lines()  # held: an abandoned generator may close the stream early
            async for line in lines:
                if '"content":" ' in line:
                    break
            assert (await metrics(http, url))["vllm:num_requests_running"] == 1
        state = await metrics_when(http, url, lambda m: m["vllm:num_requests_running"] == 0)
        assert state["vllm:kv_cache_usage_perc"] == 0.0
        assert state.get("vllm:request_success_total[finished_reason=length]", 0.0) == 0.0


async def test_reset_prefix_cache_over_http(pool: SimPool) -> None:
    url = pool.urls[0]
    async with client() as http:
        await chat(http, url, CONTEXT, max_tokens=2)
        idle = await http.post(f"{url}/reset_prefix_cache")
        assert (idle.status_code, idle.json()) == (200, {"success": True})
        again = (await chat(http, url, CONTEXT, max_tokens=2))["usage"]
        assert again["prompt_tokens_details"]["cached_tokens"] == 0
        bad_flag = await http.post(f"{url}/reset_prefix_cache?reset_running_requests=maybe")
        error = assert_openai_error(bad_flag, 400, "Bad Request")
        assert error["param"] == "query.reset_running_requests"
        body = chat_body(CONTEXT, max_tokens=5000, stream=True)
        async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            lines = response.aiter_lines()
            async for line in lines:
                if '"content":" ' in line:
                    break
            busy = await http.post(f"{url}/reset_prefix_cache?reset_running_requests=false&reset_external=1")
            assert (busy.status_code, busy.json()) == (200, {"success": False})
            forced = await http.post(f"{url}/reset_prefix_cache?reset_running_requests=yes")
            assert (forced.status_code, forced.json()) == (200, {"success": True})
            # The preempted request is recomputed and keeps streaming.
            async for line in lines:
                if '"content":" ' in line:
                    break
            else:
                raise AssertionError("the preempted request stopped streaming")


async def test_faults_over_http_and_python(pool: SimPool) -> None:
    url = pool.urls[0]
    async with client() as http:
        set_response = await http.post(f"{url}/sim/faults", json={"error_rate": 1.0, "error_status": 503})
        assert set_response.json()["error_rate"] == 1.0
        failed = await http.post(f"{url}/v1/chat/completions", json=chat_body("hi"))
        assert_openai_error(failed, 503, "ServiceUnavailableError")
        assert_openai_error(await http.post(f"{url}/sim/faults", json={"error_rate": 2}), 400)
        assert_openai_error(await http.post(f"{url}/sim/faults", json={"bogus": 1}), 400)
        await http.post(f"{url}/sim/faults", json={})
        assert (await http.post(f"{url}/v1/chat/completions", json=chat_body("hi"))).status_code == 200
        await pool.aset_faults(0, Faults(metrics_dead=True))
        with pytest.raises(httpx.ReadTimeout):
            await http.get(f"{url}/metrics", timeout=0.3)
        await pool.aset_faults(0, Faults(stall_before_first_byte_s=0.5))
        with pytest.raises(httpx.ReadTimeout):
            await http.post(f"{url}/v1/chat/completions", json=chat_body("hi"), timeout=0.2)
        await pool.aset_faults(0, Faults())
        assert (await http.get(f"{url}/metrics")).status_code == 200
        assert (await http.get(f"{url}/sim/faults")).json() == Faults().to_json()


async def test_error_rate_is_seeded_and_partial() -> None:
    async with SimPool(1, SimConfig(time_scale=0.01, seed=11)) as p, client() as http:
        p.set_faults(0, Faults(error_rate=0.5, error_status=502))
        codes = [
            (
                await http.post(f"{p.urls[0]}/v1/completions", json={"prompt": "x", "max_tokens": 1})
            ).status_code
            for _ in range(40)
        ]
    assert set(codes) == {200, 502}
    assert 8 <= codes.count(502) <= 32


async def _tokens(http: httpx.AsyncClient, url: str, text: str) -> list[int]:
    response = await http.post(f"{url}/tokenize", json={"messages": [{"role": "user", "content": text}]})
    tokens: list[int] = response.json()["tokens"]
    return tokens


async def test_warm_hit_is_exactly_the_shared_full_blocks(pool: SimPool) -> None:
    url = pool.urls[0]
    first, second = CONTEXT + "\nQuestion: what rose?", CONTEXT + "\nQuestion: which host is worst?"
    async with client() as http:
        a, b = await _tokens(http, url, first), await _tokens(http, url, second)
        await chat(http, url, first, max_tokens=1)
        usage = (await chat(http, url, second, max_tokens=1))["usage"]
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    block = FAST.block_size
    assert usage["prompt_tokens_details"]["cached_tokens"] == min(shared, len(b) - 1) // block * block


async def test_a_concurrent_burst_computes_its_shared_prefix_once() -> None:
    async with SimPool(1, SimConfig(time_scale=0.05)) as p, client() as http:
        url = p.urls[0]
        prefix = "Context 7. " + " ".join(f"Observation {i}: disk use on node {i} rose." for i in range(150))
        prefix_tokens = len(await _tokens(http, url, prefix))
        usages: list[dict[str, int]] = []

        async def one(i: int) -> None:
            result = await chat(http, url, f"{prefix}\nQuestion {i}: what about node {i}?", max_tokens=4)
            usages.append(
                {
                    "prompt": result["usage"]["prompt_tokens"],
                    "cached": result["usage"]["prompt_tokens_details"]["cached_tokens"],
                }
            )

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
    computed = sum(u["prompt"] - u["cached"] for u in usages)
    tails = sum(u["prompt"] for u in usages) - 8 * prefix_tokens
    # The prefix once, plus each request's own tail and at most one partially shared block each.
    assert prefix_tokens <= computed <= prefix_tokens + tails + 8 * SimConfig().block_size
    assert sorted(u["cached"] > 0 for u in usages) == [False] + [True] * 7
