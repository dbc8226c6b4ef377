"""One request's decision, the same for both fronts: ``serve`` (:mod:`burstsched.front.app`) and the gateway's
endpoint picker (:mod:`burstsched.epp.picker`).

:func:`decide` takes what a front has (the API, the body, the client's headers) and runs everything up to the
choice of endpoint: validation, the model, the prompt's token ids (precise index), the request headers the
profile's plugins read (:mod:`.plugin_headers`, e.g. llm-d's session affinity), the probabilistic admitter,
admission (the burst window), the flow-control queue, the decision metrics and the prewarmer. It answers a
:class:`Decided` (where the request goes and as which part of its group) or a :class:`Refusal` (an HTTP status
and an OpenAI error). What it leaves to the front is its own transport: ``serve`` reads the body and proxies
the request, the picker names the endpoint to the gateway and keeps the gateway's subset.

Why one path: the two fronts each had their own copy, and the picker's fell behind (no flow control, no
admitter, no plugin headers, a prefill cap for one sharing role of two). One copy cannot drift.

Two things only the picker asks for: ``allowed`` (the gateway's subset: candidates and the final ranking
keep only those endpoints) and ``max_wait_s`` (the gateway stops waiting for the answer, so the whole wait,
in admission and in the flow queue together, is capped; a request that reaches the cap is scheduled alone on
the pool as it is then, see :mod:`burstsched.epp.picker`). ``serve`` passes neither and pays for neither.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from starlette.types import Receive

from burstsched.admission import (
    SHARING_ROLES,
    AdmissionClosed,
    AdmissionQueueFull,
    Admitted,
    NoEndpointAvailable,
    Role,
)
from burstsched.flow import Disconnected, FlowRefused, Identity, Released, identify
from burstsched.framework import ApiKind, Decision, EndpointSnapshot, SchedRequest, tokens_past
from burstsched.front.engine_priority import with_engine_priority
from burstsched.front.plugin_headers import plugin_request_headers
from burstsched.front.request import ParsedRequest, RequestError, parse_request
from burstsched.scheduling import NoEndpointsError
from burstsched.telemetry import RequestTrace
from burstsched.tokenization import TokenizationError

if TYPE_CHECKING:  # the router holds its parts; it imports this module, not the other way at run time
    from burstsched.front.app import Router

log = logging.getLogger(__name__)

Allowed = Callable[[EndpointSnapshot], bool]
"""Whether an endpoint may take the request (the gateway's subset); None: every endpoint may."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """The request is answered at once with this status and OpenAI error (``outcome``: the label of the
    router's request metrics, ``rejected``, ``unavailable``, ``throttled``; ``cancelled`` when the client went
    away and nothing is to be sent)."""

    status: int
    message: str
    outcome: str
    headers: tuple[tuple[str, str], ...] = ()
    param: str | None = None
    code: str | None = None


CLIENT_GONE = Refusal(499, "the client went away", "cancelled")
"""The client disconnected while its request waited: nothing is sent (499 as nginx logs it)."""


@dataclass(frozen=True, slots=True)
class Decided:
    """Where the request goes: ``decision`` (its ranking), ``role`` and ``shared_blocks`` as admission or the
    flow queue (when it held the request) left them; ``admitted``: admission's own answer (the recorder
    writes it); ``capped``: the wait reached the picker's cap, so it was scheduled alone."""

    parsed: ParsedRequest
    request: SchedRequest
    admitted: Admitted
    decision: Decision
    role: str
    shared_blocks: int
    identity: Identity
    capped: bool = False
    queued_s: float = 0.0
    """How long the flow queue held it (0: it went straight through)."""

    @property
    def prefill_cap(self) -> int | None:
        """The most prompt tokens its endpoint computes for it: a sharing role's group prefix is computed
        once, by the group's first request, so only its own rest counts (None: no cap)."""
        if self.role not in SHARING_ROLES:
            return None
        return tokens_past(self.request, self.shared_blocks)


