"""The Helm chart in deploy/helm/burstsched-epp (burstsched as an InferencePool's endpoint picker), rendered
by Helm's own engine (helm-python-sdk) and validated: the Kubernetes objects against the pinned Kubernetes
schemas (strict), the InferencePool against the Gateway API Inference Extension's CRD (vendored in
tests/deploy/crds/, its source named there), the HTTPRoute against the fields of gateway.networking.k8s.io/v1
the chart uses. Then the objects must fit together: the pool names the picker's Service and port, the picker
is started on that pool with arguments ``burstsched epp`` accepts, its config parses, its Role grants what
the discovery reads, and the pool selects the model servers' pods on their port."""

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
from burstsched.config import parse_config_text

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "burstsched-epp"
CRD = Path(__file__).with_name("crds") / "inference.networking.k8s.io_inferencepools.yaml"
VLLM = REPO / "deploy" / "kubernetes" / "vllm.yaml"
KUBE_VERSION = "1.33.0"
RELEASE = "llama"
NAMESPACE = "serving"
VARIANTS = ("default", "pool-4", "existing-pool")
Obj = dict[str, Any]

_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
HTTP_ROUTE_SCHEMA: Obj = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "gateway.networking.k8s.io/v1"},
        "kind": {"const": "HTTPRoute"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "properties": {
                "parentRefs": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 32,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "group": {"type": "string"},
                            "kind": {"type": "string"},
                            "namespace": {"type": "string"},
                            "name": _NAME,
                            "sectionName": {"type": "string"},
                            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                        },
                        "additionalProperties": False,
                    },
                },
                "hostnames": {"type": "array", "items": {"type": "string"}},
                "rules": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "matches": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "path": {
                                            "type": "object",
                                            "properties": {
                                                "type": {
                                                    "enum": ["Exact", "PathPrefix", "RegularExpression"]
                                                },
                                                "value": {"type": "string", "maxLength": 1024},
                                            },
                                            "additionalProperties": False,
                                        }
                                    },
                                    "additionalProperties": False,
                                },
                            },
                            "backendRefs": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["name"],
                                    "properties": {
                                        "group": {"type": "string"},
                                        "kind": {"type": "string"},
                                        "name": _NAME,
                                        "port": {"type": "integer"},
                                        "weight": {"type": "integer"},
                                    },
                                    "additionalProperties": False,
                                },
                            },
                            "timeouts": {
                                "type": "object",
                                "properties": {
                                    "request": {
                                        "type": "string",
                                        "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$",
                                    },
                                    "backendRequest": {"type": "string"},
                                },
                                "additionalProperties": False,
                            },
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
def rendered(variant: str) -> tuple[Obj, ...]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(_values(variant), name=RELEASE, namespace=NAMESPACE, is_install=True)
    return tuple(
        obj
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj
    )


def _kind(variant: str, kind: str) -> list[Obj]:
    return [o for o in rendered(variant) if o["kind"] == kind]


def _one(variant: str, kind: str) -> Obj:
    found = _kind(variant, kind)
    assert len(found) == 1, f"{variant}: {len(found)} {kind}"
    return found[0]


@functools.cache
def _pool_schema() -> Obj:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema: Obj = version["schema"]["openAPIV3Schema"]
    return schema


