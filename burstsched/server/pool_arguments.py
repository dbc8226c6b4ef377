"""The command-line arguments that say which pool a router schedules for, shared by ``burstsched serve`` and
``burstsched epp``: the config file and its overrides (``--config``, ``--endpoint``, ``--kv-events``,
``--kv-events-replay``, ``--tokenizer``), and how they are read into a :class:`RouterConfig`.

Both commands assemble the same router, so they must read the same config the same way: one definition keeps
an argument added for one from being forgotten by the other (and keeps ``serve``'s workers, which get these
arguments passed on, in step with them through :func:`pool_argv`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from burstsched.config import RouterConfig
from burstsched.front.live_config import ConfigSource
from burstsched.server.reload import config_source

DEFAULT_CONFIG = Path("config") / "default.yaml"


def add_pool_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config``, ``--endpoint``, ``--kv-events``, ``--kv-events-replay`` and ``--tokenizer``."""
    parser.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, help="YAML config (default: %(default)s)"
    )
    parser.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="a replica's base URL, optionally named; repeat for each; replaces the config's endpoints",
    )
    parser.add_argument(
        "--kv-events",
        action="append",
        default=[],
        metavar="NAME=ADDRESS",
        help="where endpoint NAME publishes its KV-cache events (ZMQ, e.g. tcp://10.0.0.5:5557); repeat for "
        "each; used by the precise prefix producer",
    )
    parser.add_argument(
        "--kv-events-replay",
        action="append",
        default=[],
        metavar="NAME=ADDRESS",
        help="endpoint NAME's KV-event replay socket (ZMQ ROUTER, e.g. tcp://10.0.0.5:5558); repeat for each",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="PATH|remote",
        help="how the precise prefix producer gets prompts' token ids: the model's tokenizer folder (or "
        "tokenizer.json), or 'remote' (a replica's POST /tokenize); replaces the config's tokenizer section",
    )


def pool_config_source(args: argparse.Namespace) -> ConfigSource:
    """How the config is read, now and on each reload: the file, then the command line's overrides."""
    return config_source(
        args.config,
        endpoints=args.endpoint,
        kv_events=args.kv_events,
        kv_events_replay=args.kv_events_replay,
        tokenizer=args.tokenizer,
    )


def load_router_config(args: argparse.Namespace) -> RouterConfig:
    """The config the arguments name, read once (raises :class:`~burstsched.config.ConfigError`)."""
    return pool_config_source(args)()


def lacks_endpoints(config: RouterConfig) -> bool:
    """Whether the config leaves the pool without any source of endpoints (none listed, static discovery,
    no pool selector): the commands refuse to start so."""
    return not config.endpoints and config.discovery.kind == "static" and config.pool.selector is None


def pool_argv(args: argparse.Namespace) -> list[str]:
    """These arguments as a command line, to start another process on the same pool (``serve``'s workers)."""
    argv = ["--config", str(args.config)]
    for flag, values in (
        ("--endpoint", args.endpoint),
        ("--kv-events", args.kv_events),
        ("--kv-events-replay", args.kv_events_replay),
    ):
        for value in values:
            argv += [flag, value]
    if args.tokenizer is not None:
        argv += ["--tokenizer", args.tokenizer]
    return argv
