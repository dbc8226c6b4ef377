"""Each endpoint's KV-event addresses: its own, from the templates of ``kv_events``, or central mode."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from burstsched.config import EndpointConfig, KVEventsConfig


@dataclass(frozen=True, slots=True)
class StreamAddress:
    """Where one endpoint publishes its events (``events``) and serves replays (``replay``, optional).

    With ``sources`` (central mode), ``events`` is the address the router binds, and the endpoint's messages
    are those whose topic names one of ``sources`` (``kv@<source>@<model>``)."""

    endpoint: str
    events: str
    replay: str | None
    sources: tuple[str, ...] = ()

    @property
    def central(self) -> bool:
        return bool(self.sources)


def stream_addresses(endpoints: Sequence[EndpointConfig], config: KVEventsConfig) -> list[StreamAddress]:
    """The event addresses of every endpoint that has one (explicit, from the templates, or central)."""
    out: list[StreamAddress] = []
    for endpoint in endpoints:
        fields = _fields(endpoint)
        replay = endpoint.kv_events_replay
        if replay is None and config.replay_template is not None:
            replay = config.replay_template.format(**fields)
        events = endpoint.kv_events
        if events is None and config.bind is not None:
            out.append(StreamAddress(endpoint.endpoint_name, config.bind, replay, topic_sources(endpoint)))
            continue
        if events is None and config.endpoint_template is not None:
            events = config.endpoint_template.format(**fields)
        if events is None:
            continue
        out.append(StreamAddress(endpoint.endpoint_name, events, replay))
    return out


def topic_sources(endpoint: EndpointConfig) -> tuple[str, ...]:
    """What the middle of a topic ``kv@<source>@<model>`` may say to name ``endpoint``: its URL's
    ``host:port`` (llm-d's pod identifier: the pod's address and serving port) or its name."""
    url = httpx.URL(endpoint.url)
    port = url.port if url.port is not None else (443 if url.scheme == "https" else 80)
    return tuple(dict.fromkeys((f"{url.host}:{port}", endpoint.endpoint_name)))


def topic_source(topic: str) -> str:
    """The source a topic names, as llm-d parses it: the middle of ``kv@<source>@<model>``, else the
    whole topic."""
    parts = topic.split("@")
    return parts[1] if len(parts) == 3 else topic


def _fields(endpoint: EndpointConfig) -> dict[str, str]:
    url = httpx.URL(endpoint.url)
    host = url.host
    if ":" in host:  # IPv6 literal: ZMQ wants it in brackets
        host = f"[{host}]"
    port = url.port if url.port is not None else (443 if url.scheme == "https" else 80)
    return {"host": host, "port": str(port), "name": endpoint.endpoint_name}
