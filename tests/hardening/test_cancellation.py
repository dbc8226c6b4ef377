"""A client that goes away cancels its upstream request: the replica stops generating.

Runs once on the simulator and once on real vLLM (``backend``; the vLLM case is marked ``real_vllm``). The
evidence is the replica's own ``vllm:num_requests_running`` gauge going from 1 back to 0 while the request
still had thousands of tokens to generate, with no request counted as finished. The gauge is polled both
ways: vLLM updates it from its engine's stats, which can come after the first tokens.
"""

from __future__ import annotations

import anyio
import httpx
import pytest

from burstsched.server.serve import running_router
from burstsched.testing.backends import Backend, Sample, metric_samples, total
from burstsched.wire.sse import SSEReader

from .helpers import config_for, eventually

pytestmark = pytest.mark.anyio

MAX_TOKENS = 4000


async def test_client_disconnect_stops_generation_on_the_replica(backend: Backend) -> None:
    config = config_for([("replica", backend.url)])
    body = {
        "model": backend.model,
        "messages": [{"role": "user", "content": "Tell a very long story about a lighthouse."}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    async with (
        httpx.AsyncClient(timeout=30) as direct,
        running_router(config) as router,
        httpx.AsyncClient(base_url=router.url, timeout=30) as client,
    ):
        before = await metric_samples(direct, backend)
        assert total(before, "vllm:num_requests_running") == 0
        with anyio.fail_after(60):
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                # Read through one iterator held to the end of the block: leaving an `async for` over
                # aiter_raw() abandons its generator, and whenever the loop finalizes it the stream
                # closes, the router sees the client gone and vLLM aborts the request early.
                chunks = response.aiter_raw()
                reader, events = SSEReader(), 0
                while events < 20:  # generating: the role chunk and some tokens are out
                    events += len(reader.feed(await anext(chunks)))
                # vLLM sets its gauges from the engine's stats, which can trail the first tokens out: poll.
                during: list[Sample] = []

                async def shows_running() -> bool:
                    during[:] = await metric_samples(direct, backend)
                    return total(during, "vllm:num_requests_running") == 1

                await eventually(shows_running, within_s=20)
            # leaving the block closes the connection mid-stream: the client is gone

        async def stopped() -> bool:
            return total(await metric_samples(direct, backend), "vllm:num_requests_running") == 0

        await eventually(stopped, within_s=20)
        after = await metric_samples(direct, backend)
        generated = total(after, "vllm:generation_tokens_total") - total(
            before, "vllm:generation_tokens_total"
        )
        finished = total(after, "vllm:request_success_total") - total(before, "vllm:request_success_total")
        settled = await metric_samples(direct, backend)
        later = total(settled, "vllm:generation_tokens_total") - total(before, "vllm:generation_tokens_total")
        running = "vllm:num_requests_running"
        print(
            f"{backend.kind}: {running} {total(before, running):.0f} before, "
            f"{total(during, running):.0f} while streaming, 0 after the disconnect; "
            f"{generated:.0f} (then {later:.0f}) of {MAX_TOKENS} tokens generated, {finished:.0f} finished"
        )
        assert 0 < generated < MAX_TOKENS
        assert later == generated  # generation stopped: no more tokens once the request left the replica
        assert finished == 0  # aborted, not finished
        metrics = (await client.get("/metrics")).text
        assert 'burstsched_requests_total{endpoint="replica",outcome="cancelled"} 1.0' in metrics
