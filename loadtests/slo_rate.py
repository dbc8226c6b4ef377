"""The highest rate each target keeps TTFT p95 within an objective, over several workload reports.

    python loadtests/slo_rate.py REPORT.json[.gz] ... [--objective-ms 1000] [--target burstsched:cost]
        [--rule every|median] [--markdown]

Every run of every report is a point (target, rate, p95, failures). A target's **sustained** rate is the
highest rate at which it and every point of it at a lower rate held the objective (p95 at most
``--objective-ms``, nothing failed or refused); its **first miss** is the lowest rate at which a point
missed. Its limit lies between the two, so ``--target``'s sustained rate over a peer's first miss is a
lower bound on how many times the peer's rate it sustains (``burstsched/workloads/slo_rate.py``). With
several runs of a target at one rate, ``--rule every`` (the default) counts the rate held only if every run
held; ``--rule median`` if the median of their p95s is within the objective (a failed run: infinite).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import math
from collections.abc import Sequence

from burstsched.workloads.report_page import num
from burstsched.workloads.report_page import table as render
from burstsched.workloads.slo_rate import grid, limits, lower_bound_ratio, points
from loadtests.ttft_predictions import load, report_name


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("reports", type=Path, nargs="+", help="workload reports' JSON (.json or .json.gz)")
    parser.add_argument("--objective-ms", type=float, default=1000.0, help="the TTFT p95 objective")
    parser.add_argument(
        "--target", default="burstsched:cost", help="the target whose limit is compared with every other's"
    )
    parser.add_argument(
        "--rule",
        choices=("every", "median"),
        default="every",
        help="several runs at one rate: held if every run held, or if their median p95 did",
    )
    parser.add_argument("--markdown", action="store_true", help="markdown tables instead of text")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.reports if not path.is_file()]
    if missing:
        parser.error(f"no such report: {', '.join(missing)}")
    every = [p for path in args.reports for p in points(load(path), report_name(path))]
    if not every:
        print("no run in these reports", file=sys.stderr)
        return 1
    header, rows = grid(every, args.objective_ms)
    print(render(header, rows, markdown=args.markdown))
    found = limits(every, args.objective_ms, args.rule)
    mine = found.get(args.target)
    summary = []
    for target, limit in sorted(found.items()):
        ratio = math.nan if mine is None or target == args.target else lower_bound_ratio(mine, limit)
        summary.append(
            (target, str(limit.points), num(limit.sustained, 2), num(limit.first_miss, 2), num(ratio, 2))
        )
    print()
    ratio_column = f"{args.target} sustained / its first miss"
    columns = ("target", "points", "sustained r/s", "first miss r/s", ratio_column)
    print(render(columns, summary, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
