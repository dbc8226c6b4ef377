"""OpenAI request validation and response shapes, as vLLM's OpenAI server produces them.

Validation turns a raw body into a typed request or raises :class:`RequestError` (status, message,
param, vLLM's error type): 400 for malformed or invalid bodies ("Bad Request" where vLLM's request
validation would reject the body, "BadRequestError" where its serving code would), 404 for an unknown
model. Builders give the JSON of responses and streaming chunks (``chat.completion.chunk`` with a first
role delta, ``text_completion`` chunks, a final usage chunk with empty ``choices`` when
``stream_options.include_usage`` is set) and of usage as vLLM serializes it in each place.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from burstsched.sim.errors import VALIDATION_ERROR

Json = dict[str, Any]
ContentPart = Literal["text"]
Kind = Literal["chat", "completion"]
UsagePlace = Literal["response", "final_chunk", "continuous"]


class RequestError(Exception):
    """A client error, answered with a vLLM error body (:mod:`burstsched.sim.errors`)."""

    def __init__(
        self, status: int, message: str, param: str | None = None, error_type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.error_type = error_type


def bad(message: str, param: str | None = None) -> RequestError:
    """A request vLLM's serving code rejects (400 "BadRequestError")."""
    return RequestError(400, message, param)


def invalid(message: str, field: str | None = None) -> RequestError:
    """A body vLLM's request validation rejects (400 "Bad Request", ``param`` "body" or "body.FIELD")."""
    return RequestError(400, message, "body" if field is None else f"body.{field}", VALIDATION_ERROR)


def out_of_range(name: str, message: str, value: object) -> RequestError:
    """A parameter vLLM's sampling parameters reject, with vLLM's ``(parameter=…, value=…)`` suffix."""
    return bad(f"{message} (parameter={name}, value={value})", name)


