"""A soak run's verdicts, its markdown report and its JSON.

The verdicts (a failed one fails the run):

- lost requests: none (see :mod:`burstsched.workloads.soak_client` for what counts as lost);
- wrong answers: none (an answer not in OpenAI's shape, a malformed request not answered 4xx);
- cut streams: every stream cut by a killed replica ended with an error event and ``[DONE]``;
- RSS growth after warm-up: the median RSS of the last window of the load against the first window after
  the warm-up, at most ``RSS_GROWTH_LIMIT``;
- file descriptors and asyncio tasks back to the idle baseline after the load (within the settle time);
- kills: every kill planned was made and its replica restarted.

The event-loop lag p99 over the load, the client disconnects and the malformed requests are reported
without a threshold.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from burstsched.workloads.soak import RESTART_MARGIN_S, Sample, SoakResult
from burstsched.workloads.soak_client import KINDS, MALFORMED
from burstsched.workloads.soak_probe import histogram_quantile, median

RSS_GROWTH_LIMIT = 0.05
MIB = 2**20


@dataclass(frozen=True, slots=True)
class Verdict:
    name: str
    passed: bool | None
    """None: reported, no threshold."""
    line: str

    @property
    def mark(self) -> str:
        return {True: "PASS", False: "FAIL", None: "info"}[self.passed]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "line": self.line}


def planned_kills(result: SoakResult) -> int:
    """The kills the run's schedule makes (each restarted well before the load ends)."""
    s = result.settings
    count = 0
    while (count + 1) * s.kill_every_s + s.down_s + RESTART_MARGIN_S <= s.duration_s:
        count += 1
    return count


def rss_windows(result: SoakResult) -> tuple[list[Sample], list[Sample]]:
    """The load's samples in the first window after the warm-up and in its last window."""
    s = result.settings
    load = [x for x in result.samples if x.phase == "load"]
    early = [x for x in load if s.warmup <= x.t_s < s.warmup + s.window_s]
    late = [x for x in load if result.load_s - s.window_s <= x.t_s <= result.load_s]
    return early, late


def rss_growth(result: SoakResult) -> tuple[float, float, float] | None:
    """(early median, late median, growth as a fraction), or None without samples in both windows."""
    early, late = rss_windows(result)
    a, b = median([x.rss_bytes for x in early]), median([x.rss_bytes for x in late])
    if a is None or b is None or a <= 0:
        return None
    return a, b, (b - a) / a


def fd_excess(result: SoakResult) -> dict[str, int]:
    """Kinds of descriptors the router held more of at the end than at its baseline."""
    base = result.baseline.fd_kinds
    return {k: n - base.get(k, 0) for k, n in result.final_fd_kinds.items() if n > base.get(k, 0)}


def lag_p99(result: SoakResult) -> float | None:
    return histogram_quantile(0.99, result.lag_load) if result.lag_load else None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.1f} ms"


def verdicts(result: SoakResult) -> list[Verdict]:
    kinds = Counter(o.kind for o in result.outcomes)
    streams = Counter(o.kind for o in result.outcomes if o.request == "stream")
    malformed = [o for o in result.outcomes if o.request.startswith("malformed:")]
    sent = len(result.outcomes)
    out = [
        Verdict("lost", kinds["lost"] == 0, f"lost requests: {kinds['lost']} of {sent} sent"),
        Verdict(
            "wrong_answers",
            kinds["bad_shape"] == 0,
            f"wrong answers (not OpenAI's shape, malformed not 4xx): {kinds['bad_shape']}",
        ),
        Verdict(
            "cut_streams",
            streams["lost"] == 0,
            f"cut streams: {streams['stream_error']} ended by an error event + [DONE], "
            f"{streams['lost']} without",
        ),
    ]
    growth = rss_growth(result)
    s = result.settings
    if growth is None:
        out.append(Verdict("rss_growth", None, "RSS growth after warm-up: too few samples to compare"))
    else:
        early, late, fraction = growth
        out.append(
            Verdict(
                "rss_growth",
                fraction <= RSS_GROWTH_LIMIT,
                f"RSS growth after warm-up: {100 * fraction:+.1f}% (median {early / MIB:.1f} MiB in "
                f"[{s.warmup:.0f}, {s.warmup + s.window_s:.0f}) s, {late / MIB:.1f} MiB in the last "
                f"{s.window_s:.0f} s of load; limit {100 * RSS_GROWTH_LIMIT:.0f}%)",
            )
        )
    base, final = result.baseline, result.final
    settle = f"after {result.settle_s:.0f} s of settle" + ("" if result.settled else " (timed out)")
    if final is None:
        out.append(Verdict("fds", False, "file descriptors at the end: not read"))
        out.append(Verdict("tasks", False, "asyncio tasks at the end: not read"))
    else:
        extra = fd_excess(result)
        kept = (
            "; more than at the baseline: " + ", ".join(f"{k} +{n}" for k, n in extra.items())
            if extra
            else ""
        )
        out.append(
            Verdict(
                "fds",
                final.fds <= base.fds,
                f"file descriptors: {final.fds} at the end {settle}, baseline {base.fds}{kept}",
            )
        )
        out.append(
            Verdict(
                "tasks",
                final.tasks <= base.tasks,
                f"asyncio tasks: {final.tasks:.0f} at the end {settle}, baseline {base.tasks:.0f}",
            )
        )
    planned = planned_kills(result)
    out.append(
        Verdict(
            "kills",
            len(result.kills) == planned,
            f"replica kills: {len(result.kills)} of {planned} planned, each restarted on its port",
        )
    )
    intervals = [x.lag_p99_s for x in result.samples if x.phase == "load" and x.lag_p99_s is not None]
    out.append(
        Verdict(
            "lag_p99",
            None,
            f"event-loop lag p99 over the load: {_ms(lag_p99(result))} (histogram estimate; worst "
            f"{s.sample_every_s:g} s interval {_ms(max(intervals) if intervals else None)})",
        )
    )
    out.append(
        Verdict(
            "disconnects",
            None,
            f"client disconnects mid-stream: {kinds['cancelled']}; malformed requests: "
            f"{sum(1 for o in malformed if o.kind == 'rejected')} of {len(malformed)} answered 4xx "
            "with an OpenAI error",
        )
    )
    return out


