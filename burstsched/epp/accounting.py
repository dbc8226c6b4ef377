"""The pool's bookkeeping for a request the gateway proxies, as the dispatcher keeps it for ``serve``.

Once picked, the request counts on its endpoint (in flight, and its prompt tokens to compute in the prefill
ledger) until its ext_proc stream ends; its first response body byte ends its prefill and is its time to
first token for the endpoint's fitted model (:mod:`burstsched.pool.ttft_fit`); a 5xx answer counts as the
endpoint's failure, anything else as its success. The scheduler's dispatch hooks (the prefix indexes) hear
of a whole-body request when it is picked, of a stream when its response head comes back 2xx (as in
:mod:`burstsched.dispatch.proxy`). When the gateway says a fallback served the response
(``x-gateway-destination-endpoint-served`` in the response's ``envoy.lb`` metadata), the pick counts as a
failed attempt and the request moves to the fallback's account.

The router's latency histograms see it as they see a request through ``serve``, timed from the stream's
first message (the request's headers at the gateway): time to first token at a stream's first response body
chunk, end to end at the response's end (``burstsched_time_to_first_token_seconds``,
``burstsched_e2e_request_latency_seconds``), both only where the gateway sends the response body. The end is
the body's end of stream, or, as Envoy does not always send that last empty message before closing the
stream, the body's own end: a stream's ``data: [DONE]``, a whole body's ``content-length`` reached.

When the gateway does not send the response body (``response_body_mode: NONE``), the prefill ends with the
response head instead: for a stream that is when the replica queued it, so its time to first token is not
observed and the ledger's estimate of it ends early.

The tokens it used, for flow control's program-aware fairness (as ``serve``'s dispatcher keeps them): with
``fairness: program-aware`` the last 2 KiB of the response body are kept (a whole body's ``usage`` object,
or a stream's usage chunk, which vLLM sends with ``stream_options.include_usage``), and a request that
ended ``ok`` credits its flow (``Pick.identity``, from the shared decision) with the ``usage`` counts found
there, its prompt's estimate and no output tokens when none are (no usage, or no response body sent). That
is all ``serve`` feeds from a response's usage besides its traffic recorder, which the picker does not run:
no router metric counts usage. Without program-aware fairness nothing of the body is kept.
"""

from __future__ import annotations

import time

from burstsched.dispatch.proxy import RESPONSE_TAIL_BYTES
from burstsched.epp.picker import Pick
from burstsched.epp.wire import endpoint_address
from burstsched.framework import EndpointSnapshot
from burstsched.front.app import Router
from burstsched.pool import CircuitState
from burstsched.recording.line import usage_counts

_DONE = b"data: [DONE]\n\n"


