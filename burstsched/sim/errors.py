"""Error bodies as vLLM 0.32's API server writes them (the router keeps OpenAI's vocabulary instead:
:mod:`burstsched.wire.errors`).

Every error vLLM raises itself is ``{"error": {"message": str, "type": str, "param": str | None, "code":
int}}``, ``code`` being the HTTP status and ``type`` vLLM's own vocabulary (measured on vLLM 0.32):

- ``"BadRequestError"`` (400): requests vLLM's serving code rejects (no prompt, ``max_tokens`` below 1,
  ``stream_options`` without ``stream``, a prompt longer than the context); ``param`` names the parameter
  and the message ends with ``(parameter=NAME, value=VALUE)``;
- ``"Bad Request"`` (400): bodies FastAPI's request validation rejects (invalid JSON, no body, a required
  field missing, a field of the wrong type, a bad query flag); ``param`` is the location, such as
  ``"body"``, ``"body.messages"`` or ``"query.reset_running_requests"``;
- ``"NotFoundError"`` (404): an unknown model, ``param`` ``"model"``;
- ``"InternalServerError"`` (500), ``"ServiceUnavailableError"`` (503); any other status gets its reason
  phrase (``"Too Many Requests"``), as vLLM's handler of HTTP exceptions writes it.

An unknown path or a wrong method is no OpenAI error in vLLM: FastAPI answers ``{"detail": "Not Found"}``
(404) and ``{"detail": "Method Not Allowed"}`` (405).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from starlette.responses import JSONResponse

VALIDATION_ERROR = "Bad Request"

_TYPE_BY_STATUS: dict[int, str] = {
    400: "BadRequestError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


def status_phrase(status: int) -> str:
    """The HTTP reason phrase of ``status`` (``"HTTP 599"`` for a status Python does not know)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


def error_type_for(status: int) -> str:
    """vLLM's error ``type`` for a status."""
    return _TYPE_BY_STATUS.get(status) or status_phrase(status)


def error_body(
    status: int, message: str, *, error_type: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """The JSON-able body of a vLLM error."""
    return {
        "error": {
            "message": message,
            "type": error_type or error_type_for(status),
            "param": param,
            "code": status,
        }
    }


def error_response(
    status: int,
    message: str,
    *,
    error_type: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A response carrying a vLLM error."""
    body = error_body(status, message, error_type=error_type, param=param)
    return JSONResponse(body, status_code=status, headers=headers)


def detail_response(status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    """FastAPI's own answer for an unknown path (404) or a wrong method (405): ``{"detail": phrase}``."""
    return JSONResponse({"detail": status_phrase(status)}, status_code=status, headers=headers)


def sse_error_event(status: int, message: str, *, error_type: str | None = None) -> bytes:
    """An SSE ``data:`` line carrying a vLLM error, for streams that fail after their first byte."""
    payload = json.dumps(error_body(status, message, error_type=error_type))
    return f"data: {payload}\n\n".encode()
