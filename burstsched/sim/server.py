"""The HTTP face of one simulated replica: a Starlette app with vLLM's OpenAI-compatible endpoints.

Endpoints: ``/v1/chat/completions``, ``/v1/completions`` (SSE streaming or not), ``/v1/models``,
``/health``, ``/metrics``, ``/tokenize``, ``POST /reset_prefix_cache`` (200 ``{"success": bool}``, false
while running requests hold blocks, unless ``?reset_running_requests=true``), ``/version``, and
``/sim/faults`` (GET, POST). Errors are vLLM's error bodies (:mod:`burstsched.sim.errors`); bad input is a
4xx, never a 500. A client that disconnects aborts its request, which frees its blocks and leaves the
running set. Tests may have the inference requests recorded (:mod:`burstsched.sim.recording`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import xxhash
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from burstsched.sim.chat_template import ChatTemplate, TemplateError
from burstsched.sim.clock import Clock
from burstsched.sim.config import VLLM_VERSION, SimConfig
from burstsched.sim.cost_model import Jitter
from burstsched.sim.engine import Engine, EngineClosedError, EngineRequest, QueueFullError, Status, TokenEvent
from burstsched.sim.errors import VALIDATION_ERROR, detail_response, error_response, sse_error_event
from burstsched.sim.faults import Faults, FaultSpecError, FaultState
from burstsched.sim.metrics import SimMetrics
from burstsched.sim.openai_shapes import (
    SSE_DONE,
    Json,
    Kind,
    RequestError,
    Sampling,
    UsageCounts,
    UsagePlace,
    chat_chunk,
    chat_response,
    check_length,
    check_model,
    completion_chunk,
    completion_response,
    parse_chat,
    parse_completion,
    parse_json_object,
    parse_tokenize,
    sse,
    usage,
    usage_chunk,
)
from burstsched.sim.recording import RecordedRequest
from burstsched.sim.tokenizer import Tokenizer

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024
Client = tuple[str, int]
"""A connection's peer address, as ASGI's ``scope["client"]`` gives it."""
# Query flags parse as pydantic parses a bool (vLLM declares them `bool = Query(default=False)`).
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


@dataclass
class SimState:
    """Everything the endpoints of one replica use; owned by the replica."""

    config: SimConfig
    name: str
    engine: Engine
    tokenizer: Tokenizer
    template: ChatTemplate
    metrics: SimMetrics
    faults: FaultState
    clock: Clock
    vocab: list[tuple[int, str]]
    rng: random.Random
    created: int
    jitter: Jitter
    """The factors of each request's front-end time (``cost.jitter``), from this replica's own RNG."""
    drop_connection: Callable[[Client | None], None] = field(default=lambda client: None)
    """Close the connection from this peer abruptly (the replica owns the server and its connections);
    None, an unknown peer (an in-process transport), is left alone."""
    recorded: list[RecordedRequest] | None = None
    """Where inference requests are recorded as they arrive; None: not recorded."""
    api_loop_free_at: float = 0.0
    """When the API server's event loop is next free of ``/metrics`` renders (``cost.metrics_render_s``)."""
    api_loop_rendered_s: float = 0.0
    """The loop's time spent rendering ``/metrics`` so far (counted when a render starts)."""


class SeededTokens:
    """Output tokens drawn from the output vocabulary by a seeded RNG."""

    def __init__(self, vocab: list[tuple[int, str]], seed: int) -> None:
        self._vocab = vocab
        self._rng = random.Random(seed)

    def next_token(self) -> tuple[int, str]:
        return self._vocab[self._rng.randrange(len(self._vocab))]


class RequestIdMiddleware:
    """Echo a request's ``X-Request-Id`` on its response (plain ASGI: wraps ``send``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = next((v for k, v in scope.get("headers", []) if k == b"x-request-id"), None)

        async def send_with_id(message: Message) -> None:
            if rid is not None and message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"x-request-id" for k, _ in headers):
                    headers.append((b"x-request-id", rid))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)


def build_app(state: SimState) -> Starlette:
    """The Starlette app of one replica."""
    handlers = _Handlers(state)
    routes = [
        Route("/v1/chat/completions", handlers.chat, methods=["POST"]),
        Route("/v1/completions", handlers.completions, methods=["POST"]),
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/health", handlers.health, methods=["GET"]),
        Route("/metrics", handlers.metrics, methods=["GET"]),
        Route("/tokenize", handlers.tokenize, methods=["POST"]),
        Route("/reset_prefix_cache", handlers.reset_prefix_cache, methods=["POST"]),
        Route("/version", handlers.version, methods=["GET"]),
        Route("/sim/faults", handlers.get_faults, methods=["GET"]),
        Route("/sim/faults", handlers.set_faults, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
    )
    app.add_middleware(RequestIdMiddleware)
    return app


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code in (404, 405):  # unknown path, wrong method: FastAPI's {"detail": ...}, as vLLM
        return detail_response(exc.status_code, headers=headers)
    return error_response(exc.status_code, str(exc.detail), headers=headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("simulator error on %s", request.url.path, exc_info=exc)
    return error_response(500, f"internal simulator error: {type(exc).__name__}")


def _request_error(exc: RequestError, headers: dict[str, str] | None = None) -> Response:
    return error_response(
        exc.status, exc.message, param=exc.param, error_type=exc.error_type, headers=headers
    )


def _query_flag(request: Request, name: str) -> bool:
    """A boolean query parameter as vLLM's FastAPI parses it (default false); 400 "Bad Request" otherwise."""
    raw = request.query_params.get(name)
    if raw is None:
        return False
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    message = (
        f"1 validation error:\n  {{'type': 'bool_parsing', 'loc': 'query.{name}', "
        f"'msg': 'Input should be a valid boolean, unable to interpret input', 'input': {raw!r}}}"
    )
    raise RequestError(400, message, f"query.{name}", VALIDATION_ERROR)


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RequestError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_body(request: Request) -> Json:
    return parse_json_object(await _read_body(request))


