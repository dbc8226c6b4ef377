"""The pool's bookkeeping for a request the gateway proxies, as the dispatcher keeps it for ``serve``.

Once picked, the request counts on its endpoint (in flight, and its prompt tokens to compute in the prefill
ledger) until its ext_proc stream ends; its first response body byte ends its prefill and is its time to
first token for the endpoint's fitted model (:mod:`burstsched.pool.ttft_fit`); a 5xx answer counts as the
endpoint's failure, anything else as its success. The scheduler's dispatch hooks (the prefix indexes) hear
of a whole-body request when it is picked, of a stream when its response head comes back 2xx (as in
:mod:`burstsched.dispatch.proxy`).

When the gateway does not send the response body (``response_body_mode: NONE``), the prefill ends with the
response head instead: for a stream that is when the replica queued it, so its time to first token is not
observed and the ledger's estimate of it ends early.
"""

from __future__ import annotations

import time

from burstsched.epp.picker import Pick
from burstsched.front.app import Router
from burstsched.pool import CircuitState


class Accounting:
    """One picked request on its endpoint, from the pick to the end of its stream."""

    def __init__(self, router: Router, pick: Pick) -> None:
        self._router = router
        self._pick = pick
        self._name = pick.endpoint.name
        self._status: int | None = None
        self._prefill = pick.queued_prefill
        self._first_body = False
        self._done = False
        pool = router.pool
        claimed = pool.begin_attempt(self._name)
        self._claimed = claimed if claimed is not None else CircuitState.CLOSED
        prompt_tokens = pick.request.prompt_tokens if pick.request is not None else 0
        pool.acquire(self._name, self._prefill, prompt_tokens)
        self._load = pool.load(self._name)
        self._sent_at = time.monotonic()
        if pick.request is not None and not pick.stream:
            router.scheduler.on_dispatch(pick.request, pick.endpoint)

    @property
    def endpoint_name(self) -> str:
        return self._name

    def response_head(self, status: int, *, body_follows: bool) -> None:
        """The response's head came with ``status``; ``body_follows``: the gateway will send its body."""
        self._status = status
        if not body_follows:
            self._end_prefill()
        if status >= 500:
            self._router.pool.report_failure(self._name, unreachable=False)
        elif status < 300 and self._pick.stream and self._pick.request is not None:
            self._router.scheduler.on_dispatch(self._pick.request, self._pick.endpoint)

    def response_body(self) -> None:
        """A response body chunk came; the first ends the request's prefill."""
        if self._first_body:
            return
        self._first_body = True
        if self._pick.stream and self._status is not None and self._status < 300:
            ahead, in_flight = self._load
            self._router.pool.observe_ttft(self._name, ahead, in_flight - 1, time.monotonic() - self._sent_at)
        self._end_prefill()

    def finish(self, outcome: str | None = None) -> None:
        """The stream ended (``outcome`` None: judged from the response status)."""
        if self._done:
            return
        self._done = True
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

    def _end_prefill(self) -> None:
        if self._prefill:
            self._router.pool.prefill_done(self._name, self._prefill)
            self._prefill = 0
