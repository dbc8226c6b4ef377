"""OpenAI-shaped error bodies, shared by the router and the simulator.

Every error a client sees has the shape OpenAI's API uses::

    {"error": {"message": str, "type": str, "param": str | None, "code": str | int | None}}

The ``type`` follows OpenAI's vocabulary by status: 400 ``invalid_request_error``, 401
``authentication_error``, 404 ``not_found_error``, 413 ``invalid_request_error``, 429
``rate_limit_error``, 5xx ``server_error`` / ``service_unavailable``.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

_TYPE_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_type_for(status: int) -> str:
    """The OpenAI error ``type`` for an HTTP status."""
    return _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(
    status: int,
    message: str,
    *,
    error_type: str | None = None,
    param: str | None = None,
    code: str | int | None = None,
) -> dict[str, Any]:
    """The JSON-able body of an OpenAI error."""
    return {
        "error": {
            "message": message,
            "type": error_type or error_type_for(status),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    *,
    error_type: str | None = None,
    param: str | None = None,
    code: str | int | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A Starlette response carrying an OpenAI error."""
    return JSONResponse(
        error_body(status, message, error_type=error_type, param=param, code=code),
        status_code=status,
        headers=headers,
    )


def sse_error_event(status: int, message: str, *, error_type: str | None = None) -> bytes:
    """An SSE ``data:`` line carrying an OpenAI error, for streams that fail after their first byte."""
    payload = json.dumps(error_body(status, message, error_type=error_type))
    return f"data: {payload}\n\n".encode()
