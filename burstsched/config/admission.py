"""The ``admission:`` section of the configuration (burst admission, ``burstsched.admission``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

_MOVED = {"bypass_max_waiting": "saturation.max_waiting", "bypass_max_kv_usage": "saturation.max_kv_usage"}
"""Admission keys that became the router's one saturation definition."""


class AdmissionConfig(BaseModel):
    """Burst admission: hold cold requests briefly, group them by shared prefix, place each group."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in _MOVED.items():
                if old in data:
                    raise ValueError(
                        f"admission.{old} is now {new} (one definition of a saturated endpoint, shared with "
                        "the saturation-filter): move the value there"
                    )
        return data

    enabled: bool = Field(
        default=True,
        description="Hold cold requests in a short window and place them by group. Off: each request is "
        "scheduled alone as it arrives.",
    )
    window_ms: float = Field(
        default=10.0,
        gt=0,
        le=1000,
        description="How long a window stays open after its first cold request, in milliseconds. No request "
        "waits longer than this for its burst mates. Keep it small (a few to 20 ms): it adds to every cold "
        "request's time to first token.",
    )
    max_batch: int = Field(
        default=64,
        ge=1,
        description="A window seals as soon as it holds this many requests, before window_ms.",
    )
    min_shared_blocks: int = Field(
        default=4,
        ge=1,
        description="Requests sharing at least this many leading prefix blocks form a group and go to one "
        "endpoint. Lower groups more (a short shared system prompt is enough); higher groups only long "
        "shared contexts.",
    )
    max_per_endpoint: int = Field(
        default=32,
        ge=1,
        description="At most this many requests of one group go to one endpoint; the rest spill to the next "
        "best endpoint, which computes the prefix once more. Bounds how hard one hot prefix loads a replica.",
    )
    fair_share_factor: float | None = Field(
        default=2.0,
        ge=1.0,
        description="When a window holds several shared groups (two or more members each), a group takes at "
        "most ceil(requests in shared groups / endpoints) x this factor on one endpoint before spilling. "
        "Higher keeps hot groups together (prefix computed once), lower spreads them. null turns the "
        "fair-share bound off.",
    )
    bypass_warm: bool = Field(
        default=True,
        description="Send a request straight to scheduling, without waiting in the window, when an endpoint "
        "that is healthy and not saturated (the `saturation:` section) already holds at least "
        "min_shared_blocks of its prefix.",
    )
    late_members_ms: float = Field(
        default=2000.0,
        ge=0,
        le=60000,
        description="For this long after its window, a request of a placed group's prefix that no endpoint "
        "is known to hold yet joins the endpoint its group went to, unless that endpoint is saturated or "
        "holds max_per_endpoint of the group. The prefix index learns a placement only from the replica's "
        "response head (or its KV events), so a burst member arriving after its window sealed would "
        "otherwise be placed alone, by load, on another replica that computes the prefix again. 0 turns "
        "it off.",
    )
    queue_limit: int = Field(
        default=1024,
        ge=1,
        description="Most requests held by admission at once (waiting in a window or being placed). Past "
        "it, new requests are refused with HTTP 429.",
    )
    retry_after_s: int = Field(
        default=1,
        ge=1,
        description="The Retry-After value, in seconds, sent with a 429 when the admission queue is full.",
    )
