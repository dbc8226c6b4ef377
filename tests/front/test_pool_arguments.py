"""``burstsched serve`` and ``burstsched epp`` read the pool's arguments with one definition: the same
command line gives both the same config, and ``serve``'s workers are passed on all of them."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from burstsched.epp import cli as epp_cli
from burstsched.server import serve
from burstsched.server.pool_arguments import load_router_config, pool_argv

ARGS = [
    "--endpoint",
    "a=http://127.0.0.1:8001",
    "--endpoint",
    "b=http://127.0.0.1:8002",
    "--kv-events",
    "a=tcp://127.0.0.1:5557",
    "--kv-events-replay",
    "a=tcp://127.0.0.1:5558",
    "--tokenizer",
    "remote",
]


def _parse(add_arguments: Callable[[argparse.ArgumentParser], None], argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_both_commands_read_the_same_config() -> None:
    served = load_router_config(_parse(serve.add_arguments, ARGS))
    picked = load_router_config(_parse(epp_cli.add_arguments, ARGS))
    assert served == picked
    assert [e.name for e in served.endpoints] == ["a", "b"]
    assert served.tokenizer.source == "remote"


def test_the_arguments_passed_on_give_the_same_config() -> None:
    args = _parse(serve.add_arguments, ARGS)
    again = _parse(serve.add_arguments, pool_argv(args))
    assert load_router_config(again) == load_router_config(args)
