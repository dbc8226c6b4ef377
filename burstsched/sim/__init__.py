"""A simulator of vLLM (v1 engine, 0.32) as a scheduler sees it: API, prefix cache, metrics, KV events.

Run one replica with ``burstsched sim``; start several in-process with :class:`SimPool`.
See ``burstsched/sim/README.md`` for the model and its calibration.
"""

from burstsched.sim.config import SimConfig
from burstsched.sim.cost_model import CostModel
from burstsched.sim.faults import Faults
from burstsched.sim.pool import SimPool, SimStopError
from burstsched.sim.recording import RecordedRequest
from burstsched.sim.replica import SimReplica, SimStartError

__all__ = [
    "CostModel",
    "Faults",
    "RecordedRequest",
    "SimConfig",
    "SimPool",
    "SimReplica",
    "SimStartError",
    "SimStopError",
]
