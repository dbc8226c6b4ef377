"""The ``flow_control:`` section: the router's own queue while the pool has no room (``burstsched.flow``).

Its knobs follow llm-d's flow control where they mean the same thing (priority bands from the request's
inference objective, flows from its fairness id, sheddable below priority 0, a queue TTL, capacity bounds),
so an llm-d user finds them; what burstsched adds is *when* a queued request goes and *where*: when an
endpoint has room, the queued prefix group the scheduler ranks that endpoint first for, warm groups first.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class HeadroomConfig(BaseModel):
    """When an endpoint has room for one more request from the queue."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    max_prefill_ms: float = Field(
        default=500.0,
        gt=0,
        description="An endpoint has room while the prompt tokens the router sent it that have not produced "
        "their first token would take less than this to compute at its measured prefill speed (learned from "
        "its metrics): long enough to keep its engine busy, short enough that the order of what waits is "
        "the router's to choose. One request always goes when the endpoint has any room.",
    )
    ride_along_tokens: int = Field(
        default=256,
        ge=0,
        description="A request with at most this many prompt tokens to compute on its endpoint (warm: the "
        "rest is cached there) goes at once even when the endpoint has no room, unless KV usage, the "
        "waiting queue or the in-flight cap close it: vLLM computes so small a prefill in the engine steps "
        "of the prefill ahead of it, so waiting in the router would only add to its time to first token. "
        "0: every request waits for room.",
    )
    max_prefill_requests: int = Field(
        default=2,
        ge=1,
        description="Until an endpoint's prefill speed is known: at most this many of the router's requests "
        "still before their first token there.",
    )
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="At most this many of the router's requests in flight on one endpoint (llm-d's "
        "concurrency-detector maxConcurrency); null: no bound (vLLM reports no max_num_seqs to derive it).",
    )
    max_waiting: int | None = Field(
        default=None,
        ge=0,
        description="No room while the replica's own waiting queue (its last scrape) is longer than this; "
        "null: not used (the router's own figures are never stale).",
    )
    max_kv_usage: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description="No room while the replica's KV-cache usage (its last scrape) is at or above this.",
    )


class QueueBoundsConfig(BaseModel):
    """How much one priority band may hold."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    max_requests: int | None = Field(default=None, ge=1, description="Queued requests; null: no bound.")
    max_bytes: int | None = Field(default=None, ge=1, description="Queued request bodies in bytes.")
    room_share: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="The share of an endpoint's room (headroom) this band's requests may fill: with 0.5 one "
        "goes, at once or from the queue, only to an endpoint whose room is less than half in use, so the "
        "rest stays free for higher bands (a replica serves what it already holds first, whatever the "
        "priority). A request waiting past max_reorder_ms takes any room. null: all of it.",
    )


class ProgramAwareConfig(BaseModel):
    """Program-aware fairness (``fairness: program-aware``): least attained service between flows."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    weight_service: float = Field(
        default=0.8,
        ge=0,
        description="Weight of a flow's attained service (prompt tokens + 2 x output tokens of its completed "
        "requests, from each response's usage), inverted and range-normalized over the band's waiting "
        "flows: the flow served least scores 1 (llm-d's lasWeightService).",
    )
    weight_head_wait: float = Field(
        default=0.2,
        ge=0,
        description="Weight of how long a flow's oldest queued request has waited, range-normalized over the "
        "band's waiting flows (llm-d's lasWeightHeadWait): the tie-breaker between equally served flows.",
    )
    half_life_s: float = Field(
        default=60.0,
        ge=0,
        description="Attained service halves every this many seconds, so a flow that went idle returns on "
        "near-equal terms (llm-d's lasHalfLifeSeconds); 0: no decay.",
    )
    forget_after_s: float = Field(
        default=3600.0,
        ge=0,
        description="A flow with no completion for this long is forgotten (llm-d's evictionTtlSeconds); "
        "0: never.",
    )


class CeilingConfig(BaseModel):
    """Per-priority dispatch ceilings: how much of the pool's room each band may use while a higher band
    waits (llm-d's usage limit policies)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    policy: Literal["priority-holdback", "soft-reflective"] = Field(
        description="priority-holdback: fixed ceilings from max_ceiling (highest waiting band) down to "
        "min_ceiling (lowest); soft-reflective: band i of N has 1 - i x saturation / (N - 1), and a band at "
        "or past it is opened on one pass in round(saturation / (1 - saturation))."
    )
    min_ceiling: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="priority-holdback: the lowest waiting band's ceiling (the share of the pool's room in "
        "use at which it stops dispatching).",
    )
    max_ceiling: float = Field(
        default=1.0, gt=0, le=1, description="priority-holdback: the highest waiting band's ceiling."
    )
    domain: Literal["rank", "value"] = Field(
        default="rank",
        description="priority-holdback: ceilings spaced evenly by the bands' rank, or in proportion to their "
        "priority values.",
    )


class AdmitterConfig(BaseModel):
    """The probabilistic admitter: sheddable requests refused, before admission, with a probability that
    rises with the pool's saturation (llm-d's probabilistic-admitter)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    queue_depth_threshold: int = Field(
        default=5,
        ge=1,
        description="A replica's waiting queue at which it counts as saturated (1.0).",
    )
    kv_usage_threshold: float = Field(
        default=0.8, gt=0, description="A replica's KV-cache usage at which it counts as saturated (1.0)."
    )
    power: float = Field(
        default=5.0, gt=0, description="The curve's steepness: min(saturation^power x k, 1)."
    )
    k: float = Field(
        default=300.0,
        gt=0,
        description="The curve's scale: every sheddable request is refused from saturation (1/k)^(1/power).",
    )


