"""Where the router finds each replica's KV-cache event stream (precise prefix mode).

vLLM publishes its events on a ZMQ PUB socket (``--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'``). The router
subscribes to every replica's stream: an endpoint's own ``kv_events`` address wins, else the templates below
fill in the replica URL's ``{host}`` (IPv6 in brackets), ``{port}`` and the endpoint's ``{name}``.

Central mode (``bind``, llm-d's ``zmqEndpoint``) turns that round: the router binds one SUB socket and every
replica's publisher connects to it (vLLM connects when its ``endpoint`` is not a wildcard, e.g.
``tcp://router:5557``). The replicas are then told apart by the topic, which each must set to
``kv@<host>:<port>@<model>`` (its own URL's host and port, as llm-d's precise producer expects) or
``kv@<name>@<model>`` (the endpoint's name).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def check_zmq_address(value: str | None) -> str | None:
    if value is None:
        return value
    if not value.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError("must be a ZMQ address: tcp://HOST:PORT, ipc://PATH or inproc://NAME")
    return value


class KVEventsConfig(BaseModel):
    """The replicas' KV-event streams; used only when the profile has a precise prefix producer."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    endpoint_template: str | None = Field(
        default=None,
        description="Events address of every endpoint without its own, e.g. tcp://{host}:5557 "
        "({host}, {port} and {name} come from the endpoint); null: only endpoints with their own address.",
    )
    replay_template: str | None = Field(
        default=None,
        description="Replay (ROUTER) address of every endpoint without its own, e.g. tcp://{host}:5558; "
        "null: no replay, so a gap in the sequence drops the endpoint's entries (rebuilt from later events).",
    )
    bind: str | None = Field(
        default=None,
        description="Central mode: the address the router binds one SUB socket on (e.g. tcp://0.0.0.0:5557) "
        "for every replica's publisher to connect to; replicas are told apart by the topic "
        "kv@<host>:<port>@<model> (or kv@<name>@<model>). An endpoint's own kv_events address still "
        "wins; null: the router connects to each replica's publisher.",
    )
    topic: str = Field(
        default="",
        description="Subscription prefix of the topic frame ('' takes every topic); vLLM's default "
        "topic is ''.",
    )
    replay_timeout_ms: float = Field(
        default=2000.0, gt=0, description="Longest wait for a replay to finish before giving it up."
    )

    @field_validator("bind")
    @classmethod
    def _check_bind(cls, value: str | None) -> str | None:
        return check_zmq_address(value)

    @model_validator(mode="after")
    def _one_mode(self) -> KVEventsConfig:
        if self.bind is not None and self.endpoint_template is not None:
            raise ValueError(
                "bind (the replicas connect to the router) and endpoint_template (the router connects to "
                "each replica) are two ways to find the same streams: set one"
            )
        return self

    @field_validator("endpoint_template", "replay_template")
    @classmethod
    def _check_template(cls, value: str | None) -> str | None:
        if value is None:
            return value
        check_zmq_address(value)
        try:
            value.format(host="h", port=1, name="n")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"placeholders may be {{host}}, {{port}} and {{name}} only ({exc})") from exc
        return value
