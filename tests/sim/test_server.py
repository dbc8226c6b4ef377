"""The HTTP API of a replica: shapes, errors, metrics, tokenize, faults, aborts (real uvicorn servers)."""

from __future__ import annotations

import json
from collections.abc import Iterator

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


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    assert set(error) == {"message", "type", "param", "code"}
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
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


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
    assert_openai_error(unknown, 404)
    assert_openai_error(wrong_method, 405)


BAD_BODIES: list[tuple[bytes, int]] = [
    (b"", 400),
    (b"{", 400),
    (b"\xff\xfe{}", 400),
    (b"[]", 400),
    (b'{"messages": "hi"}', 400),
    (b'{"messages": []}', 400),
    (b'{"model": "kv-demo"}', 400),
    (b'{"messages": [{"content": "x"}]}', 400),
    (b'{"messages": [{"role": "user", "content": 5}]}', 400),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": true}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": -1}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 2}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}', 400),
    (b'{"model": "other", "messages": [{"role": "user", "content": "x"}]}', 404),
    (b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}', 400),
]


@pytest.mark.parametrize(("raw", "status"), BAD_BODIES)
async def test_bad_chat_bodies_get_openai_errors(pool: SimPool, raw: bytes, status: int) -> None:
    async with client() as http:
        response = await http.post(
            f"{pool.urls[0]}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
    assert_openai_error(response, status)


async def test_bad_completion_bodies_and_too_long_prompts() -> None:
    config = SimConfig(time_scale=0.01, max_model_len=64)
    async with SimPool(1, config) as small, client() as http:
        url = small.urls[0]
        cases: list[tuple[object, int]] = [
            ({"prompt": ""}, 400),
            ({"prompt": []}, 400),
            ({"prompt": ["a", "b"]}, 400),
            ({"prompt": [1, -2]}, 400),
            ({"prompt": "x", "echo": True}, 400),
            ({"prompt": " ".join(["word"] * 100)}, 400),
            ({"prompt": "x y z", "max_tokens": 62}, 400),
            ({"prompt": [1, 2, 3], "max_tokens": 2}, 200),
        ]
        for body, status in cases:
            response = await http.post(f"{url}/v1/completions", json=body)
            if status == 200:
                assert response.status_code == 200 and response.json()["usage"]["prompt_tokens"] == 3
            else:
                assert_openai_error(response, status)


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
            async for line in response.aiter_lines():
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
        assert (await http.post(f"{url}/reset_prefix_cache")).status_code == 200
        again = (await chat(http, url, CONTEXT, max_tokens=2))["usage"]
        assert again["prompt_tokens_details"]["cached_tokens"] == 0
        body = chat_body(CONTEXT, max_tokens=5000, stream=True)
        async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if '"content":" ' in line:
                    break
            busy = await http.post(f"{url}/reset_prefix_cache")
            assert_openai_error(busy, 409)
            forced = await http.post(f"{url}/reset_prefix_cache?reset_running_requests=true")
            assert forced.status_code == 200


async def test_faults_over_http_and_python(pool: SimPool) -> None:
    url = pool.urls[0]
    async with client() as http:
        set_response = await http.post(f"{url}/sim/faults", json={"error_rate": 1.0, "error_status": 503})
        assert set_response.json()["error_rate"] == 1.0
        failed = await http.post(f"{url}/v1/chat/completions", json=chat_body("hi"))
        assert_openai_error(failed, 503)
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
