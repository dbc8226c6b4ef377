"""Client API keys (``Authorization: Bearer KEY``) and the protection of the admin paths, as ASGI middleware.

- API paths (everything but the admin paths, ``/health`` and ``/ready``) need an API key when any is
  configured (``auth.api_keys`` or ``BURSTSCHED_API_KEYS``, comma-separated); else they are open.
- Admin paths (``/metrics``, ``/admin/*``): with ``auth.admin_port`` they exist only on that port (404 on the
  API port); with admin keys (``auth.admin_keys`` or ``BURSTSCHED_ADMIN_KEYS``) they need one of those; with
  neither, they need an API key when API keys are set, else they are open.
- A missing or wrong key gets 401 in OpenAI's error shape with ``WWW-Authenticate: Bearer``.
- Once checked, the client's ``Authorization`` header is removed from the request, so the router's keys
  never travel to a replica (without router keys, the header passes through, e.g. to a vLLM ``--api-key``).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from burstsched.config import AuthConfig
from burstsched.wire.errors import error_response

API_KEYS_ENV = "BURSTSCHED_API_KEYS"
ADMIN_KEYS_ENV = "BURSTSCHED_ADMIN_KEYS"
OPEN_PATHS = frozenset({"/health", "/ready"})


def is_admin_path(path: str) -> bool:
    return path == "/metrics" or path == "/admin" or path.startswith("/admin/")


def _env_keys(text: str | None) -> list[str]:
    return [key.strip() for key in (text or "").split(",") if key.strip()]


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """The keys in force, from the config and the environment."""

    api_keys: tuple[bytes, ...] = ()
    admin_keys: tuple[bytes, ...] = ()
    admin_port: int | None = None

    @classmethod
    def resolve(cls, config: AuthConfig, environ: Mapping[str, str]) -> AuthSettings:
        api = [*config.api_keys, *_env_keys(environ.get(API_KEYS_ENV))]
        admin = [*config.admin_keys, *_env_keys(environ.get(ADMIN_KEYS_ENV))]
        return cls(
            tuple(dict.fromkeys(k.encode() for k in api)),
            tuple(dict.fromkeys(k.encode() for k in admin)),
            config.admin_port,
        )

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys or self.admin_keys or self.admin_port is not None)


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The token of the first ``Authorization: Bearer`` header, or None."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


def _matches(token: bytes | None, keys: tuple[bytes, ...]) -> bool:
    if token is None:
        return False
    found = False
    for key in keys:  # compare with every key, in constant time each
        found |= hmac.compare_digest(token, key)
    return found


class AuthMiddleware:
    """Plain ASGI middleware enforcing :class:`AuthSettings` on HTTP requests."""

    def __init__(self, app: ASGIApp, settings: AuthSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.settings.enabled:
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        settings = self.settings
        if path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        on_admin_port = settings.admin_port is not None and _local_port(scope) == settings.admin_port
        if is_admin_path(path):
            if settings.admin_port is not None and not on_admin_port:
                await error_response(404, "Not Found")(scope, receive, send)
                return
            keys = settings.admin_keys or (settings.api_keys if settings.admin_port is None else ())
        else:
            if on_admin_port:
                await error_response(404, "Not Found")(scope, receive, send)
                return
            keys = settings.api_keys
        if keys:
            if not _matches(bearer_token(scope["headers"]), keys):
                await _unauthorized(scope, receive, send)
                return
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != b"authorization"]}
        await self.app(scope, receive, send)


def _local_port(scope: Scope) -> int | None:
    server = scope.get("server")
    if server is None or len(server) < 2:
        return None
    port = server[1]
    return port if isinstance(port, int) else None


async def _unauthorized(scope: Scope, receive: Receive, send: Send) -> None:
    response = error_response(
        401,
        "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'.",
        code="invalid_api_key",
        headers={"www-authenticate": "Bearer"},
    )
    await response(scope, receive, send)