class FlowControlConfig(BaseModel):
    """The router's queue: requests held while every endpoint they could go to has no room."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    enabled: bool = Field(
        default=True,
        description="Hold requests in the router while the endpoint they would go to has no room (see "
        "headroom), and release them by priority, fairness and prefix as endpoints get room. On by default: "
        "at light load nothing waits, and past capacity it keeps the cache-aware order. Off: every request "
        "is sent at once and waits in the replica's own queue.",
    )
    headroom: HeadroomConfig = Field(default_factory=HeadroomConfig)
    max_reorder_ms: float = Field(
        default=2000.0,
        ge=0,
        description="A queued request waiting this long is released first, to the best endpoint with room, "
        "whatever its prefix: the bound on how long the cache-aware order may pass it over.",
    )
    max_wait_ms: float | None = Field(
        default=None,
        gt=0,
        description="A request queued this long is sent at once to the best endpoint for it, room or not (it "
        "then waits in the replica's own queue): a hard bound on a request's wait in the router, which "
        "max_reorder_ms alone is not past capacity (an overdue request still waits for room). null: none; "
        "a request waits for room until ttl_ms.",
    )
    stay_margin: float = Field(
        default=1.0,
        ge=0,
        description="A queued group warmer on the endpoint it waits for moves to another with room only when "
        "its first token there would come sooner by more than this share (1.0: twice as soon): moving "
        "computes its prefix again, work every later request waits behind, so an estimate's error must not "
        "move it (the cost-scorer's stay_margin, for the queue). A group no warmer there moves whenever it "
        "is no later.",
    )
    ttl_ms: float = Field(
        default=60000.0,
        gt=0,
        description="A request queued this long is refused with 429 (503 when no endpoint is ready).",
    )
    no_endpoint_wait_ms: float = Field(
        default=10000.0,
        ge=0,
        description="How long a request waits for an endpoint to become ready when the pool has none (a "
        "pool scaling from zero) before it is refused with 503.",
    )
    retry_after_s: int = Field(default=1, ge=1, description="The Retry-After of the queue's 429 answers.")
    max_requests: int = Field(default=10000, ge=1, description="Requests queued in all bands at once.")
    max_bytes: int = Field(
        default=1024 * 1024 * 1024, ge=1, description="Request bodies queued in all bands at once, in bytes."
    )
    bands: dict[int, QueueBoundsConfig] = Field(
        default_factory=dict, description="Bounds per priority band (by priority); bands not listed: none."
    )
    fairness: Literal["round-robin", "strict", "program-aware"] = Field(
        default="round-robin",
        description="Between the flows of one band: round-robin releases first from the flows released "
        "least; strict ignores flows (one order for the band); program-aware releases first from the flow "
        "with the least attained service in tokens (see program_aware).",
    )
    program_aware: ProgramAwareConfig = Field(default_factory=ProgramAwareConfig)
    ceilings: CeilingConfig | None = Field(
        default=None,
        description="Per-priority dispatch ceilings; null: every band dispatches while its endpoint has "
        "room.",
    )
    admitter: AdmitterConfig | None = Field(
        default=None,
        description="The probabilistic admitter; null: none. It works whether or not the queue is enabled.",
    )
    objectives: dict[str, int] = Field(
        default_factory=dict,
        description="Priority of each inference objective a request names in x-llm-d-inference-objective "
        "(as an InferenceObjective's priority); unnamed or unknown objectives get default_priority. Below 0 "
        "is sheddable: refused with 429 rather than queued.",
    )
    api_key_priorities: dict[str, int] = Field(
        default_factory=dict,
        description="Priority of the requests made with each API key (auth.api_keys), when they name no "
        "objective.",
    )
    default_priority: int = Field(default=0, description="The priority of a request nothing else sets.")
    engine_priority: bool = Field(
        default=False,
        description="Also send each request's priority to its replica, as vLLM's `priority` request field "
        "(negated: vLLM serves lower values first), unless the client set that field itself. Needs replicas "
        "started with `--scheduling-policy priority`: they then serve the queue's higher bands first among "
        "the requests they already hold, and preempt the lowest first (some vLLM versions refuse a nonzero "
        "`priority` under FCFS). `burstsched serve` only: a gateway forwards the client's body as it is.",
    )
