"""The compose files, Prometheus config and Grafana dashboard, checked by reading them (no Docker here).

Commands must parse with burstsched's own CLI, the router's OTEL variables must turn tracing on towards the
Jaeger service, endpoints and scrape targets must name services of the same file, and every metric the
dashboard queries must be one the router exports.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from burstsched.cli import build_parser
from burstsched.config import TracingConfig, load_config
from burstsched.telemetry import resolve_tracing

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "compose"
GRAFANA = REPO / "deploy" / "grafana"
GOLDEN = Path(__file__).parent / "golden" / "after_events.txt"
RUNTIME_GOLDEN = Path(__file__).parent / "golden" / "runtime.txt"  # event-loop lag, asyncio tasks
# prometheus_client's process collector, on the router's registry with the runtime families
PROCESS_FAMILIES = {"process_resident_memory_bytes", "process_open_fds", "process_max_fds"}


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def _exported_families() -> set[str]:
    names = set()
    for line in (GOLDEN.read_text() + RUNTIME_GOLDEN.read_text()).splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


@pytest.mark.parametrize("name", ["docker-compose.yaml", "docker-compose.gpu.yaml"])
def test_router_service_parses_and_traces_to_jaeger(name: str) -> None:
    services = _load(COMPOSE / name)["services"]
    router = services["burstsched"]
    args = build_parser("serve").parse_args(router["command"])
    assert args.command == "serve" and args.host == "0.0.0.0" and args.port == 8000
    config = load_config(REPO / args.config)
    assert config.tracing == TracingConfig()  # tracing comes from the environment alone
    settings = resolve_tracing(config.tracing, {k: str(v) for k, v in router["environment"].items()})
    assert settings is not None
    assert settings.endpoint == "http://jaeger:4318/v1/traces" and settings.service_name == "burstsched"
    assert "jaeger" in services
    for text in args.endpoint:
        _, _, url = text.partition("=")
        host, port = url.removeprefix("http://").split(":")
        assert host in services and port == "8000", text
    assert set(router["depends_on"]) >= {"jaeger"} | {
        t.partition("=")[2][7:].split(":")[0] for t in args.endpoint
    }


def test_simulated_replicas_parse_with_the_sim_cli() -> None:
    services = _load(COMPOSE / "docker-compose.yaml")["services"]
    sims = [
        s for s in services.values() if isinstance(s.get("command"), list) and s["command"][:1] == ["sim"]
    ]
    assert len(sims) == 2
    for sim in sims:
        args = build_parser("sim").parse_args(sim["command"])
        assert (args.host, args.port, args.served_model_name) == ("0.0.0.0", 8000, "kv-demo")


def test_jaeger_receives_otlp_http_on_all_interfaces() -> None:
    for name in ("docker-compose.yaml", "docker-compose.gpu.yaml"):
        jaeger = _load(COMPOSE / name)["services"]["jaeger"]
        assert "receivers.otlp.protocols.http.endpoint=0.0.0.0:4318" in jaeger["command"]
        assert any(str(p).startswith("16686:") for p in jaeger["ports"])


def test_gpu_replicas_send_their_spans_to_jaeger() -> None:
    services = _load(COMPOSE / "docker-compose.gpu.yaml")["services"]
    for name in ("vllm-0", "vllm-1"):
        command = services[name]["command"]
        assert command[command.index("--otlp-traces-endpoint") + 1] == "grpc://jaeger:4317"
        assert "--enable-prefix-caching" in command


def test_prometheus_scrapes_compose_services() -> None:
    services = _load(COMPOSE / "docker-compose.yaml")["services"]
    prometheus = _load(COMPOSE / "prometheus.yaml")
    targets = [t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert "burstsched:8000" in targets
    assert all(t.split(":")[0] in services for t in targets)


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads((GRAFANA / "burstsched-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    used = {m for e in exprs for m in re.findall(r"\b(?:burstsched|process)_[a-z0-9_]+", e)}
    exported = _exported_families() | PROCESS_FAMILIES
    assert used <= exported, sorted(used - exported)
    wanted = {
        "burstsched_requests_total",
        "burstsched_time_to_first_token_seconds_bucket",
        "burstsched_e2e_request_latency_seconds_bucket",
        "burstsched_admission_wait_seconds_bucket",
        "burstsched_admission_group_size_bucket",
        "burstsched_plugin_duration_seconds_bucket",
        "burstsched_endpoint_healthy",
        "burstsched_endpoint_stale",
        "burstsched_prefix_index_blocks",
        "burstsched_prefix_estimated_hit_ratio_sum",
        "burstsched_event_loop_lag_seconds_bucket",
        "burstsched_asyncio_tasks",
        "process_resident_memory_bytes",
        "process_open_fds",
    }
    assert wanted <= used, sorted(wanted - used)
    assert not any("vllm:" in e for e in exprs)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_grafana_provisioning_points_at_the_dashboard_mount() -> None:
    provider = _load(GRAFANA / "provisioning" / "dashboards" / "burstsched.yaml")["providers"][0]
    grafana = _load(COMPOSE / "docker-compose.yaml")["services"]["grafana"]
    mounts = [v.split(":")[1] for v in grafana["volumes"]]
    assert any(m.startswith(provider["options"]["path"]) for m in mounts)
    assert all((COMPOSE / v.split(":")[0]).resolve().exists() for v in grafana["volumes"])
