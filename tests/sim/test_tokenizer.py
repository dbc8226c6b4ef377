"""Tokenizers: the built-in one's BPE-like properties, and a model's own files read like vLLM does."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from burstsched.sim import SimConfig, SimPool
from burstsched.sim.chat_template import CHATML_TEMPLATE, ChatTemplate, TemplateError
from burstsched.sim.tokenizer import BuiltinTokenizer, HFTokenizer, load_tokenizer

from .http_helpers import MODEL, client

WORDS = (
    "the latency of node seven rose during the deployment while error rates stayed flat across regions"
).split()


def english(n_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words)) + "."


def test_builtin_gives_about_four_characters_per_token_on_english() -> None:
    text = english(3000)
    ratio = len(text) / len(BuiltinTokenizer().encode(text, add_special_tokens=False))
    assert 3.5 <= ratio <= 4.5


@settings(max_examples=50, deadline=None)
@given(words=st.integers(5, 200), cut=st.floats(0.05, 0.95), seed=st.integers(0, 1000))
def test_builtin_prefix_tokens_are_a_prefix_except_near_the_cut(words: int, cut: float, seed: int) -> None:
    tok = BuiltinTokenizer()
    text = english(words, seed)
    prefix = text[: int(len(text) * cut)]
    full, part = tok.encode(text, add_special_tokens=False), tok.encode(prefix, add_special_tokens=False)
    common = 0
    while common < min(len(full), len(part)) and full[common] == part[common]:
        common += 1
    assert common >= len(part) - 2


def test_builtin_special_tokens_and_determinism() -> None:
    tok = BuiltinTokenizer()
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2
    assert ids == BuiltinTokenizer().encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=True)
    assert tok.decode(tok.encode("hello there", add_special_tokens=False)) == "hello there"
    vocab = tok.output_vocabulary()
    assert len(vocab) > 20
    assert all(tok.encode(text, add_special_tokens=False) == [i] for i, text in vocab)


def test_chat_template_renders_chatml_and_rejects_what_the_template_rejects() -> None:
    template = ChatTemplate(None)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
    ]
    assert template.render(messages) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.render(messages, add_generation_prompt=False).endswith("a<|im_end|>\n")
    strict = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}x"
    )
    with pytest.raises(TemplateError, match="user first"):
        strict.render(messages)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tiny byte-level BPE saved as a model folder, with a BOS post-processor and a ChatML template."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([english(50, s) for s in range(200)], trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "bos_token": "<s>", "chat_template": CHATML_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    yield folder


def test_hf_tokenizer_matches_the_tokenizers_package(hf_folder: Path) -> None:
    ours = load_tokenizer(str(hf_folder))
    assert isinstance(ours, HFTokenizer)
    theirs = Tokenizer.from_file(str(hf_folder / "tokenizer.json"))
    text = english(40, 7)
    assert ours.encode(text, add_special_tokens=True) == theirs.encode(text).ids
    assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False).ids
    assert ours.encode(text, add_special_tokens=True)[0] == theirs.token_to_id("<s>")
    assert ours.chat_template == CHATML_TEMPLATE
    assert ours.eos_token_id == theirs.token_to_id("<|im_end|>")
    assert ours.output_vocabulary()


def test_hf_tokenizer_missing_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        HFTokenizer(tmp_path / "nope")
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        HFTokenizer(tmp_path)


@pytest.mark.anyio
async def test_replica_with_model_files_tokenizes_like_vllm(hf_folder: Path) -> None:
    theirs = Tokenizer.from_file(str(hf_folder / "tokenizer.json"))
    text = english(30, 3)
    messages = [{"role": "user", "content": text}]
    rendered = ChatTemplate(CHATML_TEMPLATE).render(messages)
    config = SimConfig(time_scale=0.01, tokenizer=str(hf_folder))
    async with SimPool(1, config) as pool, client() as http:
        url = pool.urls[0]
        chat_tok = (await http.post(f"{url}/tokenize", json={"messages": messages})).json()
        prompt_tok = (await http.post(f"{url}/tokenize", json={"prompt": text})).json()
        chat = await http.post(
            f"{url}/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2}
        )
        completion = await http.post(
            f"{url}/v1/completions", json={"model": MODEL, "prompt": text, "max_tokens": 2}
        )
    # Chat: template rendered with the generation prompt, then tokenized without adding special tokens.
    assert chat_tok["tokens"] == theirs.encode(rendered, add_special_tokens=False).ids
    assert chat.json()["usage"]["prompt_tokens"] == chat_tok["count"]
    # Completions and plain /tokenize: special tokens added (the BOS here), as vLLM does.
    assert prompt_tok["tokens"] == theirs.encode(text).ids
    assert completion.json()["usage"]["prompt_tokens"] == prompt_tok["count"]
