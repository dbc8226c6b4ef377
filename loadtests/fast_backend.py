"""A zero-delay fake vLLM replica for overhead benchmarks: uvloop, one ``asyncio.Protocol``, fixed answers.

    python loadtests/fast_backend.py --port 8001 [--host 127.0.0.1] [--model kv-demo] [--name fast-0]
                                     [--stream-tokens 1]

HTTP/1.1 with keep-alive (requests on one connection are answered in order, so pipelining works too):

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: a small fixed OpenAI-shaped JSON body, or,
  when the request body says ``"stream": true``, the same answer as server-sent events (chunked, ending in
  ``data: [DONE]``; a usage chunk when ``stream_options.include_usage`` is true); ``--stream-tokens N``: a
  stream carries N token events (the usage then says N completion tokens);
- ``GET /health`` (200, empty), ``GET /v1/models`` (the one model), ``GET /version``;
- ``GET /metrics``: a small vLLM-style Prometheus page with the families burstsched scrapes (queue gauges,
  KV usage, cache config, prefill sums) and a ``vllm:request_success_total`` counter of completions served.

Nothing is computed per request beyond finding the request's end: the answers are prebuilt bytes, so the
backend answers far faster than any router in front of it. It imports nothing from burstsched (it starts
fast and keeps working while the router's code is being changed). SIGINT/SIGTERM stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
from typing import Any, cast

MAX_HEAD_BYTES = 65536
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
_USAGE_TRUE = re.compile(rb'"include_usage"\s*:\s*true')
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed"}
_COMPLETION_PATHS = (b"/v1/chat/completions", b"/v1/completions")


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def response(status: int, body: bytes, content_type: bytes = b"application/json") -> bytes:
    """A whole HTTP/1.1 response with a content length."""
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
        % (status, _REASONS.get(status, b"Error"), content_type, len(body))
        + body
    )


def chunked_response(events: list[bytes]) -> bytes:
    """A whole ``text/event-stream`` response, one chunk per event, then the last chunk."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


class Answers:
    """Every answer the backend gives, prebuilt for one model name."""

    def __init__(self, model: str, stream_tokens: int = 1) -> None:
        self.model = model
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        chat_base = {"id": "chatcmpl-fast", "created": 0, "model": model}
        completion_base = {"id": "cmpl-fast", "object": "text_completion", "created": 0, "model": model}
        message = {"role": "assistant", "content": "ok"}
        self.chat = response(
            200,
            _json(
                {
                    **chat_base,
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
                    "usage": usage,
                }
            ),
        )
        self.completion = response(
            200,
            _json(
                {
                    **completion_base,
                    "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                    "usage": usage,
                }
            ),
        )
        chunk = {**chat_base, "object": "chat.completion.chunk"}
        n = max(1, stream_tokens)
        stream_usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": 1 + n}

        def last(i: int) -> str | None:
            return "length" if i == n - 1 else None

        self.chat_stream = _streams(
            [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
            + [
                {**chunk, "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": last(i)}]}
                for i in range(n)
            ],
            {**chunk, "choices": [], "usage": stream_usage},
        )
        """Without and with the usage chunk."""
        self.completion_stream = _streams(
            [
                {**completion_base, "choices": [{"index": 0, "text": "ok", "finish_reason": last(i)}]}
                for i in range(n)
            ],
            {**completion_base, "choices": [], "usage": stream_usage},
        )
        card = {"id": model, "object": "model", "created": 0, "owned_by": "vllm", "root": model}
        self.models = response(200, _json({"object": "list", "data": [{**card, "max_model_len": 4096}]}))
        self.health = response(200, b"")
        self.version = response(200, b'{"version":"fast-backend"}')
        error = {
            "object": "error",
            "message": "not found",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
        }
        self.not_found = response(404, _json(error))
        self.bad_request = response(
            400, _json({**error, "message": "bad request", "type": "BadRequestError", "code": 400})
        )

    def metrics(self, served: int) -> bytes:
        """The ``/metrics`` page: idle queues, an empty KV cache, ``served`` completions so far."""
        labels = f'engine="0",model_name="{self.model}"'
        cache = (
            'block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",'
            'gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="1024",'
            'num_gpu_blocks_override="1024",prefix_caching_hash_algo="xxhash"'
        )
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} 0.0",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} 0.0",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} 0.0",
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f"vllm:cache_config_info{{{cache}}} 1.0",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{labels},finished_reason="length"}} {float(served)}',
            "# HELP vllm:request_prefill_kv_computed_tokens New KV tokens computed during prefill.",
            "# TYPE vllm:request_prefill_kv_computed_tokens histogram",
            f"vllm:request_prefill_kv_computed_tokens_sum{{{labels}}} {float(served)}",
            f"vllm:request_prefill_kv_computed_tokens_count{{{labels}}} {float(served)}",
            "# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.",
            "# TYPE vllm:request_prefill_time_seconds histogram",
            f"vllm:request_prefill_time_seconds_sum{{{labels}}} 0.0",
            f"vllm:request_prefill_time_seconds_count{{{labels}}} {float(served)}",
        ]
        return response(200, ("\n".join(lines) + "\n").encode(), b"text/plain; version=0.0.4; charset=utf-8")


