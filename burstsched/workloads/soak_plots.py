"""The soak's plot: the router's RSS, open descriptors, asyncio tasks and event-loop lag p99 over the run.

matplotlib's object API with the Agg canvas (no pyplot, no global backend switch); matplotlib is a dev
extra, so only the load-test scripts import this module.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from burstsched.workloads.soak import SoakResult

MIB = 2**20


def _marks(axes: Axes, result: SoakResult, labelled: bool) -> None:
    for i, kill in enumerate(result.kills):
        label = "kill" if labelled and not i else None
        axes.axvline(kill.killed_at_s, color="tab:red", linestyle=":", linewidth=1, label=label)
    warmup, load_end = ("warm-up end", "load end") if labelled else (None, None)
    axes.axvline(result.settings.warmup, color="grey", linestyle="--", linewidth=1, label=warmup)
    axes.axvline(result.load_s, color="black", linestyle="--", linewidth=1, label=load_end)
    axes.grid(True, alpha=0.3)


def timeline(result: SoakResult, path: Path) -> None:
    """Four stacked panels against seconds since the load began (negative: the idle baseline)."""
    samples = result.samples
    ts = [x.t_s for x in samples]
    figure = Figure(figsize=(10, 10))
    FigureCanvasAgg(figure)
    rss, fds, tasks, lag = figure.subplots(4, 1, sharex=True)
    base = result.baseline

    rss.plot(ts, [x.rss_bytes / MIB for x in samples], color="tab:blue")
    rss.axhline(base.rss_bytes / MIB, color="tab:blue", alpha=0.4, linestyle="-.", label="baseline")
    rss.set_ylabel("RSS (MiB)")

    fds.plot(ts, [x.fds for x in samples], color="tab:green")
    fds.axhline(base.fds, color="tab:green", alpha=0.4, linestyle="-.", label="baseline")
    fds.set_ylabel("open fds")

    tasks.plot(ts, [x.tasks for x in samples], color="tab:purple", label="router tasks")
    tasks.plot(ts, [x.in_flight for x in samples], color="tab:orange", alpha=0.7, label="client in flight")
    tasks.axhline(base.tasks, color="tab:purple", alpha=0.4, linestyle="-.", label="baseline")
    tasks.set_ylabel("asyncio tasks")

    lagged = [(x.t_s, x.lag_p99_s * 1e3) for x in samples if x.lag_p99_s is not None]
    lag.plot([t for t, _ in lagged], [v for _, v in lagged], color="tab:brown")
    lag.set_ylabel(f"lag p99 (ms, per {result.settings.sample_every_s:g} s)")
    lag.set_xlabel("seconds since the load began")

    for axes in (rss, fds, tasks, lag):
        _marks(axes, result, labelled=axes is rss)
    rss.legend(loc="upper left", fontsize="small")
    tasks.legend(loc="upper left", fontsize="small")
    s = result.settings
    figure.suptitle(
        f"burstsched soak: {s.replicas} sim replicas, {result.rate_rps:.1f} req/s, "
        f"kill every {s.kill_every_s:g} s"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
