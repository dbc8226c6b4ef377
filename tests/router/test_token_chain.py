"""The router's chained token-block hash: the numba kernel equals the plain-Python reference."""

from __future__ import annotations

from burstsched_plugins.token_chain import chain_hashes, chain_hashes_reference, root_seed
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=80, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=80),
    block_size=st.integers(1, 9),
    seed=st.integers(0, 2**64 - 1),
)
def test_kernel_equals_reference(tokens: list[int], block_size: int, seed: int) -> None:
    assert chain_hashes(tokens, block_size, seed=seed) == chain_hashes_reference(
        tokens, block_size, seed=seed
    )


def test_prefixes_share_hashes_and_a_change_changes_every_later_block() -> None:
    tokens = list(range(100, 164))
    full = chain_hashes(tokens, 16, seed=root_seed())
    assert len(full) == 4 and len(set(full)) == 4
    assert chain_hashes(tokens[:40], 16, seed=root_seed()) == full[:2]
    changed = chain_hashes([*tokens[:20], 7, *tokens[21:]], 16, seed=root_seed())
    assert changed[0] == full[0] and all(a != b for a, b in zip(changed[1:], full[1:], strict=True))
    assert chain_hashes(tokens, 16, seed=root_seed(), max_blocks=2) == full[:2]
    assert chain_hashes(tokens, 32, seed=root_seed())[0] != full[1]  # the block size is part of the hash
    assert chain_hashes(tokens[:15], 16, seed=root_seed()) == []


def test_chaining_from_a_parent_continues_the_chain() -> None:
    tokens = list(range(48))
    full = chain_hashes(tokens, 16, seed=root_seed())
    assert chain_hashes(tokens[16:], 16, seed=full[0]) == full[1:]
    assert root_seed("a") != root_seed("b") != root_seed()
