"""One replica's engine and endpoint state, built from its config: shared by every way of serving it."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from burstsched.prefix.kv_events import KVEvent
from burstsched.sim.chat_template import ChatTemplate
from burstsched.sim.clock import Clock
from burstsched.sim.config import SimConfig
from burstsched.sim.cost_model import Jitter
from burstsched.sim.engine import Engine, EngineLimits
from burstsched.sim.faults import FaultState
from burstsched.sim.metrics import SimMetrics
from burstsched.sim.recording import RecordedRequest
from burstsched.sim.server import Client, SimState
from burstsched.sim.tokenizer import Tokenizer, load_tokenizer


@dataclass
class ReplicaParts:
    """What a replica owns from its construction on (before it serves)."""

    config: SimConfig
    tokenizer: Tokenizer
    template: ChatTemplate
    metrics: SimMetrics
    faults: FaultState
    recorded: list[RecordedRequest] | None = field(default=None)

    @classmethod
    def build(cls, config: SimConfig, *, record_requests: bool = False) -> ReplicaParts:
        tokenizer = load_tokenizer(config.tokenizer)
        return cls(
            config=config,
            tokenizer=tokenizer,
            template=ChatTemplate(tokenizer.chat_template, tokenizer.special_tokens_map),
            metrics=SimMetrics(config),
            faults=FaultState(config.seed),
            recorded=[] if record_requests else None,
        )

    def assemble(
        self,
        name: str,
        clock: Clock,
        *,
        event_sink: Callable[[list[KVEvent]], None] | None = None,
        drop_connection: Callable[[Client | None], None] | None = None,
    ) -> SimState:
        """The engine (not yet running: start ``state.engine.run()``) and the endpoints' state around it."""
        cfg = self.config
        limits = EngineLimits(
            block_size=cfg.block_size,
            num_gpu_blocks=cfg.num_gpu_blocks,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_waiting_requests=cfg.max_waiting_requests,
            enable_prefix_caching=cfg.enable_prefix_caching,
            max_loras=cfg.max_loras if cfg.lora_modules else 0,
            scheduling_policy=cfg.scheduling_policy,
        )
        engine = Engine(
            limits,
            cfg.cost,
            clock=clock,
            time_scale=cfg.time_scale,
            seed=cfg.seed,
            stats=self.metrics,
            event_sink=event_sink,
        )
        state = SimState(
            config=cfg,
            name=name,
            engine=engine,
            tokenizer=self.tokenizer,
            template=self.template,
            metrics=self.metrics,
            faults=self.faults,
            clock=clock,
            vocab=self.tokenizer.output_vocabulary(),
            rng=random.Random(f"requests:{cfg.seed}"),
            jitter=Jitter(
                cfg.cost.jitter, random.Random(f"jitter:{cfg.seed}:{name}")
            ),  # own draws per replica
            created=int(time.time()),
            recorded=self.recorded,
        )
        if drop_connection is not None:
            state.drop_connection = drop_connection
        return state