# -- parsing helpers -----------------------------------------------------------------------------------
def parse_json_object(raw: bytes) -> Json:
    """The JSON object in a request body (400 on invalid UTF-8, invalid JSON or a non-object)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(f"request body is not valid UTF-8 (byte {exc.start})") from exc
    if not text.strip():
        raise invalid("request body is empty; expected a JSON object")
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:  # vLLM's param: the error's position in the body, "body.POS"
        raise invalid(f"request body is not valid JSON: {exc}", str(exc.pos)) from exc
    except RecursionError as exc:
        raise invalid(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    return body


def _reject_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)


def _opt_int(body: Mapping[str, Any], name: str, *, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{name} must be an integer", name)
    if minimum is not None and value < minimum:
        raise out_of_range(name, f"{name} must be at least {minimum}, got {value}.", value)
    return value


def _opt_number(body: Mapping[str, Any], name: str, *, minimum: float | None = None) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid(f"{name} must be a number", name)
    if minimum is not None and value < minimum:
        raise out_of_range(name, f"{name} must be at least {minimum}, got {value}.", value)
    return float(value)


def _opt_bool(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{name} must be a boolean", name)
    return value


def _opt_str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise invalid(f"{name} must be a string", name)
    return value


def _opt_object(body: Mapping[str, Any], name: str) -> Json | None:
    value = body.get(name)
    if value is not None and not isinstance(value, dict):
        raise invalid(f"{name} must be an object", name)
    return value


# -- requests ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sampling:
    """The generation parameters the simulator honours (others are accepted and ignored)."""

    max_tokens: int | None
    temperature: float | None
    seed: int | None
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage_stats: bool


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str | None
    messages: list[Json]
    sampling: Sampling
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[Any] | None = None
    chat_template_kwargs: Json = field(default_factory=dict)
    cache_salt: str | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str | None
    prompt: str | list[int]
    sampling: Sampling
    add_special_tokens: bool = True
    cache_salt: str | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    model: str | None
    prompt: str | None
    messages: list[Json] | None
    add_special_tokens: bool
    add_generation_prompt: bool
    continue_final_message: bool
    chat_template_kwargs: Json


def check_model(model: str | None, served: str, adapters: Sequence[str] = ()) -> str | None:
    """404 unless ``model`` is absent (or empty), the served model name or a LoRA adapter's; the adapter
    named, else None."""
    if model and model in adapters:
        return model
    if model and model != served:
        raise RequestError(404, f"The model `{model}` does not exist. Valid aliases: {served}.", "model")
    return None


def _sampling(body: Mapping[str, Any], *, max_tokens_names: tuple[str, ...]) -> Sampling:
    max_tokens: int | None = None
    for name in max_tokens_names:
        value = _opt_int(body, name, minimum=1)
        if value is not None and max_tokens is None:
            max_tokens = value
    n = _opt_int(body, "n", minimum=1)
    if n is not None and n > 1:
        raise bad("the simulator generates one choice per request (n must be 1)", "n")
    temperature = _opt_number(body, "temperature")
    if temperature is not None and temperature < 0:
        raise out_of_range(
            "temperature", f"temperature must be non-negative, got {temperature}.", temperature
        )
    for name in ("top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "top_k", "min_p"):
        _opt_number(body, name)
    _opt_int(body, "min_tokens", minimum=0)
    seed = _opt_int(body, "seed")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise invalid("stop must be a string or a list of strings", "stop")
    _opt_str(body, "user")
    stream = _opt_bool(body, "stream")
    options = _opt_object(body, "stream_options")
    include_usage = continuous = False
    if options is not None:
        include_usage = _opt_bool(options, "include_usage")
        continuous = _opt_bool(options, "continuous_usage_stats")
        if not stream:
            raise bad(
                "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
                "stream_options",
            )
    return Sampling(
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        ignore_eos=_opt_bool(body, "ignore_eos"),
        stream=stream,
        include_usage=include_usage,
        continuous_usage_stats=continuous,
    )


def _messages(value: Any) -> list[Json]:
    if value is None:
        raise invalid("messages: Field required", "messages")
    if not isinstance(value, list):
        raise invalid("messages must be a list", "messages")
    if not value:
        raise bad("messages must be a non-empty list", "messages")
    out: list[Json] = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"{where} must be an object", where)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise invalid(f"{where}.role must be a non-empty string", f"{where}.role")
        content = message.get("content")
        if content is None:
            if role != "assistant":
                raise bad(f"{where}.content is required", f"{where}.content")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                pwhere = f"{where}.content[{j}]"
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise invalid(f"{pwhere} must be an object with a type", pwhere)
                if part["type"] != "text":
                    raise bad(f"{pwhere}: the simulator accepts text content only", pwhere)
                if not isinstance(part.get("text"), str):
                    raise invalid(f"{pwhere}.text must be a string", pwhere)
        elif not isinstance(content, str):
            raise invalid(f"{where}.content must be a string or a list of content parts", f"{where}.content")
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise invalid(f"{where}.name must be a string", f"{where}.name")
        out.append(message)
    return out


def parse_chat(body: Json) -> ChatRequest:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid("tools must be a list", "tools")
    if body.get("logprobs") is not None and not isinstance(body.get("logprobs"), bool):
        raise invalid("logprobs must be a boolean", "logprobs")
    kwargs = _opt_object(body, "chat_template_kwargs") or {}
    return ChatRequest(
        model=_opt_str(body, "model"),
        messages=_messages(body.get("messages")),
        sampling=_sampling(body, max_tokens_names=("max_completion_tokens", "max_tokens")),
        add_generation_prompt=_opt_bool(body, "add_generation_prompt", True),
        continue_final_message=_opt_bool(body, "continue_final_message"),
        tools=tools,
        chat_template_kwargs=kwargs,
        cache_salt=_opt_str(body, "cache_salt"),
        priority=_opt_int(body, "priority") or 0,
    )


_NO_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"


def _prompt(value: Any) -> str | list[int]:
    if value is None:
        raise bad(_NO_PROMPT, "prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise bad(_NO_PROMPT, "prompt")
        return value
    if isinstance(value, list):
        if not value:
            raise bad(_NO_PROMPT, "prompt")
        if all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
            return list(value)
        if all(isinstance(t, str | list) for t in value):
            raise bad("the simulator accepts one prompt per request", "prompt")
    raise invalid("prompt must be a string or a list of token ids", "prompt")


def parse_completion(body: Json) -> CompletionRequest:
    if body.get("echo") not in (None, False):
        raise bad("echo is not supported by the simulator", "echo")
    if body.get("suffix") is not None:
        raise bad("suffix is not supported", "suffix")
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)):
        raise invalid("logprobs must be an integer", "logprobs")
    return CompletionRequest(
        model=_opt_str(body, "model"),
        prompt=_prompt(body.get("prompt")),
        sampling=_sampling(body, max_tokens_names=("max_tokens",)),
        add_special_tokens=_opt_bool(body, "add_special_tokens", True),
        cache_salt=_opt_str(body, "cache_salt"),
        priority=_opt_int(body, "priority") or 0,
    )


def parse_tokenize(body: Json) -> TokenizeRequest:
    has_messages = body.get("messages") is not None
    if has_messages == (body.get("prompt") is not None):
        raise bad("give exactly one of prompt or messages")
    prompt = _opt_str(body, "prompt")
    return TokenizeRequest(
        model=_opt_str(body, "model"),
        prompt=prompt,
        messages=_messages(body.get("messages")) if has_messages else None,
        add_special_tokens=_opt_bool(body, "add_special_tokens", not has_messages),
        add_generation_prompt=_opt_bool(body, "add_generation_prompt", True),
        continue_final_message=_opt_bool(body, "continue_final_message"),
        chat_template_kwargs=_opt_object(body, "chat_template_kwargs") or {},
    )


def check_length(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int | None:
    """vLLM 0.32's context-length rules; returns ``max_tokens`` capped to the room the context leaves.

    A prompt longer than ``max_model_len`` is a 400. A ``max_tokens`` that does not fit is capped, not
    refused (vLLM's ``get_max_tokens``); a request left with no room at all gets vLLM's 400 for
    ``max_tokens`` below 1. None (no ``max_tokens``) stays None.
    """
    if prompt_tokens > max_model_len:
        # vLLM's tokenizer stops at max_model_len + 1 tokens, so it says "at least" for that count.
        qualifier = "at least " if prompt_tokens == max_model_len + 1 else ""
        raise bad(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{qualifier}{prompt_tokens} input tokens, which exceeds this limit even without any output "
            f"tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={prompt_tokens})",
            "input_tokens",
        )
    room = max_model_len - prompt_tokens
    capped = room if max_tokens is None else min(max_tokens, room)
    if capped < 1:
        raise out_of_range("max_tokens", f"max_tokens must be at least 1, got {capped}.", capped)
    return None if max_tokens is None else capped


# -- responses -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class UsageCounts:
    """A request's token counts as its usage reports them.

    ``created_cache_tokens``: prompt tokens the request computed and wrote to the prefix cache (its full
    blocks less its hits; vLLM's ``num_cache_creation_tokens``, reported in chat usage only).
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    created_cache_tokens: int


def usage(kind: Kind, counts: UsageCounts, place: UsagePlace, *, prompt_tokens_details: bool) -> Json:
    """``usage`` as vLLM 0.32 serializes it in each place (measured).

    ``"response"`` (non-streaming body, every field dumped): ``prompt_tokens_details`` is null without
    ``--enable-prompt-tokens-details``; with it, ``cached_tokens``, ``created_cache_tokens`` (chat only,
    null for completions) and ``multimodal_tokens`` null; ``completion_tokens_details`` null.
    ``"final_chunk"`` (the streamed usage chunk, null fields left out): no ``prompt_tokens_details`` key
    without the flag; with it ``{"cached_tokens", "created_cache_tokens"}`` for chat, ``{"cached_tokens"}``
    for completions. ``"continuous"`` (``continuous_usage_stats`` on every chunk): never
    ``prompt_tokens_details``; chat adds ``completion_tokens_details`` null.
    """
    out: Json = {
        "prompt_tokens": counts.prompt_tokens,
        "total_tokens": counts.prompt_tokens + counts.completion_tokens,
        "completion_tokens": counts.completion_tokens,
    }
    if place == "continuous":
        if kind == "chat":
            out["completion_tokens_details"] = None
        return out
    created = counts.created_cache_tokens if kind == "chat" else None
    if place == "final_chunk":
        if prompt_tokens_details:
            details: Json = {"cached_tokens": counts.cached_tokens}
            if created is not None:
                details["created_cache_tokens"] = created
            out["prompt_tokens_details"] = details
        return out
    out["prompt_tokens_details"] = (
        {"cached_tokens": counts.cached_tokens, "created_cache_tokens": created, "multimodal_tokens": None}
        if prompt_tokens_details
        else None
    )
    out["completion_tokens_details"] = None
    return out


def chat_response(rid: str, created: int, model: str, text: str, finish_reason: str, use: Json) -> Json:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        ],
        "usage": use,
        "prompt_logprobs": None,
    }


def completion_response(rid: str, created: int, model: str, text: str, finish_reason: str, use: Json) -> Json:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        ],
        "usage": use,
    }


def chat_chunk(rid: str, created: int, model: str, delta: Json, finish_reason: str | None) -> Json:
    choice: Json = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = None
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def completion_chunk(rid: str, created: int, model: str, text: str, finish_reason: str | None) -> Json:
    choice: Json = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
    }
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def usage_chunk(rid: str, created: int, model: str, obj: str, use: Json) -> Json:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": use}


def sse(payload: Json) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
