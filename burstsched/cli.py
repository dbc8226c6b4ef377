"""The ``burstsched`` command.

Each subcommand lives in its own module, which exposes ``add_arguments(parser)`` and
``run(args) -> int``; the table below names them, and a module is imported only when its
subcommand runs, so ``burstsched sim`` never pays for the router's imports.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from typing import Protocol

from burstsched import __version__


class Subcommand(Protocol):
    """What a subcommand module provides."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("burstsched.sim.cli", "run one simulated vLLM replica"),
    "serve": ("burstsched.server.serve", "run the scheduler in front of a vLLM pool"),
    "epp": ("burstsched.epp.cli", "run the scheduler as a gateway's endpoint picker (Envoy ext_proc)"),
    "demo": ("burstsched.workloads.demo", "run the seed experiment on a 2-replica pool and print its table"),
    "check": ("burstsched.server.check", "validate config files offline (burstsched's or llm-d's)"),
    "config": (
        "burstsched.server.config_show",
        "config show: the effective config, defaults filled in, and origins",
    ),
    "replay": ("burstsched.replay.cli", "replay a recorded trace on a simulated pool through router configs"),
}


def _load(module_name: str) -> Subcommand:
    module: Subcommand = importlib.import_module(module_name)
    return module


def build_parser(selected: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="burstsched", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"burstsched {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == selected:
            _load(module_name).add_arguments(sub_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    args_list = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in args_list if a in SUBCOMMANDS), None)
    args = build_parser(selected).parse_args(args_list)
    module_name, _ = SUBCOMMANDS[args.command]
    return _load(module_name).run(args)
