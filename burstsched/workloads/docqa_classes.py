"""Classes of document-QA requests: priorities, tenants and a noisy tenant on one fixed sequence.

A class is a name, a share of the sequence's requests and the headers its requests send: an objective
(``x-llm-d-inference-objective``, which a router maps to a priority) and a tenant
(``x-llm-d-inference-fairness-id``, the flow a router keeps fair). ``--classes`` writes them as
``name:share[:objective=NAME][:tenant=ID]``, comma-separated, the shares summing to 1.

Everything here is pure and deterministic:

- :func:`assign_classes` deals the classes out as a shuffled deck of exact counts (largest remainders),
  one card per request of the longest sequence the spec allows (``max_requests``), from an RNG of its own
  seeded by the sequence's seed. Request ``i`` gets the same class at every rate and for every target,
  and the shares are exact whenever the sequence reaches ``max_requests``.
- :func:`noisy_requests` adds a tenant sending ``factor`` times the others' rate (the mean rate of the
  base classes' tenants; of the whole sequence when no class names one): a Poisson process of its own
  over the base sequence's span, documents drawn by the same Zipf law, its own RNG. The base requests are
  the same with and without it (same documents, questions, times, classes and headers); only the
  indices, which follow arrival order, move.
- :func:`summarize_classes` is the report's row per class: sent, completed, 429s (and how many carried
  ``Retry-After``), other failures (timeouts among them), the completed requests' TTFT percentiles and
  the goodput (completed with TTFT within the objective).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from burstsched.workloads.docqa import QUESTION_TEXTS, DocQARequest, DocQASpec
from burstsched.workloads.docqa_run import RequestRecord
from burstsched.workloads.stats import percentile, ratio
from burstsched.workloads.zipf import ZipfSampler

OBJECTIVE_HEADER = "x-llm-d-inference-objective"
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"
RETRY_AFTER = "retry-after"
DEFAULT_CLASS = "base"
"""The class of the base requests when only a noisy tenant is given."""


@dataclass(frozen=True, slots=True)
class RequestClass:
    """A share of the requests and what they send: an objective (priority) and a tenant (flow)."""

    name: str
    share: float
    objective: str | None = None
    tenant: str | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, "class name")
        if not 0 < self.share <= 1:
            raise ValueError(f"class {self.name}: share must be in (0, 1], got {self.share}")
        for what, value in (("objective", self.objective), ("tenant", self.tenant)):
            if value is not None:
                _check_name(value, f"class {self.name}: {what}")

    def headers(self) -> tuple[tuple[str, str], ...]:
        """The headers each request of the class sends."""
        out: list[tuple[str, str]] = []
        if self.objective is not None:
            out.append((OBJECTIVE_HEADER, self.objective))
        if self.tenant is not None:
            out.append((FAIRNESS_HEADER, self.tenant))
        return tuple(out)

    def describe(self) -> str:
        """``objective=… tenant=…``, or ``-`` when the class sends neither."""
        parts = [f"objective={self.objective}"] * (self.objective is not None)
        parts += [f"tenant={self.tenant}"] * (self.tenant is not None)
        return " ".join(parts) or "-"


@dataclass(frozen=True, slots=True)
class NoisyTenant:
    """A tenant sending ``factor`` times the others' rate on top of the base sequence."""

    tenant: str
    factor: float
    objective: str | None = None

    def __post_init__(self) -> None:
        _check_name(self.tenant, "noisy tenant")
        if not (self.factor > 0 and math.isfinite(self.factor)):
            raise ValueError(f"noisy tenant {self.tenant}: factor must be > 0, got {self.factor}")
        if self.objective is not None:
            _check_name(self.objective, f"noisy tenant {self.tenant}: objective")

    def as_class(self) -> RequestClass:
        """Its requests as a class of their own, named after the tenant (share 1: of its own requests)."""
        return RequestClass(self.tenant, 1.0, self.objective, self.tenant)


