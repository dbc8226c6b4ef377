"""One request's decision, as ``serve`` makes it: parse, admission (the burst window), scheduling.

The picker uses the router's own parts (config, pool, admission, scheduler, metrics, tokenizer,
prewarmer), built by the same assembly as ``serve``. It answers a :class:`Pick` (the endpoints, best
first) or a :class:`Refusal` (an HTTP status and an OpenAI error, sent as an immediate response).
A client-sent ``x-gateway-destination-endpoint`` is never read: the picker decides from the body alone.

The gateway waits for the decision at most its ext_proc ``message_timeout`` (Envoy's default: 200 ms), and
a request it stops waiting for fails (500, or proxied undecided when the filter fails open). So the wait in
admission (the burst window, and a queue that holds requests while the pool is saturated) is capped at
``max_wait_s``, to be set below the gateway's ``message_timeout``: a request still waiting then leaves
admission and is scheduled alone on the pool as it is (as a request that bypasses the window is). It loses
its burst mates' co-location, never its answer.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass

import anyio

from burstsched.admission import AdmissionClosed, AdmissionQueueFull, Admitted, NoEndpointAvailable, Role
from burstsched.epp.wire import endpoint_address
from burstsched.framework import ApiKind, EndpointSnapshot, SchedRequest, uncached_tokens
from burstsched.front.app import Router
from burstsched.front.request import ParsedRequest, RequestError, parse_request
from burstsched.scheduling import NoEndpointsError
from burstsched.tokenization import TokenizationError

log = logging.getLogger(__name__)

_APIS = {"/v1/chat/completions": ApiKind.CHAT, "/v1/completions": ApiKind.COMPLETIONS}
DEFAULT_MAX_WAIT_S = 0.15
"""The default cap on a request's wait in admission: under Envoy's default ``message_timeout`` (200 ms)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """The request is answered by the gateway at once with this status and OpenAI error."""

    status: int
    message: str
    outcome: str
    """The router's outcome label for its metrics (``rejected``, ``unavailable``, ``throttled``)."""
    headers: tuple[tuple[str, str], ...] = ()
    param: str | None = None
    code: str | None = None