async def decide(
    router: Router,
    api: ApiKind,
    body: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    request_id: str | None = None,
    *,
    allowed: Allowed | None = None,
    receive: Receive | None = None,
    max_wait_s: float | None = None,
    trace: RequestTrace | None = None,
) -> Decided | Refusal:
    """Decide where one chat or completions request goes.

    ``headers``: the client's (raw, as ASGI has them; names lower-case); ``request_id``: the client's
    ``x-request-id`` (None: a random one); ``allowed``: the endpoints the request may go to (None: all);
    ``receive``: the client's ASGI receive, watched for a disconnect while the flow queue holds the request;
    ``max_wait_s``: the cap on the whole wait (None: uncapped); ``trace``: the request's spans.
    """
    started = anyio.current_time()
    deadline = None if max_wait_s is None else started + max_wait_s
    try:
        parsed = parse_request(api, body)
        pool = router.pool
        if pool.healthy_count() == 0 and router.flow is not None:  # a pool scaling from zero
            with anyio.move_on_at(deadline if deadline is not None else float("inf")):
                await router.flow.wait_ready(lambda: pool.healthy_count() > 0)
        if pool.healthy_count() == 0:
            return Refusal(503, "no healthy endpoint", "unavailable")
        model = resolve_model(router, parsed.model)
    except RequestError as exc:
        return Refusal(exc.status, exc.message, "rejected", param=exc.param, code=exc.code)
    request_id = request_id or os.urandom(16).hex()  # as random as uuid4().hex
    token_ids = await _token_ids(router, api, parsed.payload)
    plugin_headers = plugin_request_headers(headers, router.scheduler.profile.request_headers)
    request = parsed.to_sched_request(
        request_id, model, router.config.prefix_hashing, token_ids, plugin_headers
    )
    if trace is not None:
        trace.describe(parsed.payload, chat=api is ApiKind.CHAT, model=model, request_id=request_id)
    candidates = pool.snapshots(model)
    if allowed is not None:
        candidates = [e for e in candidates if allowed(e)]
    if not any(e.healthy for e in candidates):
        return Refusal(503, f"no healthy endpoint serves model {model!r}", "unavailable")
    identity = identify(headers, router.config.flow_control)
    if router.admitter is not None:
        saturation = router.admitter.refuses(identity.priority, candidates)
        if saturation is not None:
            message = f"this request's priority ({identity.priority}) is sheddable and the pool is at "
            message += f"saturation {saturation:.2f}: refused by the probabilistic admitter"
            return Refusal(429, message, "throttled", _retry_after(router.config.flow_control.retry_after_s))
    if trace is not None:
        trace.admission_started()
    capped, queued_s = False, 0.0
    try:
        admitted: Admitted | None
        if deadline is None:
            admitted = await router.admission.admit(request, candidates)
        else:
            admitted = None
            with anyio.move_on_at(deadline):
                admitted = await router.admission.admit(request, candidates)
            if admitted is None:
                admitted, capped = _alone(router, request, allowed, started, "admission"), True
    except AdmissionQueueFull as exc:
        return Refusal(429, str(exc), "throttled", _retry_after(exc.retry_after_s))
    except (NoEndpointAvailable, AdmissionClosed, NoEndpointsError) as exc:
        return Refusal(503, str(exc), "unavailable")
    decision, role, shared_blocks = admitted.decision, str(admitted.role), admitted.shared_blocks
    router.metrics.observe_admission(admitted.role, admitted.waited_s, admitted.group_size)
    if trace is not None:
        trace.admitted(admitted)
    if router.flow is not None:
        try:
            released = await _hold(router, request, admitted, identity, len(body), receive, deadline)
        except FlowRefused as exc:
            outcome = "throttled" if exc.status == 429 else "unavailable"
            retry = _retry_after(exc.retry_after_s) if exc.retry_after_s else ()
            return Refusal(exc.status, exc.message, outcome, retry)
        except Disconnected:
            return CLIENT_GONE
        if released is None:  # still queued at the cap: it left the queue
            try:
                decision = _alone(router, request, allowed, started, "the flow queue").decision
            except NoEndpointsError as exc:
                return Refusal(503, str(exc), "unavailable")
            role, shared_blocks, capped = str(Role.BYPASS), 0, True
        elif released.queued:
            decision, role, shared_blocks = released.decision, str(released.role), released.shared_blocks
            queued_s = released.waited_s
            if trace is not None:
                trace.queued(released.waited_s, identity.priority, identity.flow, released.overtook)
    if allowed is not None and not any(s.endpoint.healthy and allowed(s.endpoint) for s in decision.ranked):
        # a windowed (or queued) request was placed on the whole pool: the subset still binds
        return Refusal(503, "no endpoint of the gateway's subset can take the request", "unavailable")
    router.metrics.observe_decision(decision)
    if router.prewarmer is not None:
        router.prewarmer.consider(api, parsed.payload, request, decision)
    if router.config.flow_control.engine_priority:
        parsed = with_engine_priority(parsed, identity.priority)
    return Decided(parsed, request, admitted, decision, role, shared_blocks, identity, capped, queued_s)


