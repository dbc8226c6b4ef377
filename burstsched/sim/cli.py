"""``burstsched sim``: one simulated vLLM replica on a port (vLLM's flag names where vLLM has the flag)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from burstsched.sim.config import SimConfig
from burstsched.sim.cost_model import CostModel
from burstsched.sim.replica import SimReplica, SimStartError

_DEFAULTS = SimConfig()
_COST = CostModel()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    parser.add_argument("--host", default=d.host)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--name", default=None, help="replica name (logs); default sim-PORT")
    parser.add_argument("--served-model-name", default=d.served_model_name)
    parser.add_argument("--block-size", type=int, default=d.block_size)
    parser.add_argument(
        "--num-gpu-blocks",
        "--num-gpu-blocks-override",
        dest="num_gpu_blocks",
        type=int,
        default=d.num_gpu_blocks,
    )
    parser.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    parser.add_argument(
        "--lora-modules",
        nargs="*",
        default=[],
        metavar="NAME[=PATH]",
        help="LoRA adapters served besides the base model (as vLLM's; the path is ignored)",
    )
    parser.add_argument("--max-loras", type=int, default=d.max_loras, help="adapters that may run at once")
    parser.add_argument(
        "--scheduling-policy",
        choices=("fcfs", "priority"),
        default=d.scheduling_policy,
        help="as vLLM's: priority serves requests with a lower `priority` field first",
    )
    parser.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    parser.add_argument("--max-model-len", type=int, default=None, help="default: min(16384, KV capacity)")
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=d.enable_prefix_caching
    )
    parser.add_argument(
        "--max-waiting-requests",
        type=int,
        default=d.max_waiting_requests,
        help="waiting-queue limit past which requests get 429 (0: none, as vLLM)",
    )
    parser.add_argument("--time-scale", type=float, default=d.time_scale, help="multiplies every duration")
    parser.add_argument(
        "--tokenizer", default=None, help="folder with tokenizer.json and tokenizer_config.json"
    )
    parser.add_argument(
        "--kv-events-endpoint",
        default=None,
        help="ZMQ PUB endpoint: tcp://*:5557 binds, tcp://HOST:PORT connects (a router's central socket)",
    )
    parser.add_argument(
        "--kv-events-topic",
        default=d.kv_events_topic,
        help="topic of every message; {host}, {port}, {model} are filled in, e.g. kv@{host}:{port}@{model}",
    )
    parser.add_argument("--kv-events-replay-endpoint", default=None, help="ZMQ ROUTER endpoint for replays")
    parser.add_argument("--kv-events-encoding", choices=("map", "array"), default=d.kv_events_encoding)
    parser.add_argument(
        "--kv-events-config",
        default=None,
        help="vLLM's JSON form: enable_kv_cache_events, endpoint, topic, replay_endpoint",
    )
    parser.add_argument(
        "--enable-prompt-tokens-details",
        action=argparse.BooleanOptionalAction,
        default=d.enable_prompt_tokens_details,
        help="usage carries prompt_tokens_details.cached_tokens (default on, as burstsched runs vLLM)",
    )
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--default-output-tokens", type=int, default=d.default_output_tokens)
    parser.add_argument("--step-overhead-ms", type=float, default=_COST.step_overhead_s * 1e3)
    parser.add_argument("--prefill-us-per-token", type=float, default=_COST.prefill_s_per_token * 1e6)
    parser.add_argument("--decode-us-per-seq", type=float, default=_COST.decode_s_per_seq * 1e6)
    parser.add_argument(
        "--frontend-us-per-token", type=float, default=_COST.frontend_s_per_prompt_token * 1e6
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The :class:`SimConfig` the flags describe (raises ValueError on bad values)."""
    endpoint, topic, replay = args.kv_events_endpoint, args.kv_events_topic, args.kv_events_replay_endpoint
    if args.kv_events_config:
        try:
            kv = json.loads(args.kv_events_config)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-events-config is not JSON: {exc}") from exc
        if not isinstance(kv, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        if kv.get("enable_kv_cache_events"):
            endpoint = kv.get("endpoint", endpoint or "tcp://*:5557")
            topic = kv.get("topic", topic)
            replay = kv.get("replay_endpoint", replay)
    cost = CostModel(
        step_overhead_s=args.step_overhead_ms / 1e3,
        prefill_s_per_token=args.prefill_us_per_token / 1e6,
        decode_s_per_seq=args.decode_us_per_seq / 1e6,
        frontend_s_per_prompt_token=args.frontend_us_per_token / 1e6,
    )
    return SimConfig(
        name=args.name or f"sim-{args.port}",
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        max_num_seqs=args.max_num_seqs,
        lora_modules=tuple(module.partition("=")[0] for module in args.lora_modules),
        max_loras=args.max_loras,
        scheduling_policy=args.scheduling_policy,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        max_waiting_requests=args.max_waiting_requests,
        time_scale=args.time_scale,
        tokenizer=args.tokenizer,
        kv_events_endpoint=endpoint,
        kv_events_topic=topic,
        kv_events_replay_endpoint=replay,
        kv_events_encoding=args.kv_events_encoding,
        seed=args.seed,
        default_output_tokens=args.default_output_tokens,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        cost=cost,
    )


async def _serve(replica: SimReplica) -> None:
    await replica.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"{replica.name}: serving {replica.config.served_model_name} on {replica.url}", flush=True)
    if replica.kv_events_endpoint:
        print(f"{replica.name}: KV events on {replica.kv_events_endpoint}", flush=True)
    waiter = asyncio.create_task(stop.wait())
    closed = asyncio.create_task(replica.wait_closed())
    await asyncio.wait({waiter, closed}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    await replica.stop()
    closed.cancel()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from_args(args)
        replica = SimReplica(config)
    except ValueError as exc:
        print(f"burstsched sim: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(replica))
    except SimStartError as exc:
        print(f"burstsched sim: {exc}", file=sys.stderr)
        return 1
    return 0
