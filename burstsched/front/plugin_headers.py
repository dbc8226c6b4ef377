"""The headers the profile's plugins exchange with the client (llm-d's session affinity).

The request headers plugins declare they read (:class:`~burstsched.framework.HeaderReader`) are copied into
the :class:`~burstsched.framework.SchedRequest`; the response headers they echo
(:class:`~burstsched.framework.EndpointEcho`) are added to the response head, holding the base64 of the
serving endpoint's name (the one ``x-burstsched-endpoint`` names, after any failover).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable

from starlette.types import Message, Send

from burstsched.dispatch import ENDPOINT_HEADER


def plugin_request_headers(
    client_headers: Iterable[tuple[bytes, bytes]], wanted: frozenset[str]
) -> tuple[tuple[str, str], ...]:
    """The client's headers among ``wanted`` (lower-case names), decoded as latin-1."""
    if not wanted:
        return ()
    out: list[tuple[str, str]] = []
    for key, value in client_headers:
        name = key.decode("latin-1").lower()
        if name in wanted:
            out.append((name, value.decode("latin-1")))
    return tuple(out)


def echo_endpoint(send: Send, names: tuple[str, ...]) -> Send:
    """``send`` with each header of ``names`` set on the response head to the serving endpoint's token."""
    if not names:
        return send
    encoded = tuple(name.encode("latin-1") for name in names)

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            endpoint = next((v for k, v in headers if k == ENDPOINT_HEADER), None)
            if endpoint is not None:
                token = base64.b64encode(endpoint)
                headers = [(k, v) for k, v in headers if k not in encoded]
                headers += [(name, token) for name in encoded]
                message = {**message, "headers": headers}
        await send(message)

    return wrapped
