"""A workload run's slowest requests, from its report's JSON: could placement have served them sooner?

    python loadtests/ttft_tail.py loadtests/reports/<run>.json[.gz] [--share 0.9] [--markdown]

For each run whose requests name their replica (burstsched's ``x-burstsched-endpoint`` header, or
client-side routing), the tail is every request whose TTFT is at least ``--share`` × the run's TTFT p95.
Each tail request is sorted by three facts read off the same records:

- cold or warm: whether it computed more than half its prompt (its usage);
- whether its replica was busy when it was sent: another request of the run was then in its prefill there
  (sent, first token not yet come) with more than 500 prompt tokens to compute;
- whether some other replica was free by the same test.

A cold request on a free replica is a plain prefill: no placement serves it sooner, only a cache hit would.
A request on a busy replica while another was free is where placement had room.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from burstsched.workloads.report_page import table as render
from burstsched.workloads.stats import mostly_cold, percentile
from loadtests.ttft_predictions import load

BUSY_TOKENS = 500
"""A replica is busy while a request with more than this many prompt tokens to compute is in its prefill."""

KINDS = (
    "cold, replica free",
    "cold, replica busy, another free",
    "cold, all busy",
    "warm, replica busy, another free",
    "warm, other",
)
COLUMNS = ("run", "p95 ms", "tail", *KINDS)


def _uncached(r: Mapping[str, Any]) -> int:
    return int(r.get("prompt_tokens") or 0) - int(r.get("cached_tokens") or 0)


def _in_prefill(r: Mapping[str, Any], at_s: float) -> bool:
    sent = float(r["sent_s"])
    return sent <= at_s < sent + float(r["ttft_ms"]) / 1000.0 and _uncached(r) > BUSY_TOKENS


def tail_kinds(requests: Sequence[Mapping[str, Any]], share: float = 0.9) -> tuple[float, Counter[str]]:
    """The run's TTFT p95 and how many of its tail requests are of each of :data:`KINDS`."""
    done = [r for r in requests if r.get("ttft_ms") is not None and r.get("replica")]
    if not done:
        return float("nan"), Counter()
    p95 = percentile([float(r["ttft_ms"]) for r in done], 95)
    replicas = {str(r["replica"]) for r in done}
    kinds: Counter[str] = Counter()
    for r in done:
        if float(r["ttft_ms"]) < share * p95:
            continue
        at = float(r["sent_s"])
        busy = {str(o["replica"]) for o in done if o is not r and _in_prefill(o, at)}
        here_busy = r["replica"] in busy
        other_free = bool(replicas - busy - {r["replica"]})
        cold = mostly_cold(int(r.get("prompt_tokens") or 0), int(r.get("cached_tokens") or 0))
        if cold and not here_busy:
            kinds[KINDS[0]] += 1
        elif here_busy and other_free:
            kinds[KINDS[1] if cold else KINDS[3]] += 1
        elif cold:
            kinds[KINDS[2]] += 1
        else:
            kinds[KINDS[4]] += 1
    return p95, kinds


def rows(report: Mapping[str, Any], share: float) -> list[tuple[str, ...]]:
    out = []
    for run in report.get("runs", []):
        summary = run.get("summary", {})
        p95, kinds = tail_kinds(run.get("requests", []), share)
        if not kinds:
            continue
        label = f"{summary.get('target', '?')} @ {summary.get('rate', float('nan')):.2f}/s"
        out.append((label, f"{p95:.0f}", str(sum(kinds.values())), *(str(kinds[k]) for k in KINDS)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("report", type=Path, help="a workload report's JSON (.json or .json.gz)")
    parser.add_argument("--share", type=float, default=0.9, help="the tail: TTFT >= SHARE x p95")
    parser.add_argument("--markdown", action="store_true", help="a markdown table instead of text")
    args = parser.parse_args(argv)
    table = rows(load(args.report), args.share)
    if not table:
        print("no run's requests name their replica", file=sys.stderr)
        return 1
    print(render(COLUMNS, table, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
