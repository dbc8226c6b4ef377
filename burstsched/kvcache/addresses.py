"""Each endpoint's KV-event addresses, from its own config or the templates of ``kv_events``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from burstsched.config import EndpointConfig, KVEventsConfig


@dataclass(frozen=True, slots=True)
class StreamAddress:
    """Where one endpoint publishes its events (``events``) and serves replays (``replay``, optional)."""

    endpoint: str
    events: str
    replay: str | None


def stream_addresses(endpoints: Sequence[EndpointConfig], config: KVEventsConfig) -> list[StreamAddress]:
    """The event addresses of every endpoint that has one (explicit, or from the templates)."""
    out: list[StreamAddress] = []
    for endpoint in endpoints:
        fields = _fields(endpoint)
        events = endpoint.kv_events
        if events is None and config.endpoint_template is not None:
            events = config.endpoint_template.format(**fields)
        if events is None:
            continue
        replay = endpoint.kv_events_replay
        if replay is None and config.replay_template is not None:
            replay = config.replay_template.format(**fields)
        out.append(StreamAddress(endpoint.endpoint_name, events, replay))
    return out


def _fields(endpoint: EndpointConfig) -> dict[str, str]:
    url = httpx.URL(endpoint.url)
    host = url.host
    if ":" in host:  # IPv6 literal: ZMQ wants it in brackets
        host = f"[{host}]"
    port = url.port if url.port is not None else (443 if url.scheme == "https" else 80)
    return {"host": host, "port": str(port), "name": endpoint.endpoint_name}
