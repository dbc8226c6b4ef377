"""One request's decision, as ``serve`` makes it: the shared :func:`burstsched.front.decide.decide`.

The picker uses the router's own parts (config, pool, admission, flow queue, scheduler, metrics, tokenizer,
prewarmer), built by the same assembly as ``serve``, and the same decision: validation, the plugins' request
headers (e.g. llm-d's session affinity), the probabilistic admitter, admission (the burst window), the
flow-control queue. It answers a :class:`Pick` (the endpoints, best first) or a :class:`Refusal` (an HTTP
status and an OpenAI error, sent as an immediate response). What is its own: the gateway's subset (the
candidates, and the ranking it names, keep only the subset's endpoints), and the cap on the wait below. A
client-sent ``x-gateway-destination-endpoint`` is never read: the picker decides from the body alone.

The gateway's wait. Envoy times each ext_proc message it waits an answer for with the filter's
``message_timeout`` (default 200 ms) and fails a request whose answer is late (504, or proxied undecided
when the filter fails open): with a ``BUFFERED`` request body the picker's answer to the body message is
timed so. In ``FULL_DUPLEX_STREAMED`` Envoy starts no message timer (its ext_proc ``ProcessorState`` skips it
in that mode), so there the gateway waits, bounded only by its route and stream timeouts. Either way a
request must not wait long in the picker, so its whole wait, in admission (the burst window, the queue that
holds requests while the pool is saturated) and in the flow-control queue together, is capped at
``max_wait_s`` (``--max-wait``), to be set below ``message_timeout``: a request still waiting then leaves
and is scheduled alone on the pool as it is (as a request that bypasses the window is). It loses its burst
mates' co-location, or its place in the flow queue, never its answer.

Flow control (``flow_control:``) in this mode. A request the queue would hold waits there at most the cap;
the queue's ``ttl_ms`` refuses it earlier only when it is below ``--max-wait``. So with the default cap
(150 ms) flow control mostly sheds (sheddable requests get 429 and ``Retry-After`` at once) and orders what
arrives within the cap; a request held past it goes out, scheduled alone, to an endpoint that may have no
room. Operators who enable flow control in epp mode and want requests really held must raise the gateway's
``message_timeout`` and ``--max-wait`` together (``--max-wait`` below ``message_timeout``, ``ttl_ms`` at or
below ``--max-wait`` for the queue's own refusal to be what a too-long wait gets).

Why the picker does not ask Envoy for more time: ext_proc's ``ProcessingResponse.override_message_timeout``
restarts the message timer that is running, at most once per processing state, up to the filter's
``max_message_timeout`` (0 by default, which disables it). In ``FULL_DUPLEX_STREAMED``, the mode the picker is
deployed in, no timer runs, so Envoy ignores it (counted in ``override_message_timeout_ignored``); in
``BUFFERED`` it would lengthen the body message's wait once, up to a bound the operator sets in the filter
config anyway, so raising ``message_timeout`` and ``--max-wait`` is the same knob with one part fewer.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from functools import partial

from burstsched.epp.wire import endpoint_address
from burstsched.flow import Identity
from burstsched.framework import ApiKind, EndpointSnapshot, SchedRequest, uncached_tokens
from burstsched.front.app import Router
from burstsched.front.decide import Refusal, decide

log = logging.getLogger(__name__)

_APIS = {"/v1/chat/completions": ApiKind.CHAT, "/v1/completions": ApiKind.COMPLETIONS}
DEFAULT_MAX_WAIT_S = 0.15
"""The default cap on a request's wait (admission and the flow queue): under Envoy's default
``message_timeout`` (200 ms)."""

__all__ = ["DEFAULT_MAX_WAIT_S", "Pick", "Picker", "Refusal", "api_of"]


@dataclass(frozen=True, slots=True)
class Pick:
    """Where the request goes: ``endpoints`` best first (the first is the pick, the rest fallbacks)."""

    endpoints: tuple[EndpointSnapshot, ...]
    request: SchedRequest | None
    """The scheduler's view of an inference request; None for a request with no prompt (e.g. a GET)."""
    stream: bool = False
    queued_prefill: int = 0
    """Prompt tokens the endpoint must compute before its first token (the pool's prefill ledger)."""
    identity: Identity | None = None
    """Who the request is for flow control (its flow is credited the tokens it used); None: no prompt."""

    @property
    def endpoint(self) -> EndpointSnapshot:
        return self.endpoints[0]

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(endpoint_address(e.url) for e in self.endpoints)


def api_of(path: str) -> ApiKind | None:
    """The OpenAI API a request path names (query string ignored); None for any other path."""
    return _APIS.get(path.split("?", 1)[0])


class Picker:
    """Decides for the router's pool; ``fallbacks``: how many next-best endpoints follow the pick;
    ``max_wait_s``: the longest a request waits (admission and the flow queue) before it is scheduled
    alone."""

    def __init__(
        self,
        router: Router,
        *,
        fallbacks: int = 0,
        rng: random.Random | None = None,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
    ) -> None:
        self._router = router
        self._fallbacks = fallbacks
        self._rng = rng if rng is not None else random.Random()
        self._max_wait_s = max_wait_s
        self.capped = 0
        """Requests whose wait reached ``max_wait_s`` (scheduled alone)."""

    async def pick(
        self, path: str, headers: dict[str, str], body: bytes | None, subset: frozenset[str] | None
    ) -> Pick | Refusal:
        """Where the request goes; ``headers``: the request's (names lower-case, as Envoy sends them);
        ``subset``: the gateway's candidate addresses (None: the whole pool)."""
        api = api_of(path)
        if api is None or not body:
            return self._any(subset)
        router = self._router
        if len(body) > router.config.limits.max_body_bytes:
            return Refusal(413, "request body too large", "rejected")
        allowed = None if subset is None else partial(_allowed, subset=subset)
        outcome = await decide(
            router,
            api,
            body,
            _raw(headers),
            headers.get("x-request-id"),
            allowed=allowed,
            max_wait_s=self._max_wait_s,
        )
        if isinstance(outcome, Refusal):
            return outcome
        if outcome.capped:
            self.capped += 1
        request = outcome.request
        # A windowed or queued request was placed on the whole pool: the gateway's subset still binds.
        ranked = [
            s.endpoint for s in outcome.decision.ranked if s.endpoint.healthy and _allowed(s.endpoint, subset)
        ]
        queued = uncached_tokens(request, outcome.decision.matches.get(ranked[0].name))
        cap = outcome.prefill_cap
        if cap is not None:  # its group's prefix is computed once, by the group's first
            queued = min(queued, cap)
        return Pick(
            tuple(ranked[: 1 + self._fallbacks]), request, outcome.parsed.stream, queued, outcome.identity
        )

    def _any(self, subset: frozenset[str] | None) -> Pick | Refusal:
        """A request with no prompt to place (another path, or no body): the least busy healthy endpoint."""
        healthy = [e for e in self._router.pool.snapshots() if e.healthy and _allowed(e, subset)]
        if not healthy:
            return Refusal(503, "no healthy endpoint", "unavailable")
        least = min(e.in_flight for e in healthy)
        return Pick((self._rng.choice([e for e in healthy if e.in_flight == least]),), None)


def _allowed(endpoint: EndpointSnapshot, subset: frozenset[str] | None) -> bool:
    return subset is None or endpoint_address(endpoint.url) in subset


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """The request's headers as ASGI has them, as the shared decision reads them (flow-control identity,
    the plugins' headers)."""
    return [(k.encode("latin-1", "replace"), v.encode("latin-1", "replace")) for k, v in headers.items()]
