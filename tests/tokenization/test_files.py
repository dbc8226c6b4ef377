"""Reading tokenizer folders as transformers does: template priority, named templates, clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from burstsched.tokenization import TokenizationError, load_encoder, read_tokenizer_files


def _copy(tokenizer_dir: Path, target: Path, config: dict[str, object] | None) -> Path:
    target.mkdir()
    shutil.copy(tokenizer_dir / "tokenizer.json", target / "tokenizer.json")
    if config is not None:
        (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


def test_folder_gives_template_and_set_special_tokens(tokenizer_dir: Path) -> None:
    files = read_tokenizer_files(tokenizer_dir)
    assert files.tokenizer_json == tokenizer_dir / "tokenizer.json"
    assert files.chat_template is not None and "<|im_start|>" in files.chat_template
    # Only the tokens that are set, as transformers' special_tokens_map (bos_token is null here).
    assert files.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert load_encoder(files).token_to_id("<|im_end|>") is not None


def test_bare_tokenizer_json_reads_its_neighbours_or_goes_without(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    assert read_tokenizer_files(tokenizer_dir / "tokenizer.json").chat_template is not None
    alone = _copy(tokenizer_dir, tmp_path / "alone", None)
    files = read_tokenizer_files(alone / "tokenizer.json")
    assert files.chat_template is None and files.special_tokens == {}


def test_template_files_win_over_the_config_and_tool_use_is_picked_for_tools(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    named = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
    folder = _copy(tokenizer_dir, tmp_path / "named", {"chat_template": named, "eos_token": {"content": "x"}})
    files = read_tokenizer_files(folder)
    assert files.chat_template_for(tools=False) == "D"
    assert files.chat_template_for(tools=True) == "T"
    assert files.special_tokens == {"eos_token": "x"}
    (folder / "chat_template.jinja").write_text("FILE")
    files = read_tokenizer_files(folder)
    assert files.chat_template == "FILE"
    assert files.chat_template_for(tools=True) == "FILE"  # files replace every config template
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("TOOLS")
    assert read_tokenizer_files(folder).chat_template_for(tools=True) == "TOOLS"


def test_missing_or_malformed_files_are_tokenization_errors(tokenizer_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TokenizationError, match="does not exist"):
        read_tokenizer_files(tmp_path / "nope")
    with pytest.raises(TokenizationError, match=r"tokenizer\.json not found"):
        read_tokenizer_files(tmp_path)
    folder = _copy(tokenizer_dir, tmp_path / "bad-config", None)
    (folder / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(TokenizationError, match="not a JSON object"):
        read_tokenizer_files(folder)
    (folder / "tokenizer_config.json").write_text("{broken")
    with pytest.raises(TokenizationError, match="cannot read"):
        read_tokenizer_files(folder)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(TokenizationError, match="cannot load"):
        load_encoder(read_tokenizer_files(broken))
