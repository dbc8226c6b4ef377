"""Build the tiny random-weight Qwen2 model and its tokenizer into a folder, deterministically.

A plain script for the vLLM venv's python (it has torch, transformers and tokenizers); it imports nothing from
burstsched. Usage: ``python tiny_model_build.py OUT_DIR``.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

SEED = 20261130
VOCAB_SIZE = 4096
CORPUS_LINES = 20000
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN = "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen2's pre-tokenizer: transformers' Qwen2Tokenizer (what vLLM loads for a qwen2 model) rebuilds the
# normalizer and pre-tokenizer with these, whatever tokenizer.json says; training with them keeps
# tokenizer.json and vLLM's tokenization identical.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
MODEL_CONFIG: dict[str, Any] = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 16384,
    "tie_word_embeddings": True,
    "dtype": "float32",
}

_WORDS = (
    "the a an of to in on at for with by from and or but not is are was were be been has have had this that "
    "these those it its they we you he she replica cache prefix token block request response latency "
    "throughput queue engine server client router scheduler memory disk network packet error warning "
    "metric counter gauge histogram sample window burst load traffic tenant user session question answer "
    "summary observation measurement engineer operator system service node cluster region zone rack host "
    "process thread core kernel driver model weight layer head batch step decode prefill time second minute "
    "hour day week percent rate ratio median mean peak spike drop rise fall stable slow fast high low "
    "increased decreased measured observed reported collected expected unexpected normal abnormal first "
    "last next previous after before during while when where which what why how many much more less most "
    "least all some each every other another same different new old warm cold hot idle busy full empty "
    "open closed healthy degraded failed restarted recovered scaled moved routed sent received dropped "
    "retried timed out temperature pressure voltage current power fan storage volume backup snapshot "
    "alert page incident review change deploy release rollback config flag version build test check"
).split()


_ONSETS = "b c d f g h j k l m n p r s t v w y z bl br ch cl cr dr fl fr gr pl pr sh sl st str th tr".split()
_VOWELS = "a e i o u ai ea ee io oo ou".split()
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "rt", "ck", "sh"]


def pseudo_words(rng: random.Random, count: int) -> list[str]:
    """English-looking made-up words, so the tokenizer learns many merges beyond the real word list."""
    words: set[str] = set()
    while len(words) < count:
        syllables = rng.choice((1, 2, 2, 3, 3, 4))
        words.add(
            "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
        )
    return sorted(words)


def corpus(rng: random.Random) -> list[str]:
    """English-like lines: real and made-up words (Zipf-like frequencies), numbers, punctuation."""
    vocabulary = list(_WORDS) + pseudo_words(rng, 6000)
    weights = [1.0 / (rank + 1) ** 0.8 for rank in range(len(vocabulary))]
    lines = []
    for _ in range(CORPUS_LINES):
        words = rng.choices(vocabulary, weights, k=rng.randint(6, 24))
        for _ in range(rng.randint(0, 3)):
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        text = " ".join(words)
        lines.append(text[0].upper() + text[1:] + rng.choice([".", ".", ".", "?", "!", ":", ";", ","]))
    return lines


def build_tokenizer(out: Path, rng: random.Random) -> int:
    """Train a byte-level BPE tokenizer; returns the vocabulary size."""
    tk = importlib.import_module("tokenizers")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.normalizer = tk.normalizers.NFC()
    tokenizer.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Split(tk.Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(rng), trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "eos_token": EOS_TOKEN,
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "model_max_length": MODEL_CONFIG["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    special = {"eos_token": EOS_TOKEN, "pad_token": "<|endoftext|>"}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")
    return int(tokenizer.get_vocab_size())


def build_model(out: Path, vocab_size: int) -> None:
    """A seeded random-weight Qwen2ForCausalLM, saved as safetensors."""
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    torch.manual_seed(SEED)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = transformers.Qwen2Config(
        vocab_size=vocab_size, bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id, **MODEL_CONFIG
    )
    model = transformers.Qwen2ForCausalLM(config).to(torch.float32)
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    model.generation_config.save_pretrained(str(out))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: tiny_model_build.py OUT_DIR", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = build_tokenizer(out, random.Random(SEED))
    build_model(out, vocab_size)
    print(f"tiny model built in {out} (vocab {vocab_size})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