def validate(obj: Obj) -> None:
    if obj["kind"] == "InferencePool":
        assert obj["apiVersion"] == "inference.networking.k8s.io/v1"
        jsonschema.validate(obj, _pool_schema())
        ports = [p["number"] for p in obj["spec"]["targetPorts"]]
        assert len(set(ports)) == len(ports), "port number must be unique (the CRD's CEL rule)"
    elif obj["kind"] == "HTTPRoute":
        jsonschema.validate(obj, HTTP_ROUTE_SCHEMA)
    else:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def _args(variant: str) -> list[str]:
    container = _one(variant, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    args: list[str] = container["args"]
    return args


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lints_the_chart_without_warnings(variant: str) -> None:
    report = helm.lint(CHART, _values(variant), strict=True, namespace=NAMESPACE, kube_version=KUBE_VERSION)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_validates(variant: str) -> None:
    objects = rendered(variant)
    kinds = {o["kind"] for o in objects}
    assert kinds >= {"ConfigMap", "Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"}
    assert ("InferencePool" in kinds) == (variant != "existing-pool")
    for obj in objects:
        validate(obj)


def test_the_validation_can_fail() -> None:
    pool = json.loads(json.dumps(_one("default", "InferencePool")))
    pool["spec"]["endpointPickerRef"]["failureMode"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)
    pool = json.loads(json.dumps(_one("default", "InferencePool")))
    pool["spec"]["targetPorts"] = [{"number": 8000 + i} for i in range(9)]  # the CRD allows 8
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)
    route = json.loads(json.dumps(_one("pool-4", "HTTPRoute")))
    route["spec"]["rules"][0]["backendRefs"][0]["nmae"] = "typo"
    with pytest.raises(jsonschema.ValidationError):
        validate(route)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_picker_serves_the_pool_the_gateway_asks_it_about(variant: str) -> None:
    service = _one(variant, "Service") if variant != "pool-4" else _picker_service(variant)
    args = _args(variant)
    parsed = build_parser("epp").parse_args(args)  # the command accepts every argument the chart gives
    assert parsed.command == "epp" and parsed.pool_namespace == NAMESPACE
    parse_config_text(_one(variant, "ConfigMap")["data"]["config.yaml"])
    grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc-ext-proc")
    assert grpc_port["port"] == parsed.port and grpc_port["appProtocol"] == "http2"
    pod_labels = _one(variant, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())
    if variant == "existing-pool":
        assert parsed.pool_name == "llama3-pool"
        assert (parsed.cert, parsed.key) == (
            Path("/etc/burstsched/tls/tls.crt"),
            Path("/etc/burstsched/tls/tls.key"),
        )
        return
    pool = _one(variant, "InferencePool")
    assert parsed.pool_name == pool["metadata"]["name"]
    ref = pool["spec"]["endpointPickerRef"]
    assert (ref["name"], ref["port"]["number"]) == (service["metadata"]["name"], grpc_port["port"])
    rules = {(r["apiGroups"][0], r["resources"][0]): set(r["verbs"]) for r in _one(variant, "Role")["rules"]}
    assert {"get"} <= rules[("inference.networking.k8s.io", "inferencepools")]
    assert {"list", "watch"} <= rules[("", "pods")]


def _picker_service(variant: str) -> Obj:
    return next(s for s in _kind(variant, "Service") if s["spec"].get("clusterIP") != "None")


def test_by_default_the_pool_selects_the_vllm_statefulsets_pods_on_their_port() -> None:
    pool = _one("default", "InferencePool")
    statefulset = next(o for o in yaml.safe_load_all(VLLM.read_text()) if o and o["kind"] == "StatefulSet")
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in pool["spec"]["selector"]["matchLabels"].items())
    ports = {
        p["containerPort"] for c in statefulset["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    assert {p["number"] for p in pool["spec"]["targetPorts"]} <= ports
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"


def test_a_4_replica_simulated_pool_behind_a_gateway() -> None:
    pool = _one("pool-4", "InferencePool")
    sim = _one("pool-4", "StatefulSet")
    assert sim["spec"]["replicas"] == 4
    labels = sim["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in pool["spec"]["selector"]["matchLabels"].items())
    container = sim["spec"]["template"]["spec"]["containers"][0]
    assert [p["containerPort"] for p in container["ports"]] == [
        p["number"] for p in pool["spec"]["targetPorts"]
    ]
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    route = _one("pool-4", "HTTPRoute")
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    assert backend == {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": pool["metadata"]["name"],
    }
    assert route["spec"]["parentRefs"] == [{"name": "inference-gateway"}]
    # the picker's own pods are not the pool's
    picker_labels = _one("pool-4", "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not all(picker_labels.get(k) == v for k, v in pool["spec"]["selector"]["matchLabels"].items())