def resolve_model(router: Router, model: str | None) -> str:
    """The model a request names, checked against the pool's; the pool's only model when it names none."""
    pool = router.pool
    if model is None:
        known = pool.model_ids()
        if len(known) == 1:
            return known[0]
        raise RequestError(400, "'model' is required", param="model")
    if not pool.knows_model(model):
        raise RequestError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")
    return model


async def _token_ids(router: Router, api: ApiKind, payload: dict[str, Any]) -> tuple[int, ...] | None:
    """The prompt's engine token ids; None (the approximate index decides) when they cannot be exact."""
    if router.tokenizer is None:
        return None
    try:
        token_ids = await router.tokenizer.prompt_token_ids(api, payload)
    except TokenizationError as exc:
        router.metrics.tokenized("fallback")
        log.debug("no exact token ids (%s): the approximate index decides", exc)
        return None
    router.metrics.tokenized("ok")
    return token_ids


def _alone(
    router: Router, request: SchedRequest, allowed: Allowed | None, started: float, where: str
) -> Admitted:
    """A request whose wait reached the cap: scheduled alone on the pool as it is now (it loses its group's
    co-location, never its answer). Raises :class:`NoEndpointsError` when no endpoint can take it."""
    waited_s = anyio.current_time() - started
    log.info("request %s waited %.3f s in %s: scheduled alone", request.request_id, waited_s, where)
    candidates = router.pool.snapshots(request.model)
    if allowed is not None:
        candidates = [e for e in candidates if allowed(e)]
    scheduling = time.monotonic()
    decision = router.scheduler.schedule(request, candidates)
    return Admitted(decision, None, None, Role.BYPASS, 1, 0, waited_s, time.monotonic() - scheduling)


async def _hold(
    router: Router,
    request: SchedRequest,
    admitted: Admitted,
    identity: Identity,
    size: int,
    receive: Receive | None,
    deadline: float | None,
) -> Released | None:
    """The flow queue's answer (None: the request was still queued at ``deadline``, and has left the queue).

    A request past the deadline already (its admission reached the cap) still goes through the queue's
    checks, which take no time: it goes at once where there is room, and a sheddable one is refused where
    there is none; only a request that would wait leaves at once.
    """
    flow = router.flow
    assert flow is not None
    if deadline is None:
        return await flow.hold(request, admitted, identity, size, receive)
    with anyio.move_on_at(deadline):
        return await flow.hold(request, admitted, identity, size, receive)
    return None


def _retry_after(seconds: int) -> tuple[tuple[str, str], ...]:
    return (("retry-after", str(seconds)),)
