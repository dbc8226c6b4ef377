"""Mixed multi-tenant chat: tenants with long system prompts, many users in multi-turn conversations.

``T`` tenants each have a system prompt of 1–4k tokens (operations-log text after a unique id, sized with
the serving tokenizer). Their users hold multi-turn conversations: each turn's prompt is the whole
conversation so far (the tenant's system prompt, the user's earlier questions and the answers to them)
and a new question, sent as chat messages. Requests arrive as a Poisson process; each arrival continues
the conversation that has been waiting longest for its next turn (its user's think time over), or starts
a new user of a tenant drawn by a Zipf law when none is waiting. Bursts come on top: now and then ``K``
new users of one tenant (drawn uniformly, cold ones too) arrive at once.

Answers are deterministic stand-ins, not what the replica returned: the earlier answers in a turn's
prompt are ``max_tokens`` short common words (one token each for the built-in tokenizer and common BPE
vocabularies), drawn from the request's own seed. So the whole sequence (every prompt, every arrival) is
fixed before the run, every target gets byte-identical requests, and the ideal hit rate is computed from
the sequence alone. What it gives up: a turn's prompt does not reuse the blocks of the previous answer
the engine generated (a real chat client's would), only those of the previous prompt.

Everything here is pure and deterministic: :func:`build_sequence` draws the arrivals and who sends them
from an injected RNG, in units of the mean inter-arrival gap, so one seed gives the same conversations at
every rate, only spread over time differently; :func:`conversation` renders a turn as chat messages;
:func:`ideal_hits` is the hit rate of perfect affinity with an infinite cache over token prompts.
Running it against a URL is :mod:`burstsched.workloads.tenants_run`.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from burstsched.workloads.contexts import sized_context
from burstsched.workloads.docqa import QUESTION_TEXTS
from burstsched.workloads.zipf import ZipfSampler

CountTokens = Callable[[str], Awaitable[int]]
"""Tokens of a text sent as one chat message, as the replicas count them."""
Message = dict[str, str]

ANSWER_WORDS = (
    "the of and to in is it for on was as at by an be or are from has had not but all can out one two "
    "new old big low top end key log set run job map day row bit way use max min sum node data disk load "
    "time rate user code test file host port pool read send slow fast warm cold heap core lock path page"
).split()


@dataclass(frozen=True, slots=True)
class TenantsSpec:
    """One multi-tenant chat workload. Lengths in the replicas' tokens, rates in requests per second;
    think time and burst spacing in mean inter-arrival gaps (so they scale with the rate)."""

    tenants: int = 10
    tenant_zipf: float = 1.0
    system_tokens_min: int = 1000
    system_tokens_max: int = 4000
    turns_min: int = 2
    turns_max: int = 6
    think_gaps: float = 20.0
    burst_users: int = 8
    burst_gaps: float = 60.0
    """Mean gap between bursts; 0 means no bursts."""
    max_tokens: int = 16
    rate: float = 2.0
    duration_s: float = 60.0
    max_requests: int = 400
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tenants < 1:
            raise ValueError("tenants must be >= 1")
        if not 1 <= self.system_tokens_min <= self.system_tokens_max:
            raise ValueError("need 1 <= system_tokens_min <= system_tokens_max")
        if not 1 <= self.turns_min <= self.turns_max:
            raise ValueError("need 1 <= turns_min <= turns_max")
        if self.think_gaps < 0 or self.burst_gaps < 0 or self.burst_users < 1:
            raise ValueError("think_gaps and burst_gaps must be >= 0, burst_users >= 1")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.rate <= 0 or self.duration_s <= 0 or self.max_requests < 1:
            raise ValueError("rate and duration_s must be > 0, max_requests >= 1")
        if self.tenant_zipf < 0:
            raise ValueError("tenant_zipf must be >= 0")

    @property
    def burst_rate(self) -> float:
        """Requests per second the bursts add on top of ``rate``."""
        return 0.0 if self.burst_gaps == 0 else self.burst_users * self.rate / self.burst_gaps


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One request: turn ``turn`` (from 1) of user ``user`` of tenant ``tenant``, sent at ``arrival_s``."""

    index: int
    tenant: int
    user: int
    turn: int
    arrival_s: float
    follows: int | None = None
    """Index of the same user's previous turn (None for a first turn): it is sent only once that one ended."""
    burst: int | None = None
    """Number of the burst the user arrived in (None: a Poisson arrival)."""


@dataclass(slots=True)
class _Conversation:
    tenant: int
    user: int
    turns: int
    burst: int | None
    done: int = 0
    last: int | None = None


@dataclass(order=True, slots=True)
class _Waiting:
    ready_u: float
    order: int
    conversation: _Conversation = field(compare=False)