@dataclass(frozen=True, slots=True)
class ClassPlan:
    """The base sequence's classes and, optionally, a noisy tenant on top."""

    classes: tuple[RequestClass, ...]
    noisy: NoisyTenant | None = None

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError("at least one class")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"class names must be distinct: {names}")
        total = sum(c.share for c in self.classes)
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(f"class shares must sum to 1, got {total:g}")
        if self.noisy is not None:
            if self.noisy.tenant in names:
                raise ValueError(f"noisy tenant {self.noisy.tenant}: a class has that name")
            if self.noisy.tenant in self.tenants():
                raise ValueError(f"noisy tenant {self.noisy.tenant}: a base class already sends as it")

    def tenants(self) -> list[str]:
        """The base classes' distinct tenants, in order."""
        return list(dict.fromkeys(c.tenant for c in self.classes if c.tenant is not None))

    def others_rate(self, rate: float) -> float:
        """Requests/s of one base tenant on average (the whole sequence's when no class names one)."""
        tenants = self.tenants()
        if not tenants:
            return rate
        return rate * sum(c.share for c in self.classes if c.tenant is not None) / len(tenants)

    def noisy_rate(self, rate: float) -> float:
        """The noisy tenant's requests/s (0 without one)."""
        return 0.0 if self.noisy is None else self.noisy.factor * self.others_rate(rate)

    def all_classes(self) -> tuple[RequestClass, ...]:
        """Every class a request of the sequence can be in, the noisy tenant's last."""
        return self.classes + (() if self.noisy is None else (self.noisy.as_class(),))

    def describe(self, rate: float) -> str:
        """The report's setup line."""
        parts = [f"{c.name} {100 * c.share:g}% ({c.describe()})" for c in self.classes]
        text = "; ".join(parts)
        if self.noisy is not None:
            text += (
                f"; noisy tenant {self.noisy.tenant} at {self.noisy.factor:g}x the others' rate "
                f"({self.noisy_rate(rate):.2f} requests/s at {rate:.2f}) on top"
            )
        return text


def _check_name(value: str, what: str) -> None:
    if not value or not value.isascii() or not value.isprintable() or any(ch in value for ch in " ,:="):
        raise ValueError(
            f"{what} must be non-empty printable ASCII without spaces, ',', ':' or '=': {value!r}"
        )


def _options(fields: Sequence[str], allowed: Sequence[str], where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in fields:
        key, sep, value = item.partition("=")
        if not sep or key not in allowed:
            raise ValueError(f"{where}: expected {' or '.join(k + '=…' for k in allowed)}, got {item!r}")
        if key in out:
            raise ValueError(f"{where}: {key} given twice")
        out[key] = value
    return out


def parse_classes(text: str) -> tuple[RequestClass, ...]:
    """``name:share[:objective=NAME][:tenant=ID],…`` (the shares are checked by :class:`ClassPlan`)."""
    classes: list[RequestClass] = []
    for item in text.split(","):
        name, _, rest = item.strip().partition(":")
        share_text, *fields = rest.split(":") if rest else [""]
        try:
            share = float(share_text)
        except ValueError:
            raise ValueError(f"class {name!r}: expected name:share, got {item.strip()!r}") from None
        options = _options(fields, ("objective", "tenant"), f"class {name}")
        classes.append(RequestClass(name, share, options.get("objective"), options.get("tenant")))
    return tuple(classes)


def parse_noisy_tenant(text: str) -> NoisyTenant:
    """``NAME:FACTOR[:objective=NAME]``."""
    name, _, rest = text.strip().partition(":")
    factor_text, *fields = rest.split(":") if rest else [""]
    try:
        factor = float(factor_text)
    except ValueError:
        raise ValueError(f"noisy tenant: expected NAME:FACTOR, got {text.strip()!r}") from None
    options = _options(fields, ("objective",), f"noisy tenant {name}")
    return NoisyTenant(name, factor, options.get("objective"))


def plan_of(classes: str | None, noisy: str | None) -> ClassPlan | None:
    """The plan the command line asks for; None when it asks for neither classes nor a noisy tenant."""
    if classes is None and noisy is None:
        return None
    parsed = parse_classes(classes) if classes is not None else (RequestClass(DEFAULT_CLASS, 1.0),)
    return ClassPlan(parsed, None if noisy is None else parse_noisy_tenant(noisy))


# -- the sequence --------------------------------------------------------------------------------------
def class_counts(classes: Sequence[RequestClass], count: int) -> list[int]:
    """How many of ``count`` requests each class gets: its share, rounded by largest remainders (ties to
    the earlier class), so the counts sum to ``count`` (shares taken relative to their sum)."""
    total = sum(c.share for c in classes)
    exact = [c.share / total * count for c in classes]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(classes)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: count - sum(counts)]:
        counts[i] += 1
    return counts


def assign_classes(classes: Sequence[RequestClass], count: int, rng: random.Random) -> list[str]:
    """A deck of ``count`` class names, each class's exact count (:func:`class_counts`), shuffled."""
    deck = [c.name for c, n in zip(classes, class_counts(classes, count), strict=True) for _ in range(n)]
    rng.shuffle(deck)
    return deck


def classes_rng(seed: int) -> random.Random:
    return random.Random(f"docqa-classes:{seed}")