class Accounting:
    """One picked request on its endpoint, from the pick to the end of its stream."""

    def __init__(self, router: Router, pick: Pick, started: float | None = None) -> None:
        """``started``: when the request's stream began, on the metrics' clock (None: now)."""
        self._router = router
        self._started = started if started is not None else router.metrics.clock()
        self._pick = pick
        self._name = pick.endpoint.name
        self._status: int | None = None
        self._prefill = pick.queued_prefill
        self._first_body = False
        self._done = False
        self._ended = False
        self._last_seen = False
        """Nothing of the response comes after its head (no body, or the gateway does not send it)."""
        self._length: int | None = None
        self._seen = 0
        self._claimed = CircuitState.CLOSED
        self._load = (0, 0)
        self._sent_at = time.monotonic()
        self._keep_tail = router.flow is not None and router.config.flow_control.fairness == "program-aware"
        """Keep the response's tail for its usage: only program-aware fairness reads it."""
        self._tail = b""
        self._attempt(pick.endpoint)

    def _attempt(self, endpoint: EndpointSnapshot) -> None:
        """Count the request on ``endpoint`` (in flight, its prefill in the ledger, a circuit attempt)."""
        pick, pool = self._pick, self._router.pool
        self._name = endpoint.name
        self._address = endpoint_address(endpoint.url)
        claimed = pool.begin_attempt(self._name)
        self._claimed = claimed if claimed is not None else CircuitState.CLOSED
        prompt_tokens = pick.request.prompt_tokens if pick.request is not None else 0
        pool.acquire(self._name, self._prefill, prompt_tokens)
        self._load = pool.load(self._name)
        if pick.request is not None and not pick.stream:
            self._router.scheduler.on_dispatch(pick.request, endpoint)

    def served_by(self, address: str | None) -> None:
        """The gateway says ``address`` served the response (``x-gateway-destination-endpoint-served``): when
        that is one of the fallbacks, the pick failed and the request moves to that endpoint's account."""
        if address is None or self._done:
            return
        endpoint = next((e for e in self._pick.endpoints if endpoint_address(e.url) == address), None)
        if endpoint is None or endpoint.name == self._name:
            return
        pool = self._router.pool
        pool.release(self._name, self._prefill)
        pool.end_attempt(self._name, self._claimed)
        pool.report_failure(self._name, unreachable=False)
        self._router.metrics.attempt(self._name, "gateway_failover")
        self._attempt(endpoint)

    @property
    def endpoint_name(self) -> str:
        return self._name

    @property
    def address(self) -> str:
        """``IP:PORT`` of the endpoint the request is counted on (the pick, or the fallback that served)."""
        return self._address

    def response_head(self, status: int, *, body_follows: bool, content_length: int | None = None) -> None:
        """The response's head came with ``status``; ``body_follows``: the gateway will send its body."""
        self._status = status
        self._length = content_length
        self._last_seen = not body_follows
        if not body_follows:
            self._end_prefill()
        if status >= 500:
            self._router.pool.report_failure(self._name, unreachable=False)
        elif status < 300 and self._pick.stream and self._pick.request is not None:
            self._router.scheduler.on_dispatch(self._pick.request, self._pick.endpoint)

    def response_body(self, chunk: bytes) -> None:
        """A response body chunk came; the first ends the request's prefill, the last (as its bytes say) the
        response."""
        self._seen += len(chunk)
        if self._keep_tail:
            if len(chunk) >= RESPONSE_TAIL_BYTES:
                self._tail = chunk[-RESPONSE_TAIL_BYTES:]
            else:
                self._tail = (self._tail + chunk)[-RESPONSE_TAIL_BYTES:]
        if self._pick.stream:
            if chunk.endswith(_DONE):
                self.response_end()
        elif self._length is not None and self._seen >= self._length:
            self.response_end()
        if self._first_body:
            return
        self._first_body = True
        if self._pick.stream and self._status is not None and self._status < 300:
            ahead, in_flight = self._load
            self._router.pool.observe_ttft(self._name, ahead, in_flight - 1, time.monotonic() - self._sent_at)
            metrics = self._router.metrics
            metrics.observe_ttft(self._name, metrics.clock() - self._started)
        self._end_prefill()

    def response_end(self) -> None:
        """The response's last byte went through the picker (its body's or its headers' end of stream)."""
        if not self._done and not self._ended and self._status is not None:
            self._ended = True
            metrics = self._router.metrics
            metrics.observe_e2e(self._name, metrics.clock() - self._started)

    def finish(self, outcome: str | None = None) -> None:
        """The stream ended (``outcome`` None: judged from the response status; a stream cancelled after the
        last of its response the picker sees, as Envoy sometimes ends it, is judged so too)."""
        if self._done:
            return
        self._done = True
        if self._ended or self._last_seen:
            outcome = None
        pool, metrics = self._router.pool, self._router.metrics
        status = self._status
        if outcome is None:
            if status is None:
                outcome = "cancelled"
            elif status >= 500:
                outcome = "upstream_error"
            else:
                outcome = "ok" if status < 400 else "client_error"
        pool.release(self._name, self._prefill)
        self._prefill = 0
        pool.end_attempt(self._name, self._claimed)
        if status is not None and status < 500:
            pool.report_success(self._name)
            metrics.attempt(self._name, "ok")
        elif status is not None:
            metrics.attempt(self._name, "status_5xx")
        metrics.request_done(self._name, outcome)
        if outcome == "ok":
            self._completed()

    def _completed(self) -> None:
        """Credit the request's flow with the tokens it used (program-aware fairness), as ``serve`` does."""
        flow, request, identity = self._router.flow, self._pick.request, self._pick.identity
        if flow is None or request is None or identity is None:
            return
        prompt_tokens, output_tokens, _ = usage_counts(self._tail)
        flow.completed(identity.flow, prompt_tokens or request.prompt_tokens, output_tokens or 0)

    def _end_prefill(self) -> None:
        if self._prefill:
            self._router.pool.prefill_done(self._name, self._prefill)
            self._prefill = 0
