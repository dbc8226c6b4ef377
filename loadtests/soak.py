"""Soak: burstsched under a long, steady load on simulated replicas with faults, watching the router's health.

    python loadtests/soak.py [--duration 1200] [--warmup S] [--replicas 3] [--time-scale 1.0]
        [--kill-every 60] [--down 5] [--load 0.8] [--capacity RPS] [--stream-share 0.7]
        [--disconnect 0.02] [--malformed 0.02] [--config config/default.yaml] [--seed 0]
        [--out-dir loadtests/reports] [--name soak-sim]

The replicas are ``burstsched sim`` processes and the router a ``burstsched serve`` process, each on a free
127.0.0.1 port. The load is Poisson arrivals at ``--load`` times the pool's capacity (its cold capacity,
measured first as docqa.py does, unless ``--capacity`` gives it): chat requests sharing a few long contexts,
streamed or not; some streams are closed by the client after a few chunks, some requests are malformed (bad
JSON, no messages, unknown model, a field the replica refuses, oversize bodies declared and chunked).
Every ``--kill-every`` seconds the next replica gets SIGKILL and is restarted on its port ``--down`` seconds
later. The router process is sampled every ``--sample-every`` seconds: RSS and open file descriptors from
/proc/PID, asyncio tasks and event-loop lag from its /metrics.

Every request's outcome is classified (burstsched/workloads/soak_client.py): completed, error status with an
OpenAI error body, stream ended by an error event and [DONE], cancelled by the client, rejected (malformed,
4xx), or LOST / wrong shape. The verdicts (burstsched/workloads/soak_report.py): no lost request, every cut
stream ended by an error event, RSS growth after warm-up at most 5%, file descriptors and tasks back to
their idle baseline after the load, every kill made; the event-loop lag p99 is reported.

The router runs the given config with ``limits.max_body_bytes`` replaced (``--max-body-bytes``, 64 KiB): the
oversize requests stay small, and a declared body larger than the socket buffers is not what this run is
about (the router answers 413 before reading it and closes; measured with a 4 MiB limit, the client saw a
connection reset instead of the 413 for 40 of 40 such requests).

Output: a progress line every 10 s, the verdict lines at the end, and under ``--out-dir`` ``<name>.md``,
``<name>.json`` (every sample and every problem request) and ``<name>.png`` (RSS, fds, tasks, lag p99 over
time). Exit status 0 when every verdict passes. Bounded: it ends by itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import tempfile
from collections.abc import Sequence

import anyio

from burstsched.workloads.soak import SoakResult, SoakSettings, run_soak
from burstsched.workloads.soak_load import Mix
from burstsched.workloads.soak_report import dumps, markdown, passed, verdicts


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1200.0, help="seconds of load (default 1200)")
    parser.add_argument(
        "--warmup", type=float, default=None, help="default: a tenth of the run, at most 120 s"
    )
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator speed (1.0: like vLLM)")
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds between replica kills")
    parser.add_argument("--down", type=float, default=5.0, help="seconds a killed replica stays down")
    parser.add_argument("--load", type=float, default=0.8, help="fraction of the capacity (default 0.8)")
    parser.add_argument("--capacity", type=float, default=None, help="req/s; default: measure it cold")
    parser.add_argument("--stream-share", type=float, default=0.7)
    parser.add_argument("--disconnect", type=float, default=0.02, help="share of streams the client cuts")
    parser.add_argument("--malformed", type=float, default=0.02, help="share of malformed requests")
    parser.add_argument("--sample-every", type=float, default=2.0, help="seconds between router readings")
    parser.add_argument("--settle-timeout", type=float, default=60.0)
    parser.add_argument("--config", type=Path, default=Path("config") / "default.yaml")
    parser.add_argument("--max-body-bytes", type=int, default=65536, help="the router's body limit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=Path("loadtests") / "reports")
    parser.add_argument("--name", default="soak-sim", help="report file names (default soak-sim)")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> SoakSettings:
    mix = Mix(
        stream_share=args.stream_share,
        disconnect_share=args.disconnect,
        malformed_share=args.malformed,
    )
    return SoakSettings(
        duration_s=args.duration,
        warmup_s=args.warmup,
        replicas=args.replicas,
        time_scale=args.time_scale,
        kill_every_s=args.kill_every,
        down_s=args.down,
        load=args.load,
        capacity_rps=args.capacity,
        mix=mix,
        sample_every_s=args.sample_every,
        settle_timeout_s=args.settle_timeout,
        config=args.config,
        max_body_bytes=args.max_body_bytes,
        seed=args.seed,
    )


def time_bound_s(settings: SoakSettings) -> float:
    """The whole run's limit: capacity, start-up, load, drain and settle, with room to spare."""
    return 300 + 120 + settings.duration_s + settings.request_timeout_s + settings.settle_timeout_s + 60


async def soak(settings: SoakSettings) -> SoakResult:
    with (
        anyio.fail_after(time_bound_s(settings)),
        tempfile.TemporaryDirectory(prefix="burstsched-soak-") as tmp,
    ):
        return await run_soak(settings, Path(tmp), progress=lambda line: print(line, flush=True))


def write_reports(result: SoakResult, out_dir: Path, name: str) -> list[Path]:
    from burstsched.workloads.soak_plots import timeline

    out_dir.mkdir(parents=True, exist_ok=True)
    png, md, js = out_dir / f"{name}.png", out_dir / f"{name}.md", out_dir / f"{name}.json"
    timeline(result, png)
    md.write_text(markdown(result, png.name), encoding="utf-8")
    js.write_text(dumps(result), encoding="utf-8")
    return [md, js, png]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = settings_from(args)
    except ValueError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    result = anyio.run(soak, settings)
    paths = write_reports(result, args.out_dir, args.name)
    print()
    for verdict in verdicts(result):
        print(f"{verdict.mark:4}  {verdict.line}")
    print(f"\n{'PASS' if passed(result) else 'FAIL'}; reports: {', '.join(str(p) for p in paths)}")
    return 0 if passed(result) else 1


if __name__ == "__main__":
    raise SystemExit(main())
