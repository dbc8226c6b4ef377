"""The multi-tenant chat sequence: fixed by its seed, turns extending the previous turn, tenants sharing
their system prompt, bursts; the ideal hit rate on a hand-made sequence."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

import anyio
import pytest

from burstsched.sim.tokenizer import BuiltinTokenizer
from burstsched.tokenization.chat_template import ChatTemplate
from burstsched.workloads.tenants import (
    ChatTurn,
    Tenants,
    TenantsSpec,
    build_sequence,
    build_tenants,
    conversation,
    distinct_blocks,
    ideal_hit_rate,
    ideal_hits,
)

SPEC = TenantsSpec(tenants=5, rate=4.0, duration_s=1000.0, max_requests=400, burst_gaps=40.0, seed=3)
TENANTS = Tenants(3, tuple(f"System prompt of tenant {t}. " * 20 for t in range(5)), (100,) * 5, 8)


def test_same_seed_gives_the_identical_sequence() -> None:
    first = build_sequence(SPEC, random.Random(3))
    assert first == build_sequence(SPEC, random.Random(3))
    assert len(first) == 400
    assert build_sequence(SPEC, random.Random(4)) != first
    assert [TENANTS.messages(r) for r in first] == [
        TENANTS.messages(r) for r in build_sequence(SPEC, random.Random(3))
    ]


def test_rate_changes_only_the_times() -> None:
    slow = build_sequence(SPEC, random.Random(5))
    fast = build_sequence(replace(SPEC, rate=16.0), random.Random(5))
    assert [(r.tenant, r.user, r.turn, r.follows, r.burst) for r in slow] == [
        (r.tenant, r.user, r.turn, r.follows, r.burst) for r in fast
    ]
    for a, b in zip(slow, fast, strict=True):
        assert a.arrival_s == pytest.approx(4 * b.arrival_s)


def test_conversations_are_well_formed() -> None:
    requests = build_sequence(SPEC, random.Random(1))
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals)
    assert [r.index for r in requests] == list(range(len(requests)))
    for r in requests:
        if r.turn == 1:
            assert r.follows is None
        else:
            previous = requests[r.follows or 0]
            assert r.follows is not None and r.follows < r.index
            assert (previous.tenant, previous.user, previous.turn + 1) == (r.tenant, r.user, r.turn)
    turns = Counter((r.tenant, r.user) for r in requests)
    assert max(turns.values()) <= SPEC.turns_max
    assert len(turns) > 50  # many users
    assert len({r.tenant for r in requests}) == SPEC.tenants


def test_bursts_are_new_users_of_one_tenant_at_once() -> None:
    requests = build_sequence(SPEC, random.Random(2))
    bursts: dict[int, list[ChatTurn]] = {}
    for r in requests:
        if r.burst is not None and r.turn == 1:
            bursts.setdefault(r.burst, []).append(r)
    assert len(bursts) >= 3  # 400 arrivals, one burst every ~40 gaps
    for members in bursts.values():
        assert len(members) == SPEC.burst_users or members[-1].index == len(requests) - 1
        assert len({(m.tenant, m.arrival_s) for m in members}) == 1
        assert len({m.user for m in members}) == len(members)
    no_bursts = build_sequence(replace(SPEC, burst_gaps=0.0), random.Random(2))
    assert all(r.burst is None for r in no_bursts)


def test_poisson_part_runs_at_the_asked_rate() -> None:
    spec = replace(SPEC, burst_gaps=0.0, max_requests=4000, rate=10.0)
    requests = build_sequence(spec, random.Random(6))
    assert len(requests) / requests[-1].arrival_s == pytest.approx(10.0, rel=0.06)
    bounded = build_sequence(replace(spec, duration_s=10.0), random.Random(6))
    assert bounded == requests[: len(bounded)] and all(r.arrival_s < 10.0 for r in bounded)


def test_each_turn_extends_the_previous_turn() -> None:
    requests = build_sequence(SPEC, random.Random(7))
    later = [r for r in requests if r.turn >= 3][:20]
    assert later
    for r in later:
        before = TENANTS.messages(requests[r.follows or 0])
        now = TENANTS.messages(r)
        assert now[: len(before)] == before
        assert [m["role"] for m in now[len(before) :]] == ["assistant", "user"]
        assert len(now) == 2 * r.turn
    # and so do the prompts the engine sees, token by token
    template, tokenizer = ChatTemplate(None), BuiltinTokenizer()  # the simulator's ChatML and tokenizer
    for r in later:
        previous = tokenizer.encode(
            template.render(TENANTS.messages(requests[r.follows or 0])), add_special_tokens=False
        )
        tokens = tokenizer.encode(template.render(TENANTS.messages(r)), add_special_tokens=False)
        assert tokens[: len(previous)] == previous and len(tokens) > len(previous)


def test_tenants_share_their_system_prompt_and_nothing_else() -> None:
    requests = build_sequence(SPEC, random.Random(8))
    firsts = [r for r in requests if r.turn == 1]
    by_tenant: dict[int, list[ChatTurn]] = {}
    for r in firsts:
        by_tenant.setdefault(r.tenant, []).append(r)
    for tenant, members in by_tenant.items():
        systems = {TENANTS.messages(m)[0]["content"] for m in members}
        assert systems == {TENANTS.system_prompts[tenant]}
        questions = {TENANTS.messages(m)[-1]["content"] for m in members}
        assert len(questions) == len(members)  # every user asks their own question
    assert len({TENANTS.messages(r)[-1]["content"] for r in requests}) == len(requests)


def test_stand_in_answers_have_the_answer_length() -> None:
    turn = ChatTurn(0, tenant=1, user=2, turn=3, arrival_s=0.0, follows=None)
    messages = conversation(turn, "sys", seed=0, answer_words=16)
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    assert len(answers) == 2 and answers[0] != answers[1]
    tokenizer = BuiltinTokenizer()
    assert all(len(tokenizer.encode(a, add_special_tokens=False)) == 16 for a in answers)


@pytest.mark.anyio
async def test_system_prompts_reach_their_drawn_lengths() -> None:
    async def count(text: str) -> int:
        await anyio.lowlevel.checkpoint()
        return len(text) // 4

    spec = TenantsSpec(tenants=4, system_tokens_min=1000, system_tokens_max=4000, seed=2)
    tenants = await build_tenants(spec, count, random.Random(0))
    assert tenants == await build_tenants(spec, count, random.Random(0))
    assert len(set(tenants.system_prompts)) == 4
    assert all(1000 <= n <= 4000 + 60 for n in tenants.system_tokens)
    assert len({p[:40] for p in tenants.system_prompts}) == 4  # they differ from their first words


# -- ideal hit rate ------------------------------------------------------------------------------------
def test_ideal_hits_on_a_hand_made_sequence() -> None:
    """Blocks of 4. Tenant A's system prompt is 1-8, tenant B's 20-27."""
    a1 = [1, 2, 3, 4, 5, 6, 7, 8, 100, 101]  # A, user 1, turn 1: cold
    a2 = [1, 2, 3, 4, 5, 6, 7, 8, 200, 201, 202]  # A, user 2: the system prompt's 2 blocks
    b1 = [20, 21, 22, 23, 24, 25, 26, 27, 300]  # B, user 1: cold
    a1t2 = [*a1, 110, 111, 112, 113, 114]  # A, user 1, turn 2: a1 filled 2 blocks; (100, 101, 110, 111) new
    b1t2 = [*b1, 301, 302, 303, 304]  # B, user 1, turn 2: blocks (20-23), (24-27) cached, (300-303) new
    tiny = [1, 2, 3, 4]  # its one block is cached, but the last token is always computed: no hit
    prompts = [a1, a2, b1, a1t2, b1t2, tiny]
    assert ideal_hits(prompts, 4) == [0, 8, 0, 8, 8, 0]
    total = sum(map(len, prompts))
    assert total == 10 + 11 + 9 + 15 + 13 + 4
    assert ideal_hit_rate(prompts, 4) == pytest.approx(24 / 62)
    # a1t2's third block is cached once a1t2 ran: its own next turn hits 12
    assert ideal_hits([*prompts, [*a1t2, 999]], 4)[-1] == 12
    assert distinct_blocks(prompts, 4) == 2 + 0 + 2 + 1 + 1 + 0  # new full blocks of each prompt
    assert math.isnan(ideal_hit_rate([], 16))


def test_ideal_hits_need_a_shared_prefix_not_shared_blocks() -> None:
    """Same block content after a different first block is no hit (the keys chain like vLLM's)."""
    assert ideal_hits([[1, 2, 5, 6, 9], [3, 4, 5, 6, 9]], 2) == [0, 0]
    assert ideal_hits([[1, 2, 5, 6, 9], [1, 2, 5, 6, 9]], 2) == [0, 4]
    with pytest.raises(ValueError):
        ideal_hits([[1]], 0)
