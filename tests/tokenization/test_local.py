"""The local prompt tokenizer on the tiny model's tokenizer: ids, special tokens, cache, threads, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
from tokenizers import Tokenizer, processors

from burstsched.framework import ApiKind
from burstsched.tokenization import (
    LocalPromptTokenizer,
    PromptTokenizer,
    TemplateError,
    TokenizationError,
)
from burstsched.workloads.contexts import context_text

pytestmark = pytest.mark.anyio
CHAT, COMPLETIONS = ApiKind.CHAT, ApiKind.COMPLETIONS


@pytest.fixture(scope="module")
def bos_dir(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer with a BOS post-processor (as Llama-style tokenizers have) and a strict template."""
    folder = tmp_path_factory.mktemp("bos-tokenizer")
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    bos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    tok.save(str(folder / "tokenizer.json"))
    template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return folder


def _encode(folder: Path, text: str, special: bool) -> tuple[int, ...]:
    ids: list[int] = (
        Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=special).ids
    )
    return tuple(ids)


async def test_chat_is_the_rendered_template_encoded(tokenizer_dir: Path) -> None:
    tokenizer = LocalPromptTokenizer(tokenizer_dir)
    assert isinstance(tokenizer, PromptTokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Grüße 🚀"}]
    text = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nGrüße 🚀<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = await tokenizer.prompt_token_ids(CHAT, {"messages": messages})
    assert ids == _encode(tokenizer_dir, text, False)
    assert ids[0] == _encode(tokenizer_dir, "<|im_start|>", False)[0]  # one special token


async def test_special_tokens_follow_vllms_defaults(bos_dir: Path) -> None:
    tokenizer = LocalPromptTokenizer(bos_dir)
    bos = _encode(bos_dir, "", True)[0]
    text = "The queue drained."
    assert await tokenizer.prompt_token_ids(COMPLETIONS, {"prompt": text}) == _encode(bos_dir, text, True)
    assert (await tokenizer.prompt_token_ids(COMPLETIONS, {"prompt": text}))[0] == bos
    no_bos = await tokenizer.prompt_token_ids(COMPLETIONS, {"prompt": text, "add_special_tokens": False})
    assert no_bos == _encode(bos_dir, text, False)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert (await tokenizer.prompt_token_ids(CHAT, chat))[0] != bos
    assert (await tokenizer.prompt_token_ids(CHAT, {**chat, "add_special_tokens": True}))[0] == bos


async def test_completion_prompt_forms(tokenizer_dir: Path) -> None:
    tokenizer = LocalPromptTokenizer(tokenizer_dir)
    first = await tokenizer.prompt_token_ids(COMPLETIONS, {"prompt": "first prompt"})
    assert await tokenizer.prompt_token_ids(COMPLETIONS, {"prompt": ["first prompt", "second"]}) == first
    assert await tokenizer.prompt_token_ids(COMPLETIONS, {"prompt": [9, 8, 7]}) == (9, 8, 7)
    assert await tokenizer.prompt_token_ids(COMPLETIONS, {"prompt": [[1, 2], [3]]}) == (1, 2)


async def test_inline_and_worker_thread_give_the_same_ids(tokenizer_dir: Path) -> None:
    inline = LocalPromptTokenizer(tokenizer_dir, thread_min_bytes=10**9)
    threaded = LocalPromptTokenizer(tokenizer_dir, thread_min_bytes=0)
    for api, body in (
        (CHAT, {"messages": [{"role": "user", "content": "Grüße 🚀 " + context_text("t", 5, 2)}]}),
        (COMPLETIONS, {"prompt": "<|im_start|>x<|im_end|> " + context_text("t", 5, 3)}),
    ):
        assert await inline.prompt_token_ids(api, body) == await threaded.prompt_token_ids(api, body)


async def test_results_are_cached_and_a_burst_is_tokenized_once(tokenizer_dir: Path) -> None:
    tokenizer = LocalPromptTokenizer(tokenizer_dir, cache_entries=2, thread_min_bytes=0)
    body = {"messages": [{"role": "user", "content": context_text("burst", 40, 1)}]}
    results: list[tuple[int, ...]] = []

    async def ask() -> None:
        results.append(await tokenizer.prompt_token_ids(CHAT, body))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(ask)
    assert len(set(results)) == 1 and len(results) == 8
    assert (tokenizer.cache.misses, tokenizer.cache.hits) == (1, 7)
    assert await tokenizer.prompt_token_ids(CHAT, body) == results[0]
    assert tokenizer.cache.hits == 8
    for i in range(2):
        await tokenizer.prompt_token_ids(COMPLETIONS, {"prompt": f"other {i}"})
    assert len(tokenizer.cache) == 2
    await tokenizer.prompt_token_ids(CHAT, body)
    assert tokenizer.cache.misses == 4  # evicted by the two others, computed again


async def test_long_prompts_leave_the_event_loop_free(tokenizer_dir: Path) -> None:
    """Inline, the loop runs nothing else during the encoding; in a worker thread it keeps serving.

    Counted in loop ticks of a task that wakes every millisecond, not in seconds, so the verdict does not
    depend on the machine's speed: the encoding of ~150k tokens takes far longer than one tick anywhere.
    """
    body: dict[str, Any] = {"prompt": context_text("long", 2500, 3)}  # ~150k tokens

    async def ticks_during(tokenizer: LocalPromptTokenizer) -> int:
        ticks = 0
        done = anyio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                await anyio.sleep(0.001)
                ticks += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await anyio.sleep(0.01)
            before = ticks
            ids = await tokenizer.prompt_token_ids(COMPLETIONS, body)
            during = ticks - before
            done.set()
        assert len(ids) > 100_000
        return during

    inline = LocalPromptTokenizer(tokenizer_dir, cache_entries=0, thread_min_bytes=10**9)
    threaded = LocalPromptTokenizer(tokenizer_dir, cache_entries=0)
    with anyio.fail_after(60):
        assert await ticks_during(inline) == 0
        assert await ticks_during(threaded) >= 1


async def test_errors_say_why(tokenizer_dir: Path, bos_dir: Path, tmp_path: Path) -> None:
    strict = LocalPromptTokenizer(bos_dir)
    with pytest.raises(TemplateError, match="user first"):
        await strict.prompt_token_ids(CHAT, {"messages": [{"role": "system", "content": "s"}]})
    image = {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}
    with pytest.raises(TokenizationError, match="not text"):
        await strict.prompt_token_ids(CHAT, {"messages": [{"role": "user", "content": [image]}]})
    with pytest.raises(TokenizationError, match="chat_template"):
        await strict.prompt_token_ids(CHAT, {"messages": [], "chat_template": "x"})
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tokenizer_dir / "tokenizer.json", bare / "tokenizer.json")
    no_template = LocalPromptTokenizer(bare / "tokenizer.json")
    with pytest.raises(TokenizationError, match="no chat template"):
        await no_template.prompt_token_ids(CHAT, {"messages": [{"role": "user", "content": "x"}]})
    assert await no_template.prompt_token_ids(COMPLETIONS, {"prompt": "x"})
    with pytest.raises(TokenizationError, match="does not exist"):
        LocalPromptTokenizer(tmp_path / "missing")
