from __future__ import annotations

import pytest

from burstsched.workloads.contexts import context_text, sized_context


def test_contexts_are_deterministic_and_unique() -> None:
    assert context_text("a", 20, 1) == context_text("a", 20, 1)
    assert context_text("a", 20, 1) != context_text("b", 20, 1)
    assert context_text("a", 20, 1).startswith("Context a.")


@pytest.mark.anyio
async def test_sized_context_is_the_shortest_reaching_the_target() -> None:
    async def count(text: str) -> int:
        return len(text) // 4

    text = await sized_context("u", 1000, 3, count)
    lines = text.count("\n")
    assert await count(text) >= 1000
    assert await count(context_text("u", lines - 1, 3)) < 1000
