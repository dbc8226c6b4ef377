"""The Helm chart in deploy/helm/burstsched, rendered by Helm and checked against the Kubernetes schemas.

Helm's own engine renders the chart (helm-python-sdk binds Helm's Go SDK; no ``helm`` binary), once per
variant: the chart's defaults and each ``ci/*-values.yaml``. Every object is validated against the
Kubernetes OpenAPI schemas of one pinned version (kubernetes-validate, strict: unknown fields fail).
kubernetes-validate does not know the Prometheus Operator's ServiceMonitor, so its fields are checked against
SERVICE_MONITOR_SCHEMA below, written from the monitoring.coreos.com/v1 CRD for the fields the chart uses.
Then the objects must fit together: the config parses with burstsched's own loader, selectors select the
router's pods, the autoscaler's metric is one prometheus-adapter derives from a metric the router exports,
and the vLLM side (deploy/kubernetes/vllm.yaml) serves what the router expects.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from burstsched.cli import build_parser
from burstsched.config import RouterConfig, parse_config_text

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "burstsched"
ADAPTER_VALUES = REPO / "deploy" / "helm" / "prometheus-adapter-values.yaml"
VLLM = REPO / "deploy" / "kubernetes" / "vllm.yaml"
GOLDEN = REPO / "tests" / "observability" / "golden" / "after_events.txt"

KUBE_VERSION = "1.33.0"
RELEASE = "bs"
NAMESPACE = "serving"
VARIANTS = ("default", "sim", "production")
ROUTER_KINDS = {
    "ConfigMap",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Role",
    "RoleBinding",
}

Obj = dict[str, Any]

_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
             r"(([0-9]+)s)?(([0-9]+)ms)?)$"}  # fmt: skip
_SECRET_KEY = {
    "type": "object",
    "required": ["key"],
    "properties": {"key": {"type": "string"}, "name": {"type": "string"}, "optional": {"type": "boolean"}},
    "additionalProperties": False,
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
    "additionalProperties": False,
}
SERVICE_MONITOR_SCHEMA: Obj = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                    "additionalProperties": False,
                },
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer", "minimum": 0},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["integer", "string"]},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "authorization": {
                                "type": "object",
                                "properties": {"type": {"type": "string"}, "credentials": _SECRET_KEY},
                                "additionalProperties": False,
                            },
                            "relabelings": {"type": "array", "items": {"type": "object"}},
                            "metricRelabelings": {"type": "array", "items": {"type": "object"}},
                        },
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    },
}


def _values(variant: str) -> Obj:
    if variant == "default":
        return {}
    data = yaml.safe_load((CHART / "ci" / f"{variant}-values.yaml").read_text())
    assert isinstance(data, dict)
    return data


@functools.cache
def _rendered(variant: str) -> tuple[Obj, ...]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(_values(variant), name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = [
        obj
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj
    ]
    return tuple(objects)


def _objects(variant: str, kind: str) -> list[Obj]:
    return [o for o in _rendered(variant) if o["kind"] == kind]


def _one(variant: str, kind: str, component: str = "router") -> Obj:
    found = [
        o
        for o in _objects(variant, kind)
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component", component) == component
    ]
    assert len(found) == 1, f"{variant}: {len(found)} {kind} objects"
    return found[0]


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def _router_container(variant: str) -> Obj:
    containers = _one(variant, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: Obj = containers[0]
    return container


def _router_config(variant: str) -> RouterConfig:
    config_map = _one(variant, "ConfigMap")
    return parse_config_text(config_map["data"]["config.yaml"])


def _validate(obj: Obj) -> None:
    if obj["kind"] == "ServiceMonitor":
        jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
    else:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def _exported_families() -> set[str]:
    names = set()
    for line in GOLDEN.read_text().splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
    return names


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lints_the_chart_without_warnings(variant: str) -> None:
    report = helm.lint(CHART, _values(variant), strict=True, namespace=NAMESPACE, kube_version=KUBE_VERSION)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_validates_against_the_kubernetes_schemas(variant: str) -> None:
    objects = _rendered(variant)
    kinds = {o["kind"] for o in objects}
    assert kinds >= ROUTER_KINDS
    if variant != "sim":
        assert {"HorizontalPodAutoscaler", "ServiceMonitor"} <= kinds
    for obj in objects:
        _validate(obj)


def test_a_misspelt_field_fails_validation() -> None:
    """The strict schemas reject unknown fields: the validation above can fail."""
    deployment = json.loads(json.dumps(_one("default", "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"periodSeconds": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)
    monitor = json.loads(json.dumps(_one("default", "ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["honourLabels"] = True
    with pytest.raises(jsonschema.ValidationError):
        _validate(monitor)


def test_the_vllm_manifest_validates() -> None:
    objects = [o for o in yaml.safe_load_all(VLLM.read_text()) if o]
    assert {o["kind"] for o in objects} == {"Service", "StatefulSet"}
    for obj in objects:
        _validate(obj)


@pytest.mark.parametrize("variant", VARIANTS)
def test_at_least_two_routers_run(variant: str) -> None:
    deployment = _one(variant, "Deployment")
    autoscalers = _objects(variant, "HorizontalPodAutoscaler")
    if autoscalers:
        # the autoscaler owns the count; an upgrade must not reset it
        assert "replicas" not in deployment["spec"]
        assert autoscalers[0]["spec"]["minReplicas"] >= 2
    else:
        assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_probes_resources_and_shutdown(variant: str) -> None:
    container = _router_container(variant)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == 8000
    for probe, path in (
        ("startupProbe", "/health"),
        ("livenessProbe", "/health"),
        ("readinessProbe", "/ready"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    requests = container["resources"]["requests"]
    assert requests["cpu"] and requests["memory"]
    assert container["resources"]["limits"]["memory"]
    # the pod's grace period outlasts the preStop sleep plus the router's own drain
    pod = _one(variant, "Deployment")["spec"]["template"]["spec"]
    sleep_cmd = container["lifecycle"]["preStop"]["exec"]["command"]
    sleep_s = float(sleep_cmd[-1].rsplit("(", 1)[1].rstrip(")"))
    drain_s = _router_config(variant).shutdown.drain_timeout_ms / 1000
    assert pod["terminationGracePeriodSeconds"] > sleep_s + drain_s


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_router_reads_its_config_from_the_config_map(variant: str) -> None:
    deployment = _one(variant, "Deployment")
    container = _router_container(variant)
    args = build_parser("serve").parse_args(container["args"])
    assert (args.command, args.host, args.port, args.endpoint) == ("serve", "0.0.0.0", 8000, [])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    config_map = _one(variant, "ConfigMap")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert args.config == Path(mount["mountPath"]) / "config.yaml" and "config.yaml" in config_map["data"]
    config = _router_config(variant)
    assert len(config.endpoints) >= 2
    if variant == "default":
        # the chart's defaults are the router's built-in defaults, which are config/default.yaml
        assert config.model_copy(update={"endpoints": []}) == RouterConfig()
        urls = [e.url for e in config.endpoints]
        assert urls == [f"http://vllm-{i}.vllm.{NAMESPACE}.svc:8000" for i in range(2)]
    if variant == "production":
        assert config.plugins[0].type == "precise-prefix-producer"
        assert config.tokenizer.source == "remote"
        assert config.kv_events.endpoint_template == "tcp://{host}:5557"
        assert config.auth.admin_port is not None
        assert len(config.endpoints) == 4


def test_a_new_config_rolls_the_routers() -> None:
    def checksum(values: Obj) -> str:
        with helm.Chart.load(CHART) as chart:
            text = chart.render(values, name=RELEASE, namespace=NAMESPACE)[
                "burstsched/templates/deployment.yaml"
            ]
        deployment = yaml.safe_load(text)
        value: str = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    assert checksum({}) != checksum({"config": {"admission": {"window_ms": 20}}})
    assert checksum({}) != checksum({"vllm": {"replicas": 3}})
    assert checksum({}) == checksum({"logLevel": "debug"})


@pytest.mark.parametrize("variant", VARIANTS)
def test_selectors_take_the_router_pods_only(variant: str) -> None:
    deployment = _one(variant, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert _selects(deployment["spec"]["selector"], pod_labels)
    service = _one(variant, "Service")
    assert _selects({"matchLabels": service["spec"]["selector"]}, pod_labels)
    pdb = _one(variant, "PodDisruptionBudget")
    assert _selects(pdb["spec"]["selector"], pod_labels)
    assert pdb["spec"]["maxUnavailable"] == 1  # one router may go; with two or more, one always serves
    affinity = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert _selects(term["labelSelector"], pod_labels)
    for sim in _objects(variant, "StatefulSet"):
        sim_labels = sim["spec"]["template"]["metadata"]["labels"]
        for selector in (deployment["spec"]["selector"], pdb["spec"]["selector"]):
            assert not _selects(selector, sim_labels)


@pytest.mark.parametrize("variant", ["default", "production"])
def test_the_autoscaler_scales_the_deployment_on_an_adapter_metric(variant: str) -> None:
    hpa = _one(variant, "HorizontalPodAutoscaler")
    deployment = _one(variant, "Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"] >= 2
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["target"]["type"] == "AverageValue"
    rules = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    rule = next(r for r in rules if r["name"]["as"] == metric["pods"]["metric"]["name"])
    series = rule["seriesQuery"].split("{")[0]
    assert series in _exported_families()
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_rbac_lets_the_routers_watch_endpoint_slices_and_pods(variant: str) -> None:
    role = _one(variant, "Role")
    rules = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert rules == {
        ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch"},
        ("", "pods"): {"get", "list", "watch"},
    }
    binding = _one(variant, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    account = _one(variant, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    pod = _one(variant, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


@pytest.mark.parametrize("variant", ["default", "production"])
def test_the_service_monitor_scrapes_the_metrics_port(variant: str) -> None:
    monitor = _one(variant, "ServiceMonitor")
    service = _one(variant, "Service")
    assert _selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # keeps burstsched's own `endpoint` label
    port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    container_ports = {p["name"]: p["containerPort"] for p in _router_container(variant)["ports"]}
    admin_port = _router_config(variant).auth.admin_port
    if admin_port is None:
        assert endpoint["port"] == "http"
    else:
        # /metrics exists only on the admin port
        assert endpoint["port"] == "admin" and container_ports[port["targetPort"]] == admin_port
        assert endpoint["authorization"]["credentials"]["name"]


def test_simulated_replicas_are_the_endpoints_of_the_sim_variant() -> None:
    (sim,) = _objects("sim", "StatefulSet")
    headless = next(s for s in _objects("sim", "Service") if s["spec"].get("clusterIP") == "None")
    assert sim["spec"]["serviceName"] == headless["metadata"]["name"]
    assert _selects(sim["spec"]["selector"], sim["spec"]["template"]["metadata"]["labels"])
    container = sim["spec"]["template"]["spec"]["containers"][0]
    args = build_parser("sim").parse_args(container["args"])
    assert (args.command, args.host, args.port) == ("sim", "0.0.0.0", 8000)
    name, service = sim["metadata"]["name"], headless["metadata"]["name"]
    expected = [f"http://{name}-{i}.{service}.{NAMESPACE}.svc:8000" for i in range(sim["spec"]["replicas"])]
    assert [e.url for e in _router_config("sim").endpoints] == expected
    assert "ServiceMonitor" not in {o["kind"] for o in _rendered("sim")}


def test_the_vllm_side_serves_what_the_router_expects() -> None:
    """deploy/kubernetes/vllm.yaml: the names the chart derives, prefix caching, and the KV-event ports."""
    objects = [o for o in yaml.safe_load_all(VLLM.read_text()) if o]
    (statefulset,) = [o for o in objects if o["kind"] == "StatefulSet"]
    (service,) = [o for o in objects if o["kind"] == "Service"]
    chart_vllm = yaml.safe_load((CHART / "values.yaml").read_text())["vllm"]
    assert statefulset["metadata"]["name"] == chart_vllm["statefulSet"]
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"] == chart_vllm["service"]
    assert statefulset["spec"]["replicas"] == chart_vllm["replicas"]
    assert service["spec"]["clusterIP"] == "None"
    assert _selects(statefulset["spec"]["selector"], statefulset["spec"]["template"]["metadata"]["labels"])

    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert "--enable-prefix-caching" in args
    assert args[args.index("--port") + 1] == str(chart_vllm["port"])
    events = json.loads(args[args.index("--kv-events-config") + 1])
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    vllm_ports = {
        "http": chart_vllm["port"],
        "kv-events": int(events["endpoint"].rsplit(":", 1)[1]),
        "kv-replay": int(events["replay_endpoint"].rsplit(":", 1)[1]),
    }
    assert events["endpoint"].startswith("tcp://*:")  # vLLM binds only a wildcard address
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == vllm_ports
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == vllm_ports

    # the production routers subscribe to exactly those ports
    kv_events = _router_config("production").kv_events
    assert kv_events.endpoint_template == f"tcp://{{host}}:{vllm_ports['kv-events']}"
    assert kv_events.replay_template == f"tcp://{{host}}:{vllm_ports['kv-replay']}"
