"""``burstsched check``: validate configuration files offline.

Each file is parsed (burstsched's format or llm-d's ``EndpointPickerConfig``) and its plugins are built
through the plugin registry, exactly as ``burstsched serve`` builds them, without starting anything or
touching the network. A valid file prints ``ok`` and a summary of its scheduling profile; an invalid one
prints every issue with its field path. Exit status: 0 when every file is valid, 1 when one is not, 2 for a
usage error (no such file, bad arguments).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from burstsched.config import ConfigError, LoadedConfig, RouterConfig, parse_config_document
from burstsched.framework import PluginContext, PluginRegistry, PluginTypeError
from burstsched.scheduling import Scheduler, build_scheduler

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        action="append",
        required=True,
        metavar="FILE",
        help="a YAML config (burstsched's or llm-d's EndpointPickerConfig); repeat to check several",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="for an llm-d file, also print what each llm-d plugin became (or why it is ignored)",
    )


def run(args: argparse.Namespace) -> int:
    paths: list[Path] = args.config
    return check_files(paths, out=sys.stdout, err=sys.stderr, explain=bool(args.explain))


def check_files(paths: list[Path], *, out: TextIO, err: TextIO, explain: bool = False) -> int:
    """Check each file; print each verdict; the worst exit status."""
    try:
        registry = PluginRegistry.discover()
    except PluginTypeError as exc:
        print(f"burstsched check: {exc}", file=err)
        return EXIT_INVALID
    status = EXIT_OK
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"burstsched check: cannot read {path}: {exc}", file=err)
            status = max(status, EXIT_USAGE)
            continue
        try:
            loaded = parse_config_document(text, source=str(path))
            scheduler = build_scheduler(loaded.config, registry, PluginContext(rng=random.Random(0)))
        except ConfigError as exc:
            print(_invalid(path, exc), file=err)
            status = max(status, EXIT_INVALID)
            continue
        print(summarize(path, loaded, scheduler), file=out)
        if explain and loaded.explain:
            print("  llm-d plugins:", file=out)
            for line in loaded.explain:
                print(f"    {line}", file=out)
    return status


def _invalid(path: Path, error: ConfigError) -> str:
    return "\n".join([f"{path}: invalid", *(f"  {issue}" for issue in error.issues)])


def summarize(path: Path, loaded: LoadedConfig, scheduler: Scheduler) -> str:
    """``PATH: ok (FORMAT)`` and the profile: producers, filters, weighted scorers, picker, admission."""
    config = loaded.config
    specs = {spec.instance_name: spec for spec in config.plugins}
    profile = scheduler.profile
    lines = [f"{path}: ok ({loaded.origin})"]
    lines.append("  producers: " + _names((p.name for p in profile.producers), specs))
    lines.append("  filters:   " + _names((f.name for f in profile.filters), specs))
    scorers = [f"{_plugin(s.scorer.name, specs)} x{s.weight:g}" for s in profile.scorers]
    lines.append("  scorers:   " + (", ".join(scorers) or "none"))
    lines.append("  picker:    " + _plugin(profile.picker.name, specs))
    lines.append("  admission: " + _admission(config))
    lines.append("  queue:     " + _queue(config))
    lines.append("  endpoints: " + _endpoints(config))
    notes = list(loaded.notes)
    precise = any(spec.type == "precise-prefix-producer" for spec in config.plugins)
    if precise and config.tokenizer.source == "none":
        notes.append(
            "a precise prefix producer without a tokenizer: every request is matched by the approximate "
            "index (give --tokenizer to serve)"
        )
    lines += [f"  note: {note}" for note in notes]
    return "\n".join(lines)


def _names(names: Any, specs: Mapping[str, Any]) -> str:
    described = [_plugin(name, specs) for name in names]
    return ", ".join(described) or "none"


def _plugin(name: str, specs: Mapping[str, Any]) -> str:
    """``name`` (``name [type]`` when they differ), with its parameters when it has any."""
    spec = specs.get(name)
    if spec is None:
        return name
    text = name if spec.type == name else f"{name} [{spec.type}]"
    if spec.parameters:
        text += " {" + ", ".join(f"{k}: {_value(v)}" for k, v in spec.parameters.items()) + "}"
    return text


def _value(value: object) -> str:
    """A parameter value as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _admission(config: RouterConfig) -> str:
    admission = config.admission
    if not admission.enabled:
        return "off (each request scheduled as it arrives)"
    return (
        f"burst window {admission.window_ms:g} ms, groups of at least {admission.min_shared_blocks} shared "
        f"blocks, at most {admission.max_per_endpoint} per endpoint"
    )


def _queue(config: RouterConfig) -> str:
    """The router's flow-control queue: off, or when an endpoint has room and how the queue is bounded."""
    flow = config.flow_control
    admitter = flow.admitter
    shed = ""
    if admitter is not None:
        shed = (
            f"; sheddable requests refused with probability min(saturation^{admitter.power:g} x "
            f"{admitter.k:g}, 1) (probabilistic admitter)"
        )
    if not flow.enabled:
        return "off (each request goes to its endpoint at once)" + shed
    room = flow.headroom
    limits = [f"prefill under {room.max_prefill_ms:g} ms", f"KV usage under {room.max_kv_usage:g}"]
    if room.max_waiting is not None:
        limits.append(f"at most {room.max_waiting} waiting")
    if room.max_in_flight is not None:
        limits.append(f"under {room.max_in_flight} in flight")
    bands = ", ".join(
        f"{priority}: {_bound(b.max_requests, b.max_bytes)}" for priority, b in sorted(flow.bands.items())
    )
    return (
        f"on: an endpoint has room with {', '.join(limits)}; fairness {flow.fairness}; ttl {flow.ttl_ms:g} "
        f"ms; {_bound(flow.max_requests, flow.max_bytes)} in all"
        + (f"; bands {bands}" if bands else "")
        + (f"; {flow.ceilings.policy} ceilings per band" if flow.ceilings is not None else "")
        + shed
    )


def _bound(requests: int | None, size: int | None) -> str:
    parts = [f"{requests} requests" if requests is not None else "", f"{size} bytes" if size else ""]
    return ", ".join(p for p in parts if p) or "unbounded"


def _endpoints(config: RouterConfig) -> str:
    selector = config.pool.selector
    if config.endpoints:
        listed = ", ".join(e.endpoint_name for e in config.endpoints)
        return listed + (" (the pool selector is not used: static endpoints)" if selector else "")
    if selector is not None:
        labels = ",".join(f"{k}={v}" for k, v in selector.match_labels.items())
        return (
            f"none listed: Kubernetes discovery of the pods labelled {labels} (the pool selector), port "
            f"{selector.target_port}; --endpoint lists them instead"
        )
    return "none listed: give --endpoint to serve"