def build_sequence(spec: TenantsSpec, rng: random.Random) -> list[ChatTurn]:
    """The request sequence: Poisson arrivals at ``spec.rate`` continuing waiting conversations or
    starting new users, and bursts of ``burst_users`` new users of one tenant on top.

    Drawn in units of the mean gap, then divided by the rate: the draws do not depend on the rate. The
    sequence ends at ``max_requests`` or at ``duration_s``, whichever is first.
    """
    sampler = ZipfSampler(spec.tenants, spec.tenant_zipf)
    users = [0] * spec.tenants
    waiting: list[_Waiting] = []
    requests: list[ChatTurn] = []
    bursts = 0
    next_arrival = rng.expovariate(1.0)
    next_burst = rng.expovariate(1.0) * spec.burst_gaps if spec.burst_gaps > 0 else math.inf

    def start(tenant: int, burst: int | None) -> _Conversation:
        users[tenant] += 1
        return _Conversation(tenant, users[tenant], rng.randint(spec.turns_min, spec.turns_max), burst)

    def emit(conversation: _Conversation, now: float) -> None:
        conversation.done += 1
        index = len(requests)
        requests.append(
            ChatTurn(
                index,
                conversation.tenant,
                conversation.user,
                conversation.done,
                now / spec.rate,
                conversation.last,
                conversation.burst,
            )
        )
        conversation.last = index
        if conversation.done < conversation.turns:
            ready = now + rng.expovariate(1.0) * spec.think_gaps
            heapq.heappush(waiting, _Waiting(ready, index, conversation))

    while len(requests) < spec.max_requests:
        now = min(next_arrival, next_burst)
        if now / spec.rate >= spec.duration_s:
            break
        if next_burst <= next_arrival:
            bursts += 1
            tenant = rng.randrange(spec.tenants)
            for _ in range(min(spec.burst_users, spec.max_requests - len(requests))):
                emit(start(tenant, bursts), now)
            next_burst += rng.expovariate(1.0) * spec.burst_gaps
            continue
        if waiting and waiting[0].ready_u <= now:
            emit(heapq.heappop(waiting).conversation, now)
        else:
            emit(start(sampler.sample(rng), None), now)
        next_arrival += rng.expovariate(1.0)
    return requests


# -- texts ---------------------------------------------------------------------------------------------
def question_text(seed: int, tenant: int, user: int, turn: int) -> str:
    """The question of one turn: names its user and turn, so no two requests ask the same."""
    choice = random.Random(f"question:{seed}:{tenant}:{user}:{turn}").choice(QUESTION_TEXTS)
    return f"User {user} of tenant {tenant}, turn {turn}: {choice}"


def answer_text(seed: int, tenant: int, user: int, turn: int, words: int) -> str:
    """The stand-in for the answer to one turn: ``words`` short common words (about one token each)."""
    rng = random.Random(f"answer:{seed}:{tenant}:{user}:{turn}")
    return " ".join(rng.choice(ANSWER_WORDS) for _ in range(words))


def conversation(request: ChatTurn, system_prompt: str, seed: int, answer_words: int) -> list[Message]:
    """The turn's chat messages: the system prompt, every earlier question with its (stand-in) answer,
    then this turn's question. Turn ``t``'s messages start with turn ``t - 1``'s."""
    messages: list[Message] = [{"role": "system", "content": system_prompt}]
    for turn in range(1, request.turn):
        messages.append({"role": "user", "content": question_text(seed, request.tenant, request.user, turn)})
        messages.append(
            {
                "role": "assistant",
                "content": answer_text(seed, request.tenant, request.user, turn, answer_words),
            }
        )
    messages.append(
        {"role": "user", "content": question_text(seed, request.tenant, request.user, request.turn)}
    )
    return messages


@dataclass(frozen=True, slots=True)
class Tenants:
    """The tenants' system prompts (and their token counts) and how to render any turn of the sequence."""

    seed: int
    system_prompts: tuple[str, ...]
    system_tokens: tuple[int, ...]
    answer_words: int

    def messages(self, request: ChatTurn) -> list[Message]:
        return conversation(request, self.system_prompts[request.tenant], self.seed, self.answer_words)


async def build_tenants(spec: TenantsSpec, count_tokens: CountTokens, rng: random.Random) -> Tenants:
    """``spec.tenants`` system prompts, each the shortest operations log of at least a length drawn
    uniformly in the spec's range. ``rng`` draws the lengths only; the texts depend on ``spec.seed``."""
    prompts: list[str] = []
    counts: list[int] = []
    for tenant in range(spec.tenants):
        target = rng.randint(spec.system_tokens_min, spec.system_tokens_max)
        text = await sized_context(f"tenant-{tenant}-seed-{spec.seed}", target, spec.seed, count_tokens)
        prompts.append(text)
        counts.append(await count_tokens(text))
    return Tenants(spec.seed, tuple(prompts), tuple(counts), spec.max_tokens)


# -- ideal hit rate ------------------------------------------------------------------------------------
def block_keys(tokens: Sequence[int], block_size: int) -> list[int]:
    """One key per full block of ``tokens``, chained like vLLM's block hashes: equal keys mean equal
    prefixes up to the end of that block."""
    keys: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        keys.append(parent)
    return keys


def ideal_hits(prompts: Iterable[Sequence[int]], block_size: int) -> list[int]:
    """Per prompt, in order, the prefix-cache hit (tokens) of perfect affinity with an infinite cache:
    the leading full blocks it shares with any earlier prompt, capped as vLLM caps a hit (the last token
    is always computed, so at most the prompt's length less one, rounded down to whole blocks)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    seen: set[int] = set()
    hits: list[int] = []
    for tokens in prompts:
        keys = block_keys(tokens, block_size)
        cap = max(0, (len(tokens) - 1) // block_size)
        hit = 0
        for key in keys[:cap]:
            if key not in seen:
                break
            hit += 1
        hits.append(hit * block_size)
        seen.update(keys)
    return hits


def ideal_hit_rate(prompts: Sequence[Sequence[int]], block_size: int) -> float:
    """Σ ideal hits / Σ prompt tokens (NaN for no tokens): the measured hit rate's ceiling."""
    total = sum(len(p) for p in prompts)
    return sum(ideal_hits(prompts, block_size)) / total if total else math.nan


def distinct_blocks(prompts: Iterable[Sequence[int]], block_size: int) -> int:
    """Full blocks of all prompts together, each shared prefix counted once: the run's working set."""
    keys: set[int] = set()
    for tokens in prompts:
        keys.update(block_keys(tokens, block_size))
    return len(keys)
