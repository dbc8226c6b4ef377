"""``session-affinity-scorer`` and ``session-affinity-filter``: llm-d's pinning of a session to one endpoint.

Two strategies, as in llm-d:

- ``encoded_endpoint_header`` (the default): stateless. The router answers each request with ``header``
  (``x-session-token``) holding the base64 of the serving endpoint's name; a client that sends it back gets
  that endpoint. A token that is missing, not base64, or names no candidate expresses no preference.
- ``session_id``: the client sends an opaque session id in the first of ``session_headers`` it sets
  (``x-session-id``). The first request of a session binds it to the endpoint it was sent to; later ones
  prefer that endpoint. A binding whose endpoint was not among the candidates moves to the endpoint the
  request went to; one whose endpoint was a candidate but not picked stays. A binding unused for
  ``eviction_ttl_s`` is dropped.

The scorer gives the session's endpoint 1.0 and every other candidate 0 (all 0 without a preference); the
filter keeps only the session's endpoint when it is a candidate, else every candidate.
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from pydantic import Field

from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PluginParameters, SchedRequest

ENCODED_HEADER = "x-session-token"
SESSION_ID_HEADER = "x-session-id"
_PRESENCE_LIMIT = 4096  # requests chosen for but not dispatched yet
_SESSION_LIMIT = 1_000_000  # bindings kept at most (the oldest go first)


class SessionAffinityParameters(PluginParameters):
    strategy: Literal["encoded_endpoint_header", "session_id"] = Field(
        default="encoded_endpoint_header",
        description="encoded_endpoint_header: the client echoes the endpoint token the router answered with; "
        "session_id: the client names its session, the router remembers the session's endpoint.",
    )
    header: str = Field(
        default=ENCODED_HEADER,
        min_length=1,
        description="encoded_endpoint_header: the request and response header carrying the endpoint token.",
    )
    session_headers: tuple[str, ...] = Field(
        default=(SESSION_ID_HEADER,),
        min_length=1,
        description="session_id: the request headers the session id is read from, the first set one wins.",
    )
    eviction_ttl_s: float = Field(
        default=300.0, gt=0.0, description="session_id: how long a binding survives unused (seconds)."
    )


def encode_endpoint(name: str) -> str:
    """The token of endpoint ``name`` in ``encoded_endpoint_header``: its name in base64."""
    return base64.b64encode(name.encode()).decode("ascii")


def _decode_endpoint(token: str | None) -> str | None:
    if not token:
        return None
    try:
        return base64.b64decode(token, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


class _SessionAffinity:
    """What both plugins share: which candidate the request's session prefers, and the session bindings."""

    Parameters = SessionAffinityParameters

    def __init__(self, name: str, parameters: SessionAffinityParameters, context: PluginContext) -> None:
        self._name = name
        self._encoded = parameters.strategy == "encoded_endpoint_header"
        self._header = parameters.header.strip().lower()
        self._sources = tuple(h.strip().lower() for h in parameters.session_headers)
        self._ttl = parameters.eviction_ttl_s
        self._clock: Callable[[], float] = context.clock
        self._bindings: OrderedDict[str, tuple[str, float]] = OrderedDict()  # session → endpoint, last used
        self._present: OrderedDict[str, bool] = OrderedDict()  # request → its bound endpoint was a candidate
        self.request_headers: tuple[str, ...] = (self._header,) if self._encoded else self._sources
        self.echo_headers: tuple[str, ...] = (self._header,) if self._encoded else ()

    @property
    def name(self) -> str:
        return self._name

    def preferred(self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot]) -> str | None:
        """The candidate the request's session is pinned to, if any."""
        names = {e.name for e in endpoints}
        if self._encoded:
            wanted = _decode_endpoint(request.header(self._header))
            return wanted if wanted in names else None
        session = self._session(request)
        if session is None:
            return None
        bound = self._bound(session)
        if bound is None:
            return None
        self._present[request.request_id] = bound in names
        while len(self._present) > _PRESENCE_LIMIT:
            self._present.popitem(last=False)
        return bound if bound in names else None

    def on_dispatch(self, request: SchedRequest, endpoint: EndpointSnapshot) -> None:
        if self._encoded:
            return
        present = self._present.pop(request.request_id, None)
        session = self._session(request)
        if session is None:
            return
        bound = self._bound(session)
        if bound is not None and bound != endpoint.name and present is not False:
            return  # its endpoint was a candidate and the picker chose another: the binding stays
        self._bindings.pop(session, None)
        self._bindings[session] = (endpoint.name, self._clock())
        while len(self._bindings) > _SESSION_LIMIT:
            self._bindings.popitem(last=False)

    def forget_endpoint(self, endpoint: str) -> None:
        for session in [s for s, (e, _) in self._bindings.items() if e == endpoint]:
            del self._bindings[session]

    def reset(self) -> None:
        self._bindings.clear()
        self._present.clear()

    def _session(self, request: SchedRequest) -> str | None:
        for header in self._sources:
            value = (request.header(header) or "").strip()
            if value:
                return value
        return None

    def _bound(self, session: str) -> str | None:
        entry = self._bindings.get(session)
        if entry is None:
            return None
        if self._clock() - entry[1] > self._ttl:
            del self._bindings[session]
            return None
        return entry[0]


class SessionAffinityScorer(_SessionAffinity):
    """1.0 for the endpoint the request's session is pinned to, 0 for every other candidate."""

    def score(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Mapping[str, float]:
        wanted = self.preferred(request, endpoints)
        return {e.name: 1.0 if e.name == wanted else 0.0 for e in endpoints}


class SessionAffinityFilter(_SessionAffinity):
    """Only the endpoint the request's session is pinned to, when it is a candidate; else every candidate."""

    def filter(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Sequence[EndpointSnapshot]:
        wanted = self.preferred(request, endpoints)
        kept = [e for e in endpoints if e.name == wanted]
        return kept or endpoints
