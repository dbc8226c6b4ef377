"""The targets a workload load test runs through, and running one with a progress line and retries.

Shared by the workload scripts (``loadtests/docqa.py``, ``loadtests/tenants.py``): burstsched configs
(one router, or N routers over the same replicas), client-side random routing and the peer routers
(sglang-router, vllm-router) from ``loadtests/peers``, skipped with a reason when they cannot run here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from burstsched.workloads.open_loop import Progress, ProgressSink, R
from burstsched.workloads.router_fleet import burstsched_fleet_target
from burstsched.workloads.router_process import RouterStartError
from burstsched.workloads.run_summary import RunSummary, TargetRun, as_repeat
from burstsched.workloads.targets import ClientRandomTarget, Target, TargetSpec, burstsched_target
from loadtests.peers import PEERS, PeerUnavailable, PeerVenvError, ensure_venv, peer_target, venv_ready


def add_run_arguments(parser: argparse.ArgumentParser, default_targets: str) -> None:
    """``--targets`` and the options of :func:`run_with_retries` and the drain."""
    parser.add_argument("--targets", default=default_targets)
    parser.add_argument("--drain-timeout", type=float, default=120.0)
    parser.add_argument(
        "--max-send-lag-ms", type=float, default=250.0, help="repeat a run sent later than this"
    )
    parser.add_argument("--retries", type=int, default=1, help="repeats of a run whose send lag was too high")
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=1,
        help="passes over the targets at each rate, every other one in reverse order (A B, B A, ...), so a "
        "drift of the machine's speed over the run weighs on every target alike",
    )


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


T = TypeVar("T")


def passes(targets: Sequence[T], repeats: int) -> list[tuple[int, T]]:
    """The runs at one rate, in order: (pass from 1, target), each pass after the first in the order
    reverse to the one before it."""
    order: list[tuple[int, T]] = []
    for repeat in range(1, repeats + 1):
        ordered = targets if repeat % 2 else list(reversed(targets))
        order.extend((repeat, target) for target in ordered)
    return order


RunOne = Callable[[Target], Awaitable[tuple[TargetRun[R], list[float]]]]
"""Runs one target at the rate at hand: its run, with every attempt's send lag p99."""


async def run_passes(
    targets: Sequence[Target], repeats: int, skipped: dict[str, str], run_one: RunOne[R]
) -> list[tuple[TargetRun[R], list[float]]]:
    """Every target's runs at one rate, in :func:`passes` order, each marked with its pass. A target that
    cannot run (a peer not installed, a router that does not start) goes into ``skipped`` with its reason
    and is passed over from then on, at this rate and the next."""
    out: list[tuple[TargetRun[R], list[float]]] = []
    for repeat, target in passes(targets, repeats):
        if target.label in skipped:
            continue
        try:
            run, lags = await run_one(target)
        except (PeerUnavailable, RouterStartError) as exc:
            print(f"\nskipping {target.label}: {exc}", file=sys.stderr)
            skipped[target.label] = reason(exc)
            continue
        out.append((as_repeat(run, repeat), lags))
    return out


def passes_note(repeats: int) -> str:
    """The report's setup line for ``--repeats``."""
    return (
        f"{repeats} over the targets at each rate, every other one in reverse order; a target's later "
        "passes are rows labelled #2, #3, ... (the JSON's `repeat`)"
    )


def build_targets(
    specs: Sequence[TargetSpec],
    seed: int,
    router_args: Sequence[str] = (),
    router_counts: Sequence[int] = (1,),
    *,
    build_peer_venvs: bool = True,
) -> tuple[list[Target], dict[str, str]]:
    """Targets to run, and those skipped with the reason (a peer whose venv cannot be built, or, with
    ``build_peer_venvs`` false, is not built yet)."""
    targets: list[Target] = []
    skipped: dict[str, str] = {}
    for spec in specs:
        if spec.kind == "burstsched":
            config = Path(spec.option or "config/default.yaml")
            if not config.is_file():
                raise SystemExit(f"target {spec.label}: no config file {config}")
            for count in router_counts:
                if count == 1:
                    targets.append(burstsched_target(config, extra_args=router_args))
                else:
                    targets.append(burstsched_fleet_target(config, count, extra_args=router_args))
        elif spec.kind == "random":
            targets.append(ClientRandomTarget(seed))
        elif spec.kind in PEERS:
            package = PEERS[spec.kind].package
            try:
                if not build_peer_venvs and not venv_ready(package):
                    raise PeerUnavailable(
                        f"no venv for {package.requirement} (build it with `python -m loadtests.peers`)"
                    )
                ensure_venv(package)
                targets.append(peer_target(spec.kind, spec.option or "cache_aware"))
            except (PeerVenvError, PeerUnavailable) as exc:
                skipped[spec.label] = reason(exc)
                print(f"skipping {spec.label}: {exc}", file=sys.stderr)
        else:
            known = ", ".join(["burstsched", "random", *PEERS])
            raise SystemExit(f"unknown target kind {spec.kind!r} (known: {known})")
    return targets, skipped


def reason(exc: BaseException) -> str:
    """An exception as one line: its first line and, for a log tail, the tail's last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"


def progress_line(label: str, rate: float) -> ProgressSink:
    """One stderr line, rewritten in place, per target and rate."""

    def show(p: Progress) -> None:
        print(
            f"\r{label} @ {rate:.2f}/s: sent {p.sent}/{p.total}, done {p.done}, failed {p.failed}, "
            f"{p.elapsed_s:.0f} s   ",
            end="",
            file=sys.stderr,
            flush=True,
        )

    return show


async def run_with_retries(
    attempt: Callable[[], Awaitable[TargetRun[R]]],
    row: Callable[[RunSummary], str],
    label: str,
    args: argparse.Namespace,
) -> tuple[TargetRun[R], list[float]]:
    """Run one target; run it again (up to ``--retries`` times) while the load generator itself was late
    (send lag p99 over ``--max-send-lag-ms``: on a shared machine, the client was starved of CPU, so the
    arrivals were not the sequence's). Returns the last run and every attempt's send lag p99."""
    lags: list[float] = []
    while True:
        run = await attempt()
        lags.append(run.summary.send_lag_p99_ms)
        print(file=sys.stderr)
        print(row(run.summary), file=sys.stderr)
        if lags[-1] <= args.max_send_lag_ms or len(lags) > args.retries:
            return run, lags
        print(
            f"{label}: send lag p99 {lags[-1]:.0f} ms > {args.max_send_lag_ms:.0f} ms: again",
            file=sys.stderr,
        )
