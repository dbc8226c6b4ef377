"""Who a request is for flow control: its priority and its flow, from its headers and API key.

As llm-d's flow control reads them: the priority of the inference objective named in
``x-llm-d-inference-objective`` (``objectives`` in the config, like an InferenceObjective's priority), else
the API key's configured priority, else the default; the flow is ``x-llm-d-inference-fairness-id``, else
the API key (as a short digest, never the key itself), else ``default``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from burstsched.config.flow_control import FlowControlConfig

OBJECTIVE_HEADER = b"x-llm-d-inference-objective"
FAIRNESS_HEADER = b"x-llm-d-inference-fairness-id"
DEFAULT_FLOW = "default"
MAX_FLOW_CHARS = 64


@dataclass(frozen=True, slots=True)
class Identity:
    priority: int
    flow: str

    @property
    def sheddable(self) -> bool:
        """Priority below 0: refused rather than queued while the pool has no room (llm-d's rule)."""
        return self.priority < 0


def identify(headers: Sequence[tuple[bytes, bytes]], config: FlowControlConfig) -> Identity:
    """The request's priority and flow from its (raw ASGI) headers."""
    objective = fairness = key = None
    for name, value in headers:
        lowered = name.lower()
        if lowered == OBJECTIVE_HEADER:
            objective = value.decode("latin-1").strip()
        elif lowered == FAIRNESS_HEADER:
            fairness = value.decode("latin-1").strip()
        elif lowered == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                key = token.strip()
    return Identity(_priority(objective, key, config), _flow(fairness, key))


def _priority(objective: str | None, key: str | None, config: FlowControlConfig) -> int:
    objectives: Mapping[str, int] = config.objectives
    if objective and objective in objectives:
        return objectives[objective]
    if key is not None and key in config.api_key_priorities:
        return config.api_key_priorities[key]
    return config.default_priority


def _flow(fairness: str | None, key: str | None) -> str:
    if fairness:
        return fairness[:MAX_FLOW_CHARS]
    if key is not None:
        return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]
    return DEFAULT_FLOW
