"""The plugin contracts: producers, filters, scorers, pickers and dispatch hooks.

Each plugin has an instance ``name`` and one verb. Plugins depend on these contracts and the data types in
:mod:`burstsched.framework.types`, never on the engine that runs them: the engine applies weights, clamps
scores to [0, 1] and fails open when filters would leave nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from burstsched.framework.state import CycleState
from burstsched.framework.types import EndpointSnapshot, SchedRequest, ScoredEndpoint
from burstsched.prefix.kv_events import EventBatch


@runtime_checkable
class Plugin(Protocol):
    """Anything the config can instantiate; ``name`` is the instance name from the config."""

    @property
    def name(self) -> str: ...


@runtime_checkable
class Producer(Plugin, Protocol):
    """Computes per-endpoint data for a request (e.g. a :class:`PrefixMatch`) into the cycle state."""

    def produce(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> None: ...


@runtime_checkable
class Filter(Plugin, Protocol):
    """Returns the endpoints that may take the request; the engine ignores an empty result (fail open)."""

    def filter(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Sequence[EndpointSnapshot]: ...


@runtime_checkable
class Scorer(Plugin, Protocol):
    """Scores each endpoint in [0, 1] (higher is better), by endpoint name; pure and synchronous.

    A missing endpoint scores 0; the engine clamps out-of-range values and treats NaN as 0.
    """

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]: ...


@runtime_checkable
class Picker(Plugin, Protocol):
    """Orders the scored candidates by preference; the first is the pick, the rest serve failover and spill.

    The result must hold every candidate exactly once.
    """

    def pick(
        self, request: SchedRequest, candidates: Sequence[ScoredEndpoint]
    ) -> Sequence[ScoredEndpoint]: ...


@runtime_checkable
class DispatchHook(Plugin, Protocol):
    """Told when a request (or a whole group, once) is sent to an endpoint."""

    def on_dispatch(self, request: SchedRequest, endpoint: EndpointSnapshot) -> None: ...


@runtime_checkable
class Resettable(Plugin, Protocol):
    """Holds learned state (e.g. a prefix index) that can be dropped."""

    def reset(self) -> None: ...


@runtime_checkable
class EndpointForgetter(Plugin, Protocol):
    """Holds per-endpoint learned state to drop when that endpoint goes away (killed, failing its checks)."""

    def forget_endpoint(self, endpoint: str) -> None: ...


@runtime_checkable
class KVEventConsumer(Plugin, Protocol):
    """Keeps state from the replicas' KV-cache events (the precise prefix index).

    The router's event hub calls these in order per endpoint, on the event loop: ``on_kv_events`` with each
    batch in sequence order (gaps already replayed); ``on_kv_stream_reset`` when what the plugin holds for
    the endpoint can no longer be trusted (the replica restarted, or a gap could not be replayed: the plugin
    drops the endpoint's entries, and later events rebuild them); ``on_kv_stream_live`` when the hub starts
    following the endpoint, ``on_kv_stream_closed`` when it stops (the router is shutting down).
    """

    def on_kv_events(self, endpoint: str, batch: EventBatch) -> None: ...

    def on_kv_stream_reset(self, endpoint: str, reason: str) -> None: ...

    def on_kv_stream_live(self, endpoint: str) -> None: ...

    def on_kv_stream_closed(self, endpoint: str) -> None: ...


@runtime_checkable
class HeaderReader(Plugin, Protocol):
    """Reads request headers: the front copies the ones named in ``request_headers`` (lower case) into
    :attr:`SchedRequest.headers`; no other client header reaches a plugin."""

    @property
    def request_headers(self) -> tuple[str, ...]: ...


@runtime_checkable
class EndpointEcho(Plugin, Protocol):
    """Answers each request with its serving endpoint's token (the base64 of its name) in each header of
    ``echo_headers``, for the client to send back (llm-d's session token)."""

    @property
    def echo_headers(self) -> tuple[str, ...]: ...
