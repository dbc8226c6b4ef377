"""Rebuilt prompts keep the recorded sharing structure, as the router hashes them."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from burstsched.prefix.hashing import block_hashes, pseudo_tokens
from burstsched.replay.calibrate import calibrate
from burstsched.replay.rebuild import engine_scale, rebuild_prompts, sim_bytes_per_token
from burstsched.replay.trace import TracedRequest
from burstsched.sim import CostModel
from burstsched.sim.tokenizer import BuiltinTokenizer


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _traced(chain: tuple[int, ...], extra_tokens: int) -> TracedRequest:
    return TracedRequest(
        t=0.0,
        api="chat",
        blocks=chain,
        prompt_tokens=len(chain) * 64 + extra_tokens,
        block_tokens=64,
        bytes_per_token=4,
        max_tokens=8,
        output_tokens=8,
        stream=True,
    )


def test_prompts_sharing_k_leading_blocks_share_k_blocks_after_rebuild() -> None:
    rng = random.Random(3)
    documents = [tuple(rng.getrandbits(64) for _ in range(rng.randint(2, 12))) for _ in range(4)]
    chains: list[tuple[int, ...]] = []
    for _ in range(24):
        document = rng.choice(documents)
        keep = rng.randint(0, len(document))  # a prefix of a shared document, then blocks of its own
        chains.append(document[:keep] + tuple(rng.getrandbits(64) for _ in range(rng.randint(0, 3))))
    requests = [_traced(chain, rng.randint(1, 63)) for chain in chains]
    prompts = rebuild_prompts(requests)
    rebuilt = [block_hashes(p.encode(), model="kv-demo") for p in prompts]
    for request, prompt, chain in zip(requests, prompts, rebuilt, strict=True):
        assert len(chain) == len(request.blocks)
        assert pseudo_tokens(prompt.encode()) == request.prompt_tokens
        assert prompt.isascii()
    for i, j in itertools.combinations(range(len(chains)), 2):
        assert _common(rebuilt[i], rebuilt[j]) == _common(chains[i], chains[j]), (i, j)


def _usage_trace(rng: random.Random, engine_tokens_per_pseudo_token: float) -> list[TracedRequest]:
    shared = tuple(rng.getrandbits(64) for _ in range(8))
    requests = []
    for i in range(12):
        traced = _traced(shared[: rng.randint(2, 8)] + (rng.getrandbits(64),), rng.randint(1, 63))
        tokens = int(traced.prompt_tokens * engine_tokens_per_pseudo_token) + i
        requests.append(dataclasses.replace(traced, input_tokens=tokens))
    return requests


def _assert_recorded_token_counts(requests: list[TracedRequest], prompts: list[str]) -> None:
    tokenizer = BuiltinTokenizer()
    for request, prompt in zip(requests, prompts, strict=True):
        counted = len(tokenizer.encode(prompt, add_special_tokens=False))
        assert request.input_tokens is not None
        assert abs(counted - request.input_tokens) <= 0.05 * request.input_tokens


def test_with_recorded_usage_a_rebuilt_prompt_has_the_recorded_blocks_and_tokens() -> None:
    """A chat trace from vLLM counts ~2 bytes a token (1.9 engine tokens a 4-byte pseudo-token): the rebuilt
    text is written at that many bytes a token, so the simulator counts the recorded tokens and the router
    cuts the recorded blocks, each as many engine tokens as the recorded one."""
    requests = _usage_trace(random.Random(5), 1.9)
    prompts = rebuild_prompts(requests)
    _assert_recorded_token_counts(requests, prompts)
    rebuilt = [block_hashes(p.encode(), model="kv-demo") for p in prompts]
    for i, j in itertools.combinations(range(len(requests)), 2):
        assert _common(rebuilt[i], rebuilt[j]) == _common(requests[i].blocks, requests[j].blocks), (i, j)
    for request, chain in zip(requests, rebuilt, strict=True):
        assert len(request.blocks) <= len(chain) <= len(request.blocks) + 1  # the tail may fill one more


def test_a_trace_too_dense_for_the_synthetic_words_is_rebuilt_with_stretched_blocks() -> None:
    """2.5 engine tokens a 4-byte pseudo-token (1.6 bytes a token) is denser than any word text: each block
    becomes text the simulator counts as many tokens as the recorded block, longer than the router's block."""
    requests = _usage_trace(random.Random(6), 2.5)
    prompts = rebuild_prompts(requests)
    _assert_recorded_token_counts(requests, prompts)
    rebuilt = [block_hashes(p.encode(), model="kv-demo") for p in prompts]
    scale = engine_scale(requests)
    assert scale is not None
    block_bytes = round(64 * scale * sim_bytes_per_token())
    for i, j in itertools.combinations(range(len(requests)), 2):  # the same sharing, in the router's blocks
        shared_bytes = _common(requests[i].blocks, requests[j].blocks) * block_bytes
        opening = block_bytes // 2  # where chains part, the children share half a block (module note)
        assert (
            (shared_bytes + opening) // 256
            <= _common(rebuilt[i], rebuilt[j])
            <= (shared_bytes + opening + 16) // 256
        )


def _share_exactly(a: str, b: str, chars: int) -> bool:
    """``a`` and ``b`` open with the same ``chars`` characters and differ in the 8 after them (random
    letters may agree by chance one or two at a time, not eight)."""
    return a[:chars] == b[:chars] and a[chars : chars + 8] != b[chars : chars + 8]


