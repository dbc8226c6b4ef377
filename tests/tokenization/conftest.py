"""The tiny model's tokenizer folder, built here with the ``tokenizers`` package alone (no vLLM, no download).

It is byte-for-byte the tokenizer of ``burstsched.testing.tiny_model`` (same builder, same seed), the one the
real-vLLM tests serve.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from burstsched.testing.tiny_model_build import SEED, build_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tokenizer(folder, random.Random(SEED))
    return folder
