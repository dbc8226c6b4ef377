"""The simulator's settings: one dataclass, one field per ``burstsched sim`` flag, same defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from burstsched.sim.cost_model import CostModel

KVEventEncoding = Literal["map", "array"]

DEFAULT_MAX_MODEL_LEN = 16384
VLLM_VERSION = "0.32.0"


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated replica. Defaults are the CLI defaults.

    ``name`` None lets a pool name its replicas ``sim-0``, ``sim-1``…; ``port`` 0 picks a free port.
    ``max_model_len`` None means ``min(16384, usable KV capacity in tokens)``.
    ``kv_events_endpoint`` None disables KV events; ``tcp://127.0.0.1:*`` binds a free port, and an address
    without a wildcard is connected to (a router's central socket), as vLLM does. ``kv_events_topic`` may
    say ``{host}``, ``{port}`` and ``{model}`` (the replica's own, filled in once its port is bound).
    ``max_waiting_requests`` 0 means no limit (vLLM has none); past the limit requests get 429.
    ``default_output_tokens``: how many tokens a request without ``max_tokens`` generates before it
    stops (``finish_reason`` "stop"), standing in for a model's end-of-sequence token.
    ``enable_prompt_tokens_details``: vLLM's ``--enable-prompt-tokens-details`` (usage carries
    ``prompt_tokens_details.cached_tokens``). On by default, unlike vLLM's flag: it is the real-vLLM
    launcher's default, as burstsched's tests and workloads run vLLM with ``--enable-prompt-tokens-details``.
    ``lora_modules``: the LoRA adapters served besides the base model (vLLM's ``--lora-modules``, names only:
    the simulator loads no weights); a request names one as its ``model``. At most ``max_loras`` adapters
    run at once (vLLM's ``--max-loras``); ``/metrics`` then has ``vllm:lora_requests_info``.
    """

    name: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    served_model_name: str = "kv-demo"
    block_size: int = 16
    num_gpu_blocks: int = 1365
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    max_waiting_requests: int = 0
    time_scale: float = 1.0
    tokenizer: str | None = None
    kv_events_endpoint: str | None = None
    kv_events_topic: str = ""
    kv_events_replay_endpoint: str | None = None
    kv_events_encoding: KVEventEncoding = "map"
    seed: int = 0
    default_output_tokens: int = 64
    enable_prompt_tokens_details: bool = True
    lora_modules: tuple[str, ...] = ()
    max_loras: int = 1
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    """vLLM's ``--scheduling-policy``: ``priority`` serves lower ``priority`` values first."""
    cost: CostModel = field(default_factory=CostModel)

    def __post_init__(self) -> None:
        positive = ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be >= 2 (block 0 is vLLM's reserved null block)")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError("max_model_len must be >= 1")
        if self.max_model_len is not None and self.max_model_len > self.capacity_tokens:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the KV cache capacity of {self.capacity_tokens} "
                f"tokens ({self.num_gpu_blocks} blocks of {self.block_size}, one reserved)"
            )
        if self.max_waiting_requests < 0:
            raise ValueError("max_waiting_requests must be >= 0")
        if self.time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        if self.kv_events_encoding not in ("map", "array"):
            raise ValueError("kv_events_encoding must be 'map' or 'array'")
        if self.max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if self.served_model_name in self.lora_modules:
            raise ValueError("a LoRA adapter cannot have the served model's name")
        if self.default_output_tokens < 1:
            raise ValueError("default_output_tokens must be >= 1")
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be in 0..65535")

    @property
    def capacity_tokens(self) -> int:
        """Tokens the KV cache holds: usable blocks (the null block excluded) times the block size."""
        return (self.num_gpu_blocks - 1) * self.block_size

    @property
    def effective_max_model_len(self) -> int:
        """The longest prompt plus output a request may have."""
        if self.max_model_len is not None:
            return self.max_model_len
        return min(DEFAULT_MAX_MODEL_LEN, self.capacity_tokens)