def test_prompts_that_part_at_a_block_share_half_of_it_and_no_more() -> None:
    """Siblings (the same k blocks, then different ones or only their tails) share k blocks and half of the
    next; prompts that part at different blocks share only their common blocks' text and that half."""
    rng = random.Random(9)
    document = tuple(rng.getrandbits(64) for _ in range(6))
    block_bytes = 64 * 4
    siblings = [
        _traced(document + (rng.getrandbits(64),), 40),  # parts at block 6: another block, then a tail
        _traced(document + (rng.getrandbits(64),), 40),
        _traced(document, 100),  # the document only, then its own tail
        _traced(document, 90),
    ]
    prompts = rebuild_prompts(siblings)
    for a, b in itertools.combinations(prompts, 2):
        assert _share_exactly(a, b, 6 * block_bytes + block_bytes // 2)
    elsewhere = rebuild_prompts([siblings[0], _traced(document[:3] + (rng.getrandbits(64),), 40)])
    assert _share_exactly(elsewhere[0], elsewhere[1], 3 * block_bytes + block_bytes // 2)
    unrelated = rebuild_prompts([_traced((1, 2), 40), _traced((3, 4), 40)])
    assert _share_exactly(
        unrelated[0], unrelated[1], block_bytes // 2
    )  # every chain opens the same way (a shared start)


def test_calibration_recovers_the_costs_that_made_the_latencies() -> None:
    """Latencies made from known costs (a third of the TTFTs delayed by a queue; every other arrival two
    requests side by side, the second arriving while the first is served, its front end, prefill and every
    step then slower, each step as the simulator times it): the fits find the step, the slowdown per extra
    sequence, prefill and front end. The first of two decodes beside the second's prefill and stays until
    the second ends: its cadence is left out, as is the second's TTFT (it had a prompt ahead of it)."""
    rng = random.Random(11)
    step, slowdown, prefill, frontend = 0.004, 0.5, 80e-6, 12e-6
    decode = CostModel().decode_s_per_seq
    requests = []
    for k in range(60):
        prompt = rng.randint(500, 4000)
        cached = rng.choice([0, prompt // 2, prompt - 100])
        ttft = step + prefill * (prompt - cached) + frontend * prompt
        if k % 3 == 0:
            ttft += rng.uniform(0.05, 0.3)  # waited behind others
        together = 1 + k % 2
        e2e = ttft + 15 * (step + decode * together) * (1 + slowdown * (together - 1))
        base = dataclasses.replace(_traced((1, 2), 10), t=10.0 * k)
        line = dataclasses.replace(
            base, input_tokens=prompt, cached_tokens=cached, ttft_ms=ttft * 1000, e2e_ms=e2e * 1000
        )
        if together == 1:
            requests.append(dataclasses.replace(line, output_tokens=16))
            continue
        # 1 ms later, beside the first: the whole TTFT is slowed by the load
        busy_ttft = (step + prefill * (prompt - cached) + frontend * prompt) * (1 + slowdown)
        e2e_busy = busy_ttft + e2e - ttft
        first_e2e = max(e2e, 0.001 + e2e_busy + 0.001)  # the first ends after the second
        requests.append(dataclasses.replace(line, output_tokens=16, e2e_ms=first_e2e * 1000))
        requests.append(
            dataclasses.replace(
                line, t=line.t + 0.001, output_tokens=16, ttft_ms=busy_ttft * 1000, e2e_ms=e2e_busy * 1000
            )
        )
    fitted = calibrate(requests)
    assert fitted is not None and fitted.points == 90
    assert fitted.step_points == 60 and fitted.ttft_points == 60
    assert fitted.cost.step_overhead_s == pytest.approx(step, abs=2e-4)
    assert fitted.cost.load_slowdown == pytest.approx(slowdown, abs=0.02)
    assert fitted.cost.prefill_s_per_token == pytest.approx(prefill, rel=0.05)
    assert fitted.cost.frontend_s_per_prompt_token == pytest.approx(frontend, rel=0.15)
    # without end-to-end latencies the step comes from the TTFT fit's intercept, no slowdown is fitted (so
    # only the requests that came alone are given)
    lone = [r for i, r in enumerate(requests) if i == 0 or requests[i - 1].t != r.t - 0.001]
    no_e2e = calibrate([dataclasses.replace(r, e2e_ms=None) for r in lone])
    assert len(lone) == 60
    assert no_e2e is not None and no_e2e.step_points == 0
    assert no_e2e.cost.load_slowdown == CostModel().load_slowdown
    assert no_e2e.cost.step_overhead_s == pytest.approx(step, abs=1e-3)
    assert no_e2e.cost.prefill_s_per_token == pytest.approx(prefill, rel=0.05)
    assert calibrate(requests[:5]) is None  # too few points


@pytest.mark.parametrize("spread", [0.0, 0.3, 0.6])
def test_calibration_fits_the_spread_of_requests_that_came_alone(spread: float) -> None:
    """Lone requests whose front end and engine work each varied by exp(spread x Z): the fitted jitter is
    that spread (a zero spread fits none)."""
    rng = random.Random(5)
    step, prefill, frontend = 0.004, 80e-6, 30e-6
    requests = []
    for k in range(400):
        prompt = rng.randint(500, 4000)
        cached = rng.choice([0, prompt - 100])
        front = frontend * prompt * math.exp(spread * rng.gauss(0, 1))
        engine = (step + prefill * (prompt - cached)) * math.exp(spread * rng.gauss(0, 1))
        base = dataclasses.replace(_traced((1, 2), 10), t=10.0 * k)
        requests.append(
            dataclasses.replace(
                base, input_tokens=prompt, cached_tokens=cached, ttft_ms=(front + engine) * 1000, e2e_ms=None
            )
        )
    fitted = calibrate(requests)
    assert fitted is not None
    assert fitted.cost.jitter == pytest.approx(spread, abs=0.1)