def noisy_rng(seed: int, tenant: str) -> random.Random:
    return random.Random(f"docqa-noisy:{seed}:{tenant}")


def noisy_requests(
    spec: DocQASpec, base: Sequence[DocQARequest], noisy_class: RequestClass, rate: float, rng: random.Random
) -> list[DocQARequest]:
    """The noisy tenant's requests: Poisson at ``rate`` over the base sequence's span (its ``duration_s``,
    or its last arrival when it stopped at ``max_requests``), documents by the spec's Zipf law. Each takes
    the same draws whatever the rate, so with the base sequence's times its requests only stretch or
    shrink with the rate. Their questions are distinct from the base ones (they carry the tenant); their
    indices are placeholders until :func:`classed_sequence` numbers the merged sequence."""
    if rate <= 0 or not base:
        return []
    end = base[-1].arrival_s if len(base) >= spec.max_requests else spec.duration_s
    sampler = ZipfSampler(spec.documents, spec.zipf_exponent)
    headers = noisy_class.headers()
    out: list[DocQARequest] = []
    now = 0.0
    while True:
        now += rng.expovariate(1.0) / rate
        document = sampler.sample(rng)
        question = f"Question {noisy_class.name}-{len(out) + 1}: {rng.choice(QUESTION_TEXTS)}"
        if now >= end:
            return out
        out.append(DocQARequest(-1, document, question, now, noisy_class.name, headers))


def classed_sequence(spec: DocQASpec, base: Sequence[DocQARequest], plan: ClassPlan) -> list[DocQARequest]:
    """``base`` (built from ``spec``) with each request's class and headers, the noisy tenant's requests
    merged in by arrival time (a base request first on a tie), every request numbered by its position."""
    deck = assign_classes(plan.classes, max(spec.max_requests, len(base)), classes_rng(spec.seed))
    by_name = {c.name: c for c in plan.classes}
    classed = [
        replace(r, request_class=deck[r.index], headers=by_name[deck[r.index]].headers()) for r in base
    ]
    extra: list[DocQARequest] = []
    if plan.noisy is not None:
        rate = plan.noisy_rate(spec.rate)
        extra = noisy_requests(
            spec, base, plan.noisy.as_class(), rate, noisy_rng(spec.seed, plan.noisy.tenant)
        )
    merged = sorted(
        [*((r, 0) for r in classed), *((r, 1) for r in extra)], key=lambda p: (p[0].arrival_s, p[1])
    )
    return [replace(r, index=i) for i, (r, _) in enumerate(merged)]


# -- the summary ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ClassSummary:
    """One class of one run: the per-class row."""

    request_class: str
    headers: str
    sent: int
    completed: int
    refused_429: int
    retry_after_429: int
    """429s whose answer carried ``Retry-After``."""
    other_failures: int
    """Requests neither completed nor answered 429 (other statuses, errors, cut streams, timeouts)."""
    timed_out: int
    """Of the other failures, those that ended on a timeout (the client's or the drain's)."""
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    good: int
    """Completed requests with TTFT within the objective."""
    goodput_rps: float
    """``good`` per second of the run's makespan."""

    def as_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def timed_out(record: RequestRecord) -> bool:
    """Whether a failed request ended on a timeout rather than an answer."""
    return record.status is None and "timeout" in (record.error or "").lower()


def summarize_class(
    klass: RequestClass, records: Sequence[RequestRecord], slo_ms: float, makespan_s: float
) -> ClassSummary:
    """The row of one class, from its records; ``slo_ms``: the TTFT objective of the goodput."""
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    refused = [r for r in records if r.status == 429]
    others = [r for r in records if not r.ok and r.status != 429]
    good = sum(t <= slo_ms for t in ttfts)
    return ClassSummary(
        request_class=klass.name,
        headers=klass.describe(),
        sent=len(records),
        completed=len(ok),
        refused_429=len(refused),
        retry_after_429=sum(RETRY_AFTER in r.headers for r in refused),
        other_failures=len(others),
        timed_out=sum(timed_out(r) for r in others),
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=percentile(ttfts, 95),
        ttft_p99_ms=percentile(ttfts, 99),
        good=good,
        goodput_rps=ratio(good, makespan_s),
    )


def summarize_classes(
    plan: ClassPlan, records: Sequence[RequestRecord], slo_ms: float, makespan_s: float
) -> list[ClassSummary]:
    """One row per class of ``plan``, in its order (the noisy tenant's last)."""
    return [
        summarize_class(klass, [r for r in records if r.request_class == klass.name], slo_ms, makespan_s)
        for klass in plan.all_classes()
    ]
