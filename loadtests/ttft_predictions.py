"""Predicted against actual time to first token, per request, from a workload report's JSON.

    python loadtests/ttft_predictions.py loadtests/reports/<run>.json[.gz] [--markdown]

burstsched's responses carry ``x-burstsched-predicted-ttft-ms`` once their replica's TTFT is fitted
(``burstsched/pool/ttft_fit.py``); ``loadtests/docqa.py`` and ``loadtests/tenants.py`` keep every
``x-burstsched-*`` header of every request. For each run with predictions this prints, for all requests
and split into warm (at least half the prompt served from the replica's cache, by the response's usage)
and cold: how many, the actual and predicted medians, the mean error (bias: negative is an
under-prediction), the mean absolute error, and the relative error's median and 90th percentile. The
actual TTFT is the client's (sending to the first token), the prediction the router's (dispatch to the
first chunk), so the router's own time is in the bias.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from burstsched.workloads.report_page import table as render
from burstsched.workloads.stats import mostly_cold

HEADER = "x-burstsched-predicted-ttft-ms"
COLUMNS = (
    "run",
    "requests",
    "n",
    "actual p50 ms",
    "predicted p50 ms",
    "bias ms",
    "MAE ms",
    "abs. rel. error p50 / p90",
)


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def report_name(path: Path) -> str:
    """A report's file name without ``.json`` or ``.json.gz``."""
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


def pairs(requests: Iterable[Mapping[str, Any]]) -> list[tuple[float, float, bool]]:
    """(predicted ms, actual ms, warm) of each request that carried a prediction and has a TTFT."""
    out = []
    for r in requests:
        headers = r.get("headers") or {}
        if HEADER not in headers or r.get("ttft_ms") is None:
            continue
        prompt, cached = r.get("prompt_tokens") or 0, r.get("cached_tokens") or 0
        warm = prompt > 0 and not mostly_cold(prompt, cached)
        out.append((float(headers[HEADER]), float(r["ttft_ms"]), warm))
    return out


def _quantile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def row(label: str, selected: Sequence[tuple[float, float, bool]], requests: int) -> tuple[str, ...]:
    errors = [p - a for p, a, _ in selected]
    relative = [abs(p - a) / a for p, a, _ in selected if a > 0]
    return (
        label,
        str(requests),
        str(len(selected)),
        f"{_quantile([a for _, a, _ in selected], 0.5):.0f}",
        f"{_quantile([p for p, _, _ in selected], 0.5):.0f}",
        f"{statistics.fmean(errors):+.0f}",
        f"{statistics.fmean(abs(e) for e in errors):.0f}",
        f"{_quantile(relative, 0.5):.2f} / {_quantile(relative, 0.9):.2f}" if relative else "-",
    )


def rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    out = []
    for run in report.get("runs", []):
        summary = run.get("summary", {})
        label = f"{summary.get('target', '?')} @ {summary.get('rate', float('nan')):.2f}/s"
        requests = run.get("requests", [])
        found = pairs(requests)
        if not found:
            continue
        for kind, selected in (
            ("all", found),
            ("warm", [p for p in found if p[2]]),
            ("cold", [p for p in found if not p[2]]),
        ):
            if selected:
                out.append(row(f"{label} {kind}", selected, len(requests)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("report", type=Path, help="a workload report's JSON (.json or .json.gz)")
    parser.add_argument("--markdown", action="store_true", help="a markdown table instead of text")
    args = parser.parse_args(argv)
    table = rows(load(args.report))
    if not table:
        print("no request carried x-burstsched-predicted-ttft-ms", file=sys.stderr)
        return 1
    print(render(COLUMNS, table, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
