"""Where each request of a run went, by the replicas' own account, and where its prompt was computed cold.

A peer router's answers do not name the replica that served them; the replicas can. A pool that records
the ``X-Request-Id`` of every inference request each replica receives (the simulator with
``record_requests``) gives, per replica, the ids in arrival order: :func:`attach_replicas` names the
replica of each record the router's header did not name.

With every request's replica known, :func:`cold_placements` splits the requests served mostly cold (more
than half the prompt computed) by where the same document's (or conversation's) previous request of the
run went:

- **moved**: to another replica. The document was cold there (it had lived elsewhere, or nowhere), and now
  takes cache on a second replica;
- **in place**: to the same replica, which had evicted it.

A router that keeps documents where they lived has few moves; each move it makes is a prefill that a copy
elsewhere may have saved, and a second copy that pushes something else out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from burstsched.workloads.open_loop import RequestRecord, request_id
from burstsched.workloads.stats import mostly_cold

if TYPE_CHECKING:
    from burstsched.sim import SimPool

Received = Callable[[], Sequence[Sequence[str]]]
"""Each replica's received request ids so far, in arrival order (the pool's endpoints' order)."""


def attach_replicas(
    records: Sequence[RequestRecord],
    tag: str,
    names: Sequence[str],
    before: Sequence[int],
    after: Sequence[Sequence[str]],
) -> int:
    """Name the replica of each record that has none, from the ids each replica received since ``before``
    (its count of ids then; ``after``: its ids now). Returns how many records were named."""
    where: dict[str, str] = {}
    for name, start, ids in zip(names, before, after, strict=True):
        for rid in ids[start:]:
            where[rid] = name
    named = 0
    for record in records:
        if record.replica is None:
            replica = where.get(request_id(tag, record.index))
            if replica is not None:
                record.replica = replica
                record.replica_source = "replicas"
                named += 1
    return named


def simulator_received(pool: SimPool) -> list[list[str]]:
    """Each simulated replica's received ids (a pool with ``record_requests=True``): a :data:`Received`."""
    return [[r.headers.get("x-request-id", "") for r in pool.requests(i)] for i in range(len(pool.names))]


def received_counts(received: Received) -> list[int]:
    """How many ids each replica has received so far."""
    return [len(ids) for ids in received()]


class ReplicaWatch:
    """Counts each replica's ids when made; :meth:`name` then names the replica of a run's records from the
    ids received since (nothing without ``received``)."""

    def __init__(self, received: Received | None) -> None:
        self._received = received
        self._before = received_counts(received) if received is not None else None

    def name(self, records: Sequence[RequestRecord], tag: str, names: Sequence[str]) -> int:
        if self._received is None or self._before is None:
            return 0
        return attach_replicas(records, tag, names, self._before, self._received())


@dataclass(frozen=True, slots=True)
class ColdPlacements:
    """Shares of a run's completed requests (with usage) served mostly cold, by where their document's
    previous request went; nan when some request's replica is unknown."""

    moved: float
    in_place: float
    first: float
    """Cold as the document's first request of the run."""


UNKNOWN = ColdPlacements(math.nan, math.nan, math.nan)


def cold_placements(
    records: Sequence[RequestRecord], key: Callable[[RequestRecord], Hashable]
) -> ColdPlacements:
    """See the module's docstring; ``key`` names a record's document (records in arrival order)."""
    done = [r for r in records if r.ok and r.prompt_tokens is not None and r.cached_tokens is not None]
    if not done or any(r.replica is None for r in done):
        return UNKNOWN
    last: dict[Hashable, str | None] = {}
    moved = in_place = first = 0
    for record in sorted(done, key=lambda r: r.index):
        document = key(record)
        previous = last.get(document)
        if mostly_cold(record.prompt_tokens, record.cached_tokens or 0):
            if document not in last:
                first += 1
            elif previous == record.replica:
                in_place += 1
            else:
                moved += 1
        last[document] = record.replica
    n = len(done)
    return ColdPlacements(moved / n, in_place / n, first / n)


def by_document(record: RequestRecord) -> Hashable:
    """A record's document, from its labels (document QA)."""
    labels: Mapping[str, object] = record.labels()
    return labels.get("document")


def by_session(record: RequestRecord) -> Hashable:
    """A record's conversation, from its labels (multi-tenant chat: its tenant and user)."""
    labels: Mapping[str, object] = record.labels()
    return (labels.get("tenant"), labels.get("user"))