@dataclass(frozen=True, slots=True)
class _Prepared:
    kind: Kind
    prompt_ids: list[int]
    sampling: Sampling
    cache_salt: str | None
    lora: str | None = None
    """The LoRA adapter the request named as its model (None: the base model)."""
    priority: int = 0
    """vLLM's ``priority`` (lower is served earlier; only a ``priority`` scheduling policy reads it)."""


class _Handlers:
    def __init__(self, state: SimState) -> None:
        self.s = state

    # -- inference -----------------------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        return await self._inference(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._inference(request, "completion")

    async def _inference(self, request: Request, kind: Kind) -> Response:
        arrival = self.s.clock.now()
        rendered_before = self.s.api_loop_rendered_s
        if self.s.recorded is not None:
            self.s.recorded.append(RecordedRequest(request.method, request.url.path, dict(request.headers)))
        header_id = request.headers.get("x-request-id")
        request_id = header_id or uuid.uuid4().hex
        headers = {"X-Request-Id": request_id}
        faults = self.s.faults.current
        cut_after = faults.disconnect_after_events
        client: Client | None = request.scope.get("client")
        if faults.stall_before_first_byte_s > 0:
            await anyio.sleep(faults.stall_before_first_byte_s)
        status = self.s.faults.roll_error()
        if status is not None:
            return error_response(status, f"injected fault: HTTP {status}", headers=headers)
        try:
            prepared = self._prepare(kind, await _json_body(request))
        except RequestError as exc:
            return _request_error(exc, headers)
        except TemplateError as exc:
            return error_response(400, str(exc), headers=headers)
        except ClientDisconnect:
            return Response(status_code=499)
        if cut_after is not None and not prepared.sampling.stream:
            self.s.drop_connection(client)  # before the response head: nothing below reaches the client
            return Response(status_code=499)
        # The modelled front-end cost includes the parsing and tokenizing just done for real.
        engine = self.s.engine
        busy = engine.num_running + engine.num_waiting
        frontend = self.s.config.cost.frontend_s(len(prepared.prompt_ids), busy) * self.s.config.time_scale
        frontend *= self.s.jitter.factor()
        if frontend > 0:
            await self.s.clock.sleep_until(arrival + frontend)
        # /metrics renders that held the loop meanwhile delay the front end's work by as much
        held = self.s.api_loop_rendered_s - rendered_before
        ready = max(arrival + frontend + held, self.s.api_loop_free_at)
        if ready > self.s.clock.now():
            await self.s.clock.sleep_until(ready)
        req = self._engine_request(prepared, arrival)
        try:
            self.s.engine.add_request(req)
        except QueueFullError as exc:
            return error_response(429, str(exc), headers={**headers, "Retry-After": "1"})
        except EngineClosedError as exc:
            return error_response(503, str(exc), headers=headers)
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        response_id = prefix + (header_id or req.request_id)
        if prepared.sampling.stream:
            stream = self._stream(req, prepared, response_id)
            if cut_after is not None:
                stream = self._cut(stream, cut_after, client, req)
            return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
        return await self._complete(request, req, prepared, response_id, headers)

    def _prepare(self, kind: Kind, body: Json) -> _Prepared:
        max_len = self.s.config.effective_max_model_len
        if kind == "chat":
            chat = parse_chat(body)
            lora = check_model(chat.model, self.s.config.served_model_name, self.s.config.lora_modules)
            text = self.s.template.render(
                chat.messages,
                add_generation_prompt=chat.add_generation_prompt,
                continue_final_message=chat.continue_final_message,
                tools=chat.tools,
                extra=chat.chat_template_kwargs,
            )
            ids = self.s.tokenizer.encode(text, add_special_tokens=False)
            sampling, salt, priority = chat.sampling, chat.cache_salt, chat.priority
        else:
            comp = parse_completion(body)
            lora = check_model(comp.model, self.s.config.served_model_name, self.s.config.lora_modules)
            if isinstance(comp.prompt, str):
                ids = self.s.tokenizer.encode(comp.prompt, add_special_tokens=comp.add_special_tokens)
            else:
                ids = comp.prompt
            sampling, salt, priority = comp.sampling, comp.cache_salt, comp.priority
        if not ids:
            raise RequestError(400, "the prompt is empty after tokenization", "prompt")
        max_tokens = check_length(len(ids), sampling.max_tokens, max_len)
        if max_tokens != sampling.max_tokens:
            sampling = dataclasses.replace(sampling, max_tokens=max_tokens)
        return _Prepared(kind, ids, sampling, salt, lora, priority)

    def _engine_request(self, p: _Prepared, arrival: float) -> EngineRequest:
        room = self.s.config.effective_max_model_len - len(p.prompt_ids)
        if p.sampling.max_tokens is not None:
            max_tokens, at_max = p.sampling.max_tokens, "length"
        elif p.sampling.ignore_eos:
            max_tokens, at_max = room, "length"
        else:
            max_tokens, at_max = min(room, self.s.config.default_output_tokens), "stop"
        if p.sampling.seed is not None:
            seed = p.sampling.seed
        elif p.sampling.temperature == 0:
            seed = xxhash.xxh64_intdigest(repr(p.prompt_ids).encode(), seed=self.s.config.seed)
        else:
            seed = self.s.rng.getrandbits(64)
        return EngineRequest(
            request_id=uuid.uuid4().hex,
            prompt_token_ids=p.prompt_ids,
            max_tokens=max_tokens,
            tokens=SeededTokens(self.s.vocab, seed),
            finish_reason_at_max="length" if at_max == "length" else "stop",
            cache_salt=p.cache_salt,
            lora_name=p.lora,
            arrival_time=arrival,
            priority=p.priority,
        )

    def _usage(
        self, req: EngineRequest, kind: Kind, place: UsagePlace, *, completion_tokens: int | None = None
    ) -> Json:
        counts = UsageCounts(
            prompt_tokens=req.num_prompt_tokens,
            completion_tokens=len(req.output_token_ids) if completion_tokens is None else completion_tokens,
            cached_tokens=max(0, req.num_cached_tokens),
            created_cache_tokens=req.num_cache_creation_tokens,
        )
        return usage(kind, counts, place, prompt_tokens_details=self.s.config.enable_prompt_tokens_details)

    async def _stream(self, req: EngineRequest, p: _Prepared, rid: str) -> AsyncIterator[bytes]:
        created = int(time.time())
        model = p.lora or self.s.config.served_model_name
        obj = "chat.completion.chunk" if p.kind == "chat" else "text_completion"
        continuous = p.sampling.include_usage and p.sampling.continuous_usage_stats
        try:
            first = True
            while True:
                event = await req.events.get()
                if event.token_id is None:
                    yield sse_error_event(503, "the replica stopped while generating")
                    return
                if first and p.kind == "chat":
                    role = chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, None)
                    if continuous:
                        role["usage"] = self._usage(req, p.kind, "continuous", completion_tokens=0)
                    yield sse(role)
                first = False
                if p.kind == "chat":
                    chunk = chat_chunk(rid, created, model, {"content": event.text}, event.finish_reason)
                else:
                    chunk = completion_chunk(rid, created, model, event.text, event.finish_reason)
                if continuous:
                    chunk["usage"] = self._usage(req, p.kind, "continuous")
                yield sse(chunk)
                if event.finish_reason is not None:
                    break
            if p.sampling.include_usage:
                yield sse(usage_chunk(rid, created, model, obj, self._usage(req, p.kind, "final_chunk")))
            yield SSE_DONE
        finally:
            if req.status is not Status.FINISHED:
                self.s.engine.abort(req.request_id)

    async def _cut(
        self, events: AsyncIterator[bytes], after: int, client: Client | None, req: EngineRequest
    ) -> AsyncIterator[bytes]:
        """``events`` until ``after`` of them went out, then the connection closes abruptly (the
        ``disconnect_after_events`` fault); the request leaves the engine as an abort."""
        try:
            for _ in range(after):
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return
                yield event
            self.s.drop_connection(client)
        finally:
            if isinstance(events, AsyncGenerator):
                await events.aclose()
            if req.status is not Status.FINISHED:
                self.s.engine.abort(req.request_id)

    async def _complete(
        self, request: Request, req: EngineRequest, p: _Prepared, rid: str, headers: dict[str, str]
    ) -> Response:
        events: list[TokenEvent] = []
        disconnected = False
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    nonlocal disconnected
                    while (await request.receive())["type"] != "http.disconnect":
                        pass
                    disconnected = True
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                while True:
                    event = await req.events.get()
                    events.append(event)
                    if event.finish_reason is not None:
                        break
                tg.cancel_scope.cancel()
        finally:
            if req.status is not Status.FINISHED:
                self.s.engine.abort(req.request_id)
        if disconnected:
            return Response(status_code=499)
        last = events[-1]
        if last.token_id is None:
            return error_response(503, "the replica stopped while generating", headers=headers)
        text = "".join(e.text for e in events)
        created = int(time.time())
        model = p.lora or self.s.config.served_model_name
        reason = last.finish_reason or "stop"
        build = chat_response if p.kind == "chat" else completion_response
        body = build(rid, created, model, text, reason, self._usage(req, p.kind, "response"))
        return JSONResponse(body, headers=headers)

    # -- the rest ------------------------------------------------------------------------------------
    async def tokenize(self, request: Request) -> Response:
        return await _answer(self._tokenize, request)

    async def _tokenize(self, request: Request) -> Response:
        tok = parse_tokenize(await _json_body(request))
        check_model(tok.model, self.s.config.served_model_name, self.s.config.lora_modules)
        if tok.messages is not None:
            text = self.s.template.render(
                tok.messages,
                add_generation_prompt=tok.add_generation_prompt,
                continue_final_message=tok.continue_final_message,
                extra=tok.chat_template_kwargs,
            )
        else:
            text = tok.prompt or ""
        ids = self.s.tokenizer.encode(text, add_special_tokens=tok.add_special_tokens)
        max_len = self.s.config.effective_max_model_len
        return JSONResponse({"count": len(ids), "max_model_len": max_len, "tokens": ids, "token_strs": None})

    async def models(self, request: Request) -> Response:
        name = self.s.config.served_model_name
        card = {
            "id": name,
            "object": "model",
            "created": self.s.created,
            "owned_by": "vllm",
            "root": self.s.config.tokenizer or name,
            "parent": None,
            "max_model_len": self.s.config.effective_max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{self.s.name}",
                    "object": "model_permission",
                    "created": self.s.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        adapters = [
            {**card, "id": adapter, "root": adapter, "parent": name, "permission": card["permission"]}
            for adapter in self.s.config.lora_modules
        ]
        return JSONResponse({"object": "list", "data": [card, *adapters]})

    async def health(self, request: Request) -> Response:
        if self.s.engine.closed:
            return error_response(503, "engine is stopped")
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": VLLM_VERSION})

    async def metrics(self, request: Request) -> Response:
        if not await self.s.faults.wait_metrics_alive():
            return error_response(503, "replica stopping")
        engine = self.s.engine
        body = self.s.metrics.render(
            num_running=engine.num_running,
            num_waiting=engine.num_waiting,
            kv_cache_usage=engine.kv_cache_usage,
        )
        render = self.s.config.cost.metrics_render_s * self.s.config.time_scale
        if render > 0:  # the render holds the API server's loop, and the core its engine shares
            start = max(self.s.clock.now(), self.s.api_loop_free_at)
            self.s.api_loop_free_at = start + render
            self.s.api_loop_rendered_s += render
            engine.steal(render)
            await self.s.clock.sleep_until(self.s.api_loop_free_at)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def reset_prefix_cache(self, request: Request) -> Response:
        """vLLM's dev endpoint: 200 ``{"success": bool}``; false (nothing reset) while running requests hold
        blocks, unless ``reset_running_requests`` preempts them first. ``reset_external`` (the KV
        connector's cache) is accepted; with no connector it changes nothing, as in vLLM."""
        try:
            reset_running = _query_flag(request, "reset_running_requests")
            _query_flag(request, "reset_external")
        except RequestError as exc:
            return _request_error(exc)
        ok = await self.s.engine.reset_prefix_cache(reset_running_requests=reset_running)
        return JSONResponse({"success": ok})

    async def get_faults(self, request: Request) -> Response:
        return JSONResponse(self.s.faults.current.to_json())

    async def set_faults(self, request: Request) -> Response:
        return await _answer(self._set_faults, request)

    async def _set_faults(self, request: Request) -> Response:
        try:
            faults = Faults.from_json(await _json_body(request))
        except FaultSpecError as exc:
            raise RequestError(400, str(exc)) from exc
        self.s.faults.set(faults)
        return JSONResponse(faults.to_json())


async def _answer(handler: Callable[[Request], Awaitable[Response]], request: Request) -> Response:
    """Run a handler, turning client errors into OpenAI error responses."""
    try:
        return await handler(request)
    except RequestError as exc:
        return _request_error(exc)
    except TemplateError as exc:
        return error_response(400, str(exc))
    except ClientDisconnect:
        return Response(status_code=499)