@dataclass(frozen=True, slots=True)
class Pick:
    """Where the request goes: ``endpoints`` best first (the first is the pick, the rest fallbacks)."""

    endpoints: tuple[EndpointSnapshot, ...]
    request: SchedRequest | None
    """The scheduler's view of an inference request; None for a request with no prompt (e.g. a GET)."""
    stream: bool = False
    queued_prefill: int = 0
    """Prompt tokens the endpoint must compute before its first token (the pool's prefill ledger)."""

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
    ``max_wait_s``: the longest a request waits in admission before it is scheduled alone."""

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
        """Requests whose admission wait reached ``max_wait_s`` (scheduled alone)."""

    async def pick(
        self, path: str, headers: dict[str, str], body: bytes | None, subset: frozenset[str] | None
    ) -> Pick | Refusal:
        api = api_of(path)
        if api is None or not body:
            return self._any(subset)
        router = self._router
        if len(body) > router.config.limits.max_body_bytes:
            return Refusal(413, "request body too large", "rejected")
        try:
            parsed = parse_request(api, body)
            if router.pool.healthy_count() == 0:
                return Refusal(503, "no healthy endpoint", "unavailable")
            model = self._model(parsed.model)
        except RequestError as exc:
            return Refusal(exc.status, exc.message, "rejected", param=exc.param, code=exc.code)
        request_id = headers.get("x-request-id") or os.urandom(16).hex()
        request = parsed.to_sched_request(
            request_id, model, router.config.prefix_hashing, await self._token_ids(api, parsed)
        )
        candidates = [e for e in router.pool.snapshots(model) if _allowed(e, subset)]
        if not any(e.healthy for e in candidates):
            return Refusal(503, f"no healthy endpoint serves model {model!r}", "unavailable")
        started = time.monotonic()
        admitted: Admitted | None = None
        try:
            with anyio.move_on_after(self._max_wait_s):
                admitted = await router.admission.admit(request, candidates)
            if admitted is None:
                admitted = self._alone(request, subset, time.monotonic() - started)
        except AdmissionQueueFull as exc:
            return Refusal(429, str(exc), "throttled", headers=(("retry-after", str(exc.retry_after_s)),))
        except (NoEndpointAvailable, AdmissionClosed, NoEndpointsError) as exc:
            return Refusal(503, str(exc), "unavailable")
        return self._admitted(api, parsed, request, admitted, subset)

    def _alone(self, request: SchedRequest, subset: frozenset[str] | None, waited_s: float) -> Admitted:
        """A request whose wait in admission reached the cap: scheduled alone on the pool as it is now."""
        self.capped += 1
        log.info("request %s waited %.3f s in admission: scheduled alone", request.request_id, waited_s)
        candidates = [e for e in self._router.pool.snapshots(request.model) if _allowed(e, subset)]
        started = time.monotonic()
        decision = self._router.scheduler.schedule(request, candidates)
        return Admitted(decision, None, None, Role.BYPASS, 1, 0, waited_s, time.monotonic() - started)

    def _admitted(
        self,
        api: ApiKind,
        parsed: ParsedRequest,
        request: SchedRequest,
        admitted: Admitted,
        subset: frozenset[str] | None,
    ) -> Pick | Refusal:
        router = self._router
        decision = admitted.decision
        # A windowed request was placed on the whole pool: the gateway's subset still binds.
        ranked = [s.endpoint for s in decision.ranked if s.endpoint.healthy and _allowed(s.endpoint, subset)]
        if not ranked:
            return Refusal(503, "no endpoint of the gateway's subset can take the request", "unavailable")
        router.metrics.observe_decision(decision)
        router.metrics.observe_admission(admitted.role, admitted.waited_s, admitted.group_size)
        if router.prewarmer is not None:
            router.prewarmer.consider(api, parsed.payload, request, decision)
        queued = uncached_tokens(request, decision.matches.get(ranked[0].name))
        if str(admitted.role) == "member":  # its group's prefix is computed once, by the group's first
            queued = min(
                queued, max(0, request.prompt_tokens - admitted.shared_blocks * request.block_tokens)
            )
        return Pick(tuple(ranked[: 1 + self._fallbacks]), request, parsed.stream, queued)

    def _any(self, subset: frozenset[str] | None) -> Pick | Refusal:
        """A request with no prompt to place (another path, or no body): the least busy healthy endpoint."""
        healthy = [e for e in self._router.pool.snapshots() if e.healthy and _allowed(e, subset)]
        if not healthy:
            return Refusal(503, "no healthy endpoint", "unavailable")
        least = min(e.in_flight for e in healthy)
        return Pick((self._rng.choice([e for e in healthy if e.in_flight == least]),), None)

    def _model(self, model: str | None) -> str:
        pool = self._router.pool
        if model is None:
            known = pool.model_ids()
            if len(known) == 1:
                return known[0]
            raise RequestError(400, "'model' is required", param="model")
        if not pool.knows_model(model):
            raise RequestError(
                404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
            )
        return model

    async def _token_ids(self, api: ApiKind, parsed: ParsedRequest) -> tuple[int, ...] | None:
        tokenizer = self._router.tokenizer
        if tokenizer is None:
            return None
        try:
            token_ids = await tokenizer.prompt_token_ids(api, parsed.payload)
        except TokenizationError as exc:
            self._router.metrics.tokenized("fallback")
            log.debug("no exact token ids (%s): the approximate index decides", exc)
            return None
        self._router.metrics.tokenized("ok")
        return token_ids


def _allowed(endpoint: EndpointSnapshot, subset: frozenset[str] | None) -> bool:
    return subset is None or endpoint_address(endpoint.url) in subset