def _streams(events: list[dict[str, Any]], usage_event: dict[str, Any]) -> tuple[bytes, bytes]:
    data = [b"data: " + _json(e) + b"\n\n" for e in events]
    done = b"data: [DONE]\n\n"
    return chunked_response([*data, done]), chunked_response(
        [*data, b"data: " + _json(usage_event) + b"\n\n", done]
    )


class Backend:
    """The state all connections share: the prebuilt answers and a count of completions served."""

    def __init__(self, model: str, stream_tokens: int = 1) -> None:
        self.answers = Answers(model, stream_tokens)
        self.served = 0
        self.unknown_paths: set[bytes] = set()

    def answer(self, method: bytes, path: bytes, body: bytes) -> bytes:
        path = path.split(b"?", 1)[0]
        answers = self.answers
        if path in _COMPLETION_PATHS:
            if method != b"POST":
                return response(405, b"")
            self.served += 1
            chat = path == _COMPLETION_PATHS[0]
            if b'"stream"' in body and _STREAM_TRUE.search(body):
                streams = answers.chat_stream if chat else answers.completion_stream
                return streams[1 if _USAGE_TRUE.search(body) else 0]
            return answers.chat if chat else answers.completion
        if path == b"/health":
            return answers.health
        if path == b"/metrics":
            return answers.metrics(self.served)
        if path == b"/v1/models":
            return answers.models
        if path == b"/version":
            return answers.version
        if path not in self.unknown_paths:
            self.unknown_paths.add(path)
            print(f"fast backend: 404 for {method.decode(errors='replace')} {path!r}", file=sys.stderr)
        return answers.not_found


def _chunked_body(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    """A chunked request body beginning at ``start``: (body, end offset), or None while incomplete."""
    parts: list[bytes] = []
    pos = start
    while True:
        line_end = buffer.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size = int(bytes(buffer[pos:line_end]).split(b";", 1)[0].strip(), 16)
        pos = line_end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", pos - 2)
            return (b"".join(parts), trailer_end + 4) if trailer_end >= 0 else None
        if len(buffer) < pos + size + 2:
            return None
        parts.append(bytes(buffer[pos : pos + size]))
        pos += size + 2


def header_value(lower_head: bytes, name: bytes) -> bytes | None:
    """A header's value from a lowercased request head (the first occurrence)."""
    start = lower_head.find(b"\r\n" + name + b":")
    if start < 0:
        return None
    start += len(name) + 3
    end = lower_head.find(b"\r\n", start)
    return lower_head[start : end if end >= 0 else len(lower_head)].strip()


class BackendProtocol(asyncio.Protocol):
    """One client connection: parses requests as bytes arrive and writes each prebuilt answer."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are no subclasses

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        transport = self._transport
        assert transport is not None
        while self._buffer:
            head_end = self._buffer.find(b"\r\n\r\n")
            if head_end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    transport.close()
                return
            head = bytes(self._buffer[:head_end])
            request_line, _, _ = head.partition(b"\r\n")
            parts = request_line.split(b" ")
            if len(parts) != 3:
                transport.write(self._backend.answers.bad_request)
                transport.close()
                return
            lower = head.lower()
            body_start = head_end + 4
            if header_value(lower, b"transfer-encoding") == b"chunked":
                try:
                    chunked = _chunked_body(self._buffer, body_start)
                except ValueError:
                    transport.write(self._backend.answers.bad_request)
                    transport.close()
                    return
                if chunked is None:
                    return
                body, end = chunked
            else:
                length_text = header_value(lower, b"content-length")
                end = body_start + (int(length_text) if length_text else 0)
                if len(self._buffer) < end:
                    return
                body = bytes(self._buffer[body_start:end])
            del self._buffer[:end]
            transport.write(self._backend.answer(parts[0], parts[1], body))
            if header_value(lower, b"connection") == b"close" or parts[2] == b"HTTP/1.0":
                transport.close()
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def start_backend(
    host: str, port: int, model: str, stream_tokens: int = 1
) -> tuple[asyncio.Server, Backend]:
    """Listen on ``host:port`` (0: any free port) in the running loop; the server and its shared state."""
    backend = Backend(model, stream_tokens)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: BackendProtocol(backend), host, port, backlog=1024)
    return server, backend


async def _serve(args: argparse.Namespace) -> None:
    server, backend = await start_backend(args.host, args.port, args.model, args.stream_tokens)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    port = server.sockets[0].getsockname()[1]
    print(f"{args.name}: fast backend for {args.model!r} on http://{args.host}:{port}", flush=True)
    async with server:
        await stop.wait()
    print(f"{args.name}: served {backend.served} completions", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--model", default="kv-demo", help="the served model name (default: %(default)s)")
    parser.add_argument("--name", default="fast-backend", help="how its log lines begin")
    parser.add_argument(
        "--stream-tokens", type=int, default=1, help="token events per stream (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:  # the plain asyncio loop still works, only slower
        asyncio.run(_serve(args))
    else:
        uvloop.run(_serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
