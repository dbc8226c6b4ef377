"""The ``prewarm:`` section: copy hot shared prefixes to idle replicas before bursts need them
(``burstsched.dispatch.prewarm``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PrewarmConfig(BaseModel):
    """Prefix prewarming: a hot shared prefix (a tenant's system prompt) cached on one replica only is
    computed once more on an idle replica with room in its cache, by a one-token copy of a request that
    used it. A later burst on that prefix can then be split over both replicas without a cold prefill."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    enabled: bool = Field(
        default=False,
        description="Send prewarm copies. Off: the router sends only its clients' requests.",
    )
    min_shared_blocks: int = Field(
        default=4,
        ge=1,
        description="A prefix is these many leading blocks of a request's chain (blocks of "
        "prefix_hashing); requests sharing them share the prefix. A request must hit at least these many "
        "blocks on its endpoint to count as a use of a cached prefix.",
    )
    hot_requests: int = Field(
        default=3,
        ge=1,
        description="Warm hits on one prefix within hot_window_ms that make it hot.",
    )
    hot_window_ms: float = Field(
        default=30000.0,
        gt=0,
        description="The window, in milliseconds, over which a prefix's warm hits are counted.",
    )
    max_fill: float = Field(
        default=0.8,
        gt=0.0,
        le=1.0,
        description="Copy only to an endpoint whose cache the prefix index believes at most this full "
        "(0..1): a copy must not evict what the endpoint's own traffic uses. Endpoints whose fill the "
        "index does not know get no copies.",
    )
    cooldown_ms: float = Field(
        default=30000.0,
        ge=0,
        description="After a copy of a prefix, no other copy of it for this many milliseconds.",
    )
    timeout_ms: float = Field(
        default=30000.0,
        gt=0,
        description="A copy not answered within this many milliseconds is abandoned.",
    )