def passed(result: SoakResult) -> bool:
    return all(v.passed is not False for v in verdicts(result))


def outcome_table(result: SoakResult) -> list[tuple[str, ...]]:
    """Rows: request type, then a count per outcome kind."""
    by_request: dict[str, Counter[str]] = {}
    for o in result.outcomes:
        key = "malformed" if o.request.startswith("malformed:") else o.request
        by_request.setdefault(key, Counter())[o.kind] += 1
    rows = [("request", *KINDS, "retried")]
    for request in ("stream", "json", "malformed"):
        counts = by_request.get(request, Counter())
        retried = sum(1 for o in result.outcomes if o.request.startswith(request) and o.attempts > 1)
        rows.append((request, *(str(counts[k]) for k in KINDS), str(retried)))
    return rows


def _table(rows: Sequence[Sequence[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _kill_rows(result: SoakResult) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [("replica", "killed at", "back at", "streams cut", "with error event")]
    for kill in result.kills:
        cut = [
            o
            for o in result.outcomes
            if o.endpoint == kill.replica
            and o.request == "stream"
            and o.started_s <= kill.killed_at_s <= o.ended_s
            and o.kind in ("stream_error", "lost")
        ]
        errored = sum(1 for o in cut if o.kind == "stream_error")
        rows.append(
            (
                kill.replica,
                f"{kill.killed_at_s:.1f} s",
                f"{kill.restarted_at_s:.1f} s",
                str(len(cut)),
                str(errored),
            )
        )
    return rows


def _process_rows(result: SoakResult) -> list[tuple[str, ...]]:
    early, late = rss_windows(result)
    base, final = result.baseline, result.final

    def cells(samples: Sequence[Sample]) -> tuple[str, str, str]:
        if not samples:
            return ("-", "-", "-")
        rss = median([x.rss_bytes for x in samples]) or 0.0
        fds = median([float(x.fds) for x in samples]) or 0.0
        tasks = median([x.tasks for x in samples]) or 0.0
        return (f"{rss / MIB:.1f}", f"{fds:.0f}", f"{tasks:.0f}")

    rows: list[tuple[str, ...]] = [("when", "RSS (MiB)", "open fds", "asyncio tasks")]
    rows.append(
        (
            "baseline (idle, before the load)",
            f"{base.rss_bytes / MIB:.1f}",
            str(base.fds),
            f"{base.tasks:.0f}",
        )
    )
    rows.append(("first window after warm-up (median)", *cells(early)))
    rows.append(("last window of the load (median)", *cells(late)))
    peak = [x for x in result.samples if x.phase in ("load", "drain")]
    if peak:
        rows.append(
            (
                "peak during the load",
                f"{max(x.rss_bytes for x in peak) / MIB:.1f}",
                str(max(x.fds for x in peak)),
                f"{max(x.tasks for x in peak):.0f}",
            )
        )
    if final is not None:
        rows.append(
            ("end (after settle)", f"{final.rss_bytes / MIB:.1f}", str(final.fds), f"{final.tasks:.0f}")
        )
    return rows


def _fd_rows(result: SoakResult) -> list[tuple[str, ...]]:
    base, final = result.baseline.fd_kinds, result.final_fd_kinds
    rows: list[tuple[str, ...]] = [("kind", "baseline", "end")]
    for kind in sorted(set(base) | set(final)):
        rows.append((kind, str(base.get(kind, 0)), str(final.get(kind, 0))))
    return rows


def markdown(result: SoakResult, plot_name: str | None) -> str:
    s = result.settings
    mix = s.mix
    capacity = (
        f"{result.capacity_rps:.2f} req/s measured cold (one request at a time per replica, distinct "
        f"prompts, straight to the replicas; {result.capacity.samples} samples)"
        if result.capacity is not None
        else f"{result.capacity_rps:.2f} req/s (given)"
    )
    verdict_lines = "\n".join(f"- **{v.mark}** {v.line}" for v in verdicts(result))
    problems = [o for o in result.outcomes if o.kind in ("lost", "bad_shape")]
    problem_lines = "\n".join(
        f"- t={o.started_s:.1f}-{o.ended_s:.1f} s {o.request} via {o.endpoint or '-'}: {o.kind} "
        f"(status {o.status}) {o.detail}"
        for o in problems[:30]
    )
    router = ", ".join(f"{k} {v:.0f}" for k, v in result.router_outcomes.items() if v)
    parts = [
        f"# Soak: burstsched on {s.replicas} simulated replicas, {s.duration_s:.0f} s",
        "",
        f"Overall: **{'PASS' if passed(result) else 'FAIL'}**",
        "",
        "## Verdict",
        "",
        verdict_lines,
        "",
        "## Run",
        "",
        f"- load: {s.load:g} × capacity = {result.rate_rps:.2f} req/s, Poisson arrivals, "
        f"for {s.duration_s:.0f} s "
        f"(arrivals ended at {result.load_s:.1f} s, the last answer {result.drain_s:.1f} s later); "
        f"{len(result.outcomes)} requests",
        f"- capacity: {capacity}",
        f"- replicas: {s.replicas} `burstsched sim` processes, time scale {s.time_scale:g}; every "
        f"{s.kill_every_s:g} s the next one gets SIGKILL and is restarted on its port {s.down_s:g} s later",
        f"- mix: {100 * mix.stream_share:.0f}% streamed chat, the rest non-streamed; "
        f"{100 * mix.disconnect_share:g}% of streams closed by the client after 1-4 chunks; "
        f"{100 * mix.malformed_share:g}% malformed ({', '.join(MALFORMED)}); {mix.contexts} shared contexts "
        f"of ~600 tokens; max_tokens {mix.max_tokens_min}-{mix.max_tokens_max}",
        f"- router: `burstsched serve --config {s.config}` "
        f"(limits.max_body_bytes set to {s.max_body_bytes}), "
        f"sampled every {s.sample_every_s:g} s: RSS and fds from /proc/PID, tasks and lag from its /metrics",
        f"- warm-up {s.warmup:.0f} s; RSS windows {s.window_s:.0f} s; "
        f"settle at most {s.settle_timeout_s:.0f} s",
        "",
        "## Outcomes (client side)",
        "",
        _table(outcome_table(result)),
        "",
        f"The router's own count (`burstsched_requests_total` by outcome over the run): {router or '-'}.",
        "",
        "## Kills",
        "",
        _table(_kill_rows(result)) if result.kills else "No kill in this run.",
        "",
        "## Router process",
        "",
        _table(_process_rows(result)),
        "",
        "The router's descriptors by kind (from /proc/PID/fd and /proc/net/tcp):",
        "",
        _table(_fd_rows(result)),
        "",
    ]
    if plot_name is not None:
        parts += [f"![RSS, fds, tasks and event-loop lag over the run]({plot_name})", ""]
    if problems:
        parts += ["## Lost requests and wrong answers (first 30)", "", problem_lines, ""]
    return "\n".join(parts)


def as_json(result: SoakResult) -> dict[str, Any]:
    base = result.baseline
    growth = rss_growth(result)
    return {
        "settings": result.settings.as_json(),
        "passed": passed(result),
        "verdicts": [v.as_json() for v in verdicts(result)],
        "capacity": result.capacity.as_json() if result.capacity else {"requests_per_s": result.capacity_rps},
        "rate_rps": result.rate_rps,
        "load_s": result.load_s,
        "drain_s": result.drain_s,
        "outcomes": dict(Counter(o.kind for o in result.outcomes)),
        "outcome_table": outcome_table(result),
        "router_outcomes": result.router_outcomes,
        "kills": [
            {"replica": k.replica, "killed_at_s": k.killed_at_s, "restarted_at_s": k.restarted_at_s}
            for k in result.kills
        ],
        "baseline": {
            "rss_bytes": base.rss_bytes,
            "fds": base.fds,
            "tasks": base.tasks,
            "fd_kinds": base.fd_kinds,
        },
        "final_fd_kinds": result.final_fd_kinds,
        "final": result.final.as_json() if result.final else None,
        "settled": result.settled,
        "settle_s": result.settle_s,
        "rss_growth": None
        if growth is None
        else {"early": growth[0], "late": growth[1], "fraction": growth[2]},
        "lag_p99_s": lag_p99(result),
        "lag_buckets": [["+Inf" if math.isinf(b) else b, c] for b, c in result.lag_load],
        "problems": [o.as_json() for o in result.outcomes if o.kind in ("lost", "bad_shape")],
        "samples": [x.as_json() for x in result.samples],
    }


def dumps(result: SoakResult) -> str:
    return json.dumps(as_json(result), indent=2, allow_nan=False) + "\n"
