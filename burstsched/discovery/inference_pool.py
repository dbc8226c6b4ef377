"""Discovery from a Gateway API Inference Extension ``InferencePool`` (``inference.networking.k8s.io/v1``).

The pool is read once at start (``GET .../inferencepools/NAME``): its ``spec.selector.matchLabels`` chooses
the replica pods, its ``spec.targetPorts`` the ports, each port of each Ready pod its own endpoint (named
``POD:PORT`` when the pool lists several ports, else ``POD``, as the pods watch names them). The pods are
then listed and watched as :class:`~burstsched.discovery.kubernetes.KubernetesDiscovery` watches them. A
change of the pool's selector or ports takes a restart of the picker.

``spec.endpointPickerRef`` belongs to the gateway (where to ask, and ``failureMode``: ``FailOpen`` lets a
request through when the picker cannot answer, ``FailClose``, the default, fails it); it is read and kept in
:attr:`InferencePoolDiscovery.picker` for the logs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from burstsched.config import EndpointConfig
from burstsched.discovery.kubernetes import ApiFactory, KubernetesDiscovery, pod_endpoints

log = logging.getLogger(__name__)

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
PLURAL = "inferencepools"


class InferencePoolError(ValueError):
    """The InferencePool cannot be used: missing, or its spec lacks what discovery needs."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What discovery and the logs use of an InferencePool."""

    name: str
    match_labels: Mapping[str, str]
    ports: tuple[int, ...]
    picker_service: str | None = None
    failure_mode: str = "FailClose"


def pool_spec(obj: Mapping[str, Any]) -> PoolSpec:
    """An InferencePool object's spec (raises :class:`InferencePoolError` naming the missing field)."""
    name = str((obj.get("metadata") or {}).get("name") or "?")
    spec = obj.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not labels:
        raise InferencePoolError(f"InferencePool {name}: spec.selector.matchLabels is empty")
    ports = tuple(
        int(p["number"]) for p in spec.get("targetPorts") or [] if isinstance(p, Mapping) and "number" in p
    )
    if not ports:
        raise InferencePoolError(f"InferencePool {name}: spec.targetPorts lists no port number")
    ref = spec.get("endpointPickerRef") or {}
    return PoolSpec(
        name,
        {str(k): str(v) for k, v in labels.items()},
        ports,
        picker_service=ref.get("name"),
        failure_mode=str(ref.get("failureMode") or "FailClose"),
    )


def pool_endpoints(obj: Mapping[str, Any], scheme: str, ports: Sequence[int]) -> list[EndpointConfig]:
    """A Ready pod's endpoints: one per port (named ``POD:PORT`` when there are several)."""
    out: list[EndpointConfig] = []
    for port in ports:
        for endpoint in pod_endpoints(obj, scheme, port):
            name = f"{endpoint.endpoint_name}:{port}" if len(ports) > 1 else endpoint.endpoint_name
            out.append(EndpointConfig(url=endpoint.url, name=name, labels=endpoint.labels))
    return out


class _PoolPods(KubernetesDiscovery):
    """The pods of a pool's selector, each as one endpoint per target port."""

    def __init__(
        self, open_api: ApiFactory, spec: PoolSpec, *, namespace: str, scheme: str, **kw: Any
    ) -> None:
        super().__init__(
            open_api, namespace=namespace, selector=spec.match_labels, port=spec.ports[0], scheme=scheme, **kw
        )
        self._ports = spec.ports
        self._pool_scheme = scheme

    def _endpoints_of(self, obj: Mapping[str, Any]) -> list[EndpointConfig]:
        return pool_endpoints(obj, self._pool_scheme, self._ports)


class InferencePoolDiscovery:
    """The endpoints of the InferencePool ``name`` in ``namespace``."""

    source = "inference-pool"

    def __init__(
        self,
        open_api: ApiFactory,
        *,
        name: str,
        namespace: str,
        scheme: str = "http",
        watch_timeout_s: int = 300,
        min_backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
    ) -> None:
        self._open_api = open_api
        self._name = name
        self._namespace = namespace
        self._scheme = scheme
        self._watch = {
            "watch_timeout_s": watch_timeout_s,
            "min_backoff_s": min_backoff_s,
            "max_backoff_s": max_backoff_s,
        }
        self.picker: PoolSpec | None = None
        """The pool's spec as read at start (selector, ports, its picker and failure mode)."""

    async def read_pool(self) -> PoolSpec:
        """``GET`` the InferencePool and read its spec."""
        api = await self._open_api()
        try:
            result = await client.CustomObjectsApi(api).get_namespaced_custom_object(
                GROUP, VERSION, self._namespace, PLURAL, self._name
            )
        except ApiException as exc:
            raise InferencePoolError(
                f"InferencePool {self._namespace}/{self._name}: {exc.status} {exc.reason}"
            ) from exc
        finally:
            await api.close()
        return pool_spec(result)

    async def endpoint_sets(self) -> AsyncGenerator[list[EndpointConfig], None]:
        spec = await self.read_pool()
        self.picker = spec
        log.warning(
            "discovery: InferencePool %s/%s: pods %s on port(s) %s; its picker %s (failureMode %s)",
            self._namespace,
            spec.name,
            ",".join(f"{k}={v}" for k, v in sorted(spec.match_labels.items())),
            ",".join(str(p) for p in spec.ports),
            spec.picker_service or "-",
            spec.failure_mode,
        )
        pods = _PoolPods(self._open_api, spec, namespace=self._namespace, scheme=self._scheme, **self._watch)
        async for endpoints in pods.endpoint_sets():
            yield endpoints
