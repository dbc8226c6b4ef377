"""Peer routers for benchmarks: sglang-router and vllm-router, each pinned in its own cached venv.

    python -m loadtests.peers            # build (or reuse) both venvs; prints each one's state

``ensure_venv`` builds a peer's venv under ``<cache>/peers/<name>-<version>/`` once (a stamp file marks it
complete); ``peer_target("sglang", "cache_aware")`` is a workload target that starts the router in front of
given replicas and stops it afterwards. Nothing here is needed by the test suite.
"""

from loadtests.peers.routers import (
    PEERS,
    SGLANG,
    VLLM_ROUTER_PEER,
    PeerRouter,
    PeerUnavailable,
    peer_router,
    peer_router_process,
    peer_target,
    workers_ready,
)
from loadtests.peers.venvs import (
    SGLANG_ROUTER,
    VLLM_ROUTER,
    PeerPackage,
    PeerVenvError,
    ensure_venv,
    peers_root,
    venv_dir,
    venv_ready,
)

__all__ = [
    "PEERS",
    "SGLANG",
    "SGLANG_ROUTER",
    "VLLM_ROUTER",
    "VLLM_ROUTER_PEER",
    "PeerPackage",
    "PeerRouter",
    "PeerUnavailable",
    "PeerVenvError",
    "ensure_venv",
    "peer_router",
    "peer_router_process",
    "peer_target",
    "peers_root",
    "venv_dir",
    "venv_ready",
    "workers_ready",
]
