"""The remote prompt tokenizer against the simulator's ``POST /tokenize`` over a real 127.0.0.1 socket, and
against broken servers (no answer, a wrong answer, none at all)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import SocketStream

from burstsched.dispatch import UpstreamClient, poster
from burstsched.framework import ApiKind
from burstsched.sim import SimConfig, SimPool
from burstsched.tokenization import (
    LocalPromptTokenizer,
    PromptTokenizer,
    RemotePromptTokenizer,
    TokenizationError,
    parse_prompt,
    tokenize_body,
)
from burstsched.tokenization.remote import Post

pytestmark = pytest.mark.anyio
CHAT, COMPLETIONS = ApiKind.CHAT, ApiKind.COMPLETIONS
MODEL = "kv-demo"

PAYLOADS: list[tuple[ApiKind, dict[str, Any]]] = [
    (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}]}),
    (
        CHAT,
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": "The answer is"},
            ],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
    (CHAT, {"messages": [{"role": "user", "content": "Grüße 🚀 缓存"}], "add_generation_prompt": False}),
    (COMPLETIONS, {"model": MODEL, "prompt": "The replica cache held 42 blocks."}),
    (COMPLETIONS, {"prompt": ["first of a batch", "second"], "add_special_tokens": False}),
    (COMPLETIONS, {"prompt": "<|im_start|>user\nhi<|im_end|>"}),
]


@asynccontextmanager
async def sim_replica(tokenizer_dir: Path) -> AsyncIterator[tuple[SimPool, Post]]:
    config = SimConfig(time_scale=0.01, tokenizer=str(tokenizer_dir), served_model_name=MODEL)
    async with SimPool(1, config) as pool, UpstreamClient(trust_env=False) as upstream:
        yield pool, poster(upstream)


@asynccontextmanager
async def raw_server(answer: bytes | None) -> AsyncIterator[str]:
    """A 127.0.0.1 server that reads a request and sends ``answer`` (None: never answers)."""

    async def handle(stream: SocketStream) -> None:
        async with stream:
            await stream.receive()
            if answer is None:
                await anyio.sleep_forever()
            else:
                await stream.send(answer)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        yield f"http://127.0.0.1:{port}"
        tg.cancel_scope.cancel()


async def test_remote_ids_equal_the_local_ones(tokenizer_dir: Path) -> None:
    local = LocalPromptTokenizer(tokenizer_dir)
    with anyio.fail_after(30):
        async with sim_replica(tokenizer_dir) as (pool, http):
            remote = RemotePromptTokenizer(http, lambda: pool.urls[0])
            assert isinstance(remote, PromptTokenizer)
            for api, payload in PAYLOADS:
                assert await remote.prompt_token_ids(api, payload) == await local.prompt_token_ids(
                    api, payload
                )
            assert await remote.prompt_token_ids(COMPLETIONS, {"prompt": [3, 4]}) == (3, 4)


async def test_cached_answers_need_no_replica(tokenizer_dir: Path) -> None:
    payload = {"messages": [{"role": "user", "content": "cache me"}]}
    config = SimConfig(time_scale=0.01, tokenizer=str(tokenizer_dir), served_model_name=MODEL)
    with anyio.fail_after(30):
        async with UpstreamClient(trust_env=False) as upstream:
            http = poster(upstream)
            urls: list[str] = []
            remote = RemotePromptTokenizer(http, lambda: urls[0])
            async with SimPool(1, config) as pool:
                urls.extend(pool.urls)
                first = await remote.prompt_token_ids(CHAT, payload)
            # the replica is gone: a cached prompt is still answered, a new one fails
            assert await remote.prompt_token_ids(CHAT, payload) == first
            assert (remote.cache.misses, remote.cache.hits) == (1, 1)
            with pytest.raises(TokenizationError, match="ConnectError"):
                await remote.prompt_token_ids(CHAT, {"messages": [{"role": "user", "content": "new"}]})


async def test_failures_are_tokenization_errors(tokenizer_dir: Path) -> None:
    payload = {"messages": [{"role": "user", "content": "x"}]}
    async with UpstreamClient(trust_env=False) as upstream:
        http = poster(upstream)
        with pytest.raises(TokenizationError, match="no replica"):
            await RemotePromptTokenizer(http, lambda: None).prompt_token_ids(CHAT, payload)
        with anyio.fail_after(10):
            async with raw_server(None) as url:
                slow = RemotePromptTokenizer(http, lambda: url, timeout_s=0.2)
                with pytest.raises(TokenizationError, match="ReadTimeout"):
                    await slow.prompt_token_ids(CHAT, payload)
            wrong = (
                b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"count":1}'
            )
            async with raw_server(wrong) as url:
                with pytest.raises(TokenizationError, match="without a tokens list"):
                    await RemotePromptTokenizer(http, lambda: url).prompt_token_ids(CHAT, payload)
    with anyio.fail_after(30):
        async with sim_replica(tokenizer_dir) as (pool, http):
            remote = RemotePromptTokenizer(http, lambda: pool.urls[0])
            with pytest.raises(TokenizationError, match="answered 404: The model `other` does not exist"):
                await remote.prompt_token_ids(CHAT, {**payload, "model": "other"})


def test_tokenize_body_carries_what_tokenize_takes() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    chat = parse_prompt(
        CHAT,
        {
            "messages": [{"role": "user", "content": "x"}],
            "tools": tools,
            "documents": [{"title": "t", "text": "d"}],
            "reasoning_effort": "none",
            "chat_template_kwargs": {"persona": "p"},
            "max_tokens": 5,
        },
    )
    assert tokenize_body(chat, "m") == {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "add_generation_prompt": True,
        "continue_final_message": False,
        "add_special_tokens": False,
        "tools": tools,
        "chat_template_kwargs": {
            "persona": "p",
            "reasoning_effort": "none",
            "enable_thinking": False,
            "documents": [{"title": "t", "text": "d"}],
        },
    }
    text = parse_prompt(COMPLETIONS, {"prompt": ["a", "b"], "add_special_tokens": False})
    assert tokenize_body(text, None) == {"prompt": "a", "add_special_tokens": False}
