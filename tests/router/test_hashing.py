from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from burstsched.prefix.hashing import block_hashes, pseudo_tokens, render_chat, render_prompt

messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=300)}
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=50, deadline=None)
@given(conversation=messages, extra=messages)
def test_chat_rendering_keeps_prefixes(
    conversation: list[dict[str, str]], extra: list[dict[str, str]]
) -> None:
    short = render_chat(conversation)
    long = render_chat(conversation + extra)
    assert long.startswith(short)
    a = block_hashes(short, model="m", block_tokens=4)
    b = block_hashes(long, model="m", block_tokens=4)
    assert b[: len(a)] == a


def test_chain_covers_full_blocks_only_and_is_capped() -> None:
    data = b"x" * (256 * 3 + 100)
    assert len(block_hashes(data, model="m")) == 3
    assert len(block_hashes(data, model="m", max_blocks=2)) == 2
    assert block_hashes(b"x" * 255, model="m") == ()
    assert pseudo_tokens(data) == (256 * 3 + 100) // 4


def test_chain_is_seeded_by_model_and_salt() -> None:
    data = b"y" * 1024
    base = block_hashes(data, model="m")
    assert block_hashes(data, model="m") == base
    assert block_hashes(data, model="other")[0] != base[0]
    assert block_hashes(data, model="m", cache_salt="s")[0] != base[0]


def test_divergence_changes_every_later_hash() -> None:
    a = bytearray(b"z" * 2048)
    b = bytearray(a)
    b[300] = ord("q")  # inside block 1 (256 bytes per block)
    ha, hb = block_hashes(bytes(a), model="m"), block_hashes(bytes(b), model="m")
    assert ha[0] == hb[0]
    assert all(x != y for x, y in zip(ha[1:], hb[1:], strict=True))


def test_chat_rendering_includes_tools_and_structure() -> None:
    plain = render_chat([{"role": "user", "content": "hi"}])
    with_tools = render_chat([{"role": "user", "content": "hi"}], tools=[{"type": "function"}])
    assert plain != with_tools and with_tools.endswith(plain)
    assert render_chat([{"role": "user", "content": "ab"}]) != render_chat(
        [{"role": "user", "content": "a"}, {"role": "b", "content": ""}]
    )
    parts = render_chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert parts == plain
    assert render_prompt([1, 2]) == b"\x01\x00\x00\x00\x02\x00\x00\x00"
