"""A real router (uvicorn) in front of simulated replicas, recording: one line per request."""

from __future__ import annotations

import json
import random
from pathlib import Path

import anyio
import httpx
import pytest

from burstsched.config import EndpointConfig, PoolConfig, RecordingConfig, RouterConfig
from burstsched.dispatch import ENDPOINT_HEADER
from burstsched.recording import parse_chain
from burstsched.server.serve import running_router
from burstsched.sim import SimConfig, SimPool

MODEL = "kv-demo"
DOC = " ".join(f"line {i} of the shared document about service {i % 7}." for i in range(120))


@pytest.mark.anyio
async def test_every_request_gets_one_line_with_its_endpoint_and_ttft(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    async with SimPool(2, SimConfig(time_scale=0.02)) as pool:
        config = RouterConfig(
            endpoints=[EndpointConfig(name=n, url=u) for n, u in zip(pool.names, pool.urls, strict=True)],
            pool=PoolConfig(scrape_interval_ms=20, health_check_interval_ms=100),
            recording=RecordingConfig(enabled=True, path=str(trace), flush_interval_ms=20, decisions=True),
        )
        endpoints: dict[str, str] = {}
        async with running_router(config, rng=random.Random(1)) as router:
            async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:

                async def one(i: int) -> None:
                    stream = i % 2 == 0
                    body = {
                        "model": MODEL,
                        "messages": [{"role": "user", "content": f"{DOC} Question {i}?"}],
                        "max_tokens": 3 + i % 3,
                        "stream": stream,
                        **({"stream_options": {"include_usage": True}} if stream else {}),
                    }
                    headers = {"x-request-id": f"req-{i}"}
                    response = await client.post("/v1/chat/completions", json=body, headers=headers)
                    assert response.status_code == 200
                    endpoints[f"req-{i}"] = response.headers[ENDPOINT_HEADER.decode()]

                async with anyio.create_task_group() as tg:
                    for i in range(12):
                        tg.start_soon(one, i)
                # a rejected request (bad body) is not dispatched and gets no line
                assert (await client.post("/v1/chat/completions", content=b"{")).status_code == 400
    every = [json.loads(line) for line in trace.read_text().splitlines()]
    replicas = [line for line in every if line.get("kind") == "replica"]
    lines = [line for line in every if "kind" not in line]
    # each replica that served a request has its KV geometry, as it reported it, once, before its requests
    assert sorted(r["replica"] for r in replicas) == sorted(set(endpoints.values()))
    sim = SimConfig()
    for r in replicas:
        assert (r["block_size"], r["num_gpu_blocks"]) == (sim.block_size, sim.num_gpu_blocks)
        first_served = min(i for i, line in enumerate(every) if line.get("endpoint") == r["replica"])
        assert every.index(r) < first_served
    assert sorted(line["id"] for line in lines) == sorted(endpoints)
    for line in lines:
        i = int(line["id"].split("-")[1])
        assert line["endpoint"] == endpoints[line["id"]]
        assert line["outcome"] == "ok"
        assert line["stream"] is (i % 2 == 0)
        assert 0 < line["ttft_ms"] <= line["e2e_ms"]
        assert line["max_tokens"] == 3 + i % 3
        assert line["output_tokens"] == 3 + i % 3  # usage: the stream's last chunk, or the JSON body
        assert line["input_tokens"] > 0
        assert len(parse_chain(line["blocks"])) == line["prompt_tokens"] // 64 > 0
        assert "Question" not in json.dumps(line)
        # the decision: both replicas judged, the one that served it first
        assert [c["endpoint"] for c in line["decision"]][0] == line["endpoint"]
        assert sorted(c["endpoint"] for c in line["decision"]) == sorted(pool.names)
    chains = [parse_chain(line["blocks"]) for line in lines]
    assert len({chain[0] for chain in chains}) == 1  # the shared document: same first block everywhere
