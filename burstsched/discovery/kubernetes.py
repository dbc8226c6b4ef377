"""Kubernetes discovery: the ready endpoints of a Service's EndpointSlices, or the ready Pods of a selector.

List, then watch from the list's ``resourceVersion`` (with bookmarks, which only move the version on); a
``410 Gone`` (the version is too old) relists from scratch; a dropped or failed watch reconnects from the
last version seen, after a backoff that doubles up to ``max_backoff_s``. The API is reached through
``kubernetes_asyncio`` (HTTP): in-cluster config in a pod, else a kubeconfig, or an explicit API URL.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import anyio
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from burstsched.config import EndpointConfig
from burstsched.discovery.source import EndpointKey, address_name, address_url, endpoint_key

log = logging.getLogger(__name__)

SERVICE_LABEL = "kubernetes.io/service-name"
_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def label_selector(service: str | None, selector: Mapping[str, str] | None) -> str:
    """The ``labelSelector`` of a Service's slices, or of the pods with ``selector``'s labels."""
    if service is not None:
        return f"{SERVICE_LABEL}={service}"
    return ",".join(f"{k}={v}" for k, v in sorted((selector or {}).items()))


def slice_endpoints(obj: Mapping[str, Any], scheme: str, port: int) -> list[EndpointConfig]:
    """The ready endpoints of one EndpointSlice (``conditions.ready`` unset counts as ready), at the slice's
    first port (the Service's target port), else at ``port``. A slice names its pods but carries none of
    their labels, so these endpoints have none (discover by pod selector for label filters)."""
    out: list[EndpointConfig] = []
    ports = [p.get("port") for p in obj.get("ports") or [] if isinstance(p.get("port"), int)]
    port = ports[0] if ports else port
    for endpoint in obj.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        addresses = endpoint.get("addresses") or []
        if conditions.get("ready") is False or conditions.get("terminating") is True or not addresses:
            continue
        target = endpoint.get("targetRef") or {}
        name = target.get("name") if target.get("kind") == "Pod" else None
        out.append(
            EndpointConfig(
                url=address_url(scheme, addresses[0], port), name=name or address_name(addresses[0])
            )
        )
    return out


def pod_endpoints(obj: Mapping[str, Any], scheme: str, port: int) -> list[EndpointConfig]:
    """The pod as an endpoint, with the pod's labels, when it is Ready, has an IP and is not being deleted."""
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    ip = status.get("podIP")
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    if not ip or not ready or metadata.get("deletionTimestamp"):
        return []
    raw_labels = metadata.get("labels") or {}
    labels = {str(k): str(v) for k, v in raw_labels.items()} if isinstance(raw_labels, Mapping) else {}
    name = metadata.get("name") or address_name(ip)
    return [EndpointConfig(url=address_url(scheme, ip, port), name=name, labels=labels)]


ApiFactory = Callable[[], Awaitable[client.ApiClient]]
"""Opens the API client (the caller closes it)."""


def api_factory(api_url: str | None = None, kubeconfig: str | None = None) -> ApiFactory:
    """An explicit API URL, else the in-cluster config in a pod, else a kubeconfig file."""

    async def open_client() -> client.ApiClient:
        from kubernetes_asyncio import config as kube_config

        configuration = client.Configuration()
        if api_url is not None:
            configuration.host = api_url.rstrip("/")
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await kube_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        return client.ApiClient(configuration)

    return open_client


def default_namespace() -> str:
    """The pod's own namespace when running in one, else ``default``."""
    try:
        return _NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


class _Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


class KubernetesDiscovery:
    """Endpoints from the EndpointSlices of ``service``, or from the Pods matching ``selector``."""

    source = "kubernetes"

    def __init__(
        self,
        open_api: ApiFactory,
        *,
        namespace: str,
        service: str | None = None,
        selector: Mapping[str, str] | None = None,
        port: int = 8000,
        scheme: str = "http",
        watch_timeout_s: int = 300,
        min_backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
    ) -> None:
        if (service is None) == (selector is None):
            raise ValueError("give exactly one of service or selector")
        self._open_api = open_api
        self._namespace = namespace
        self._pods = service is None
        self._selector = label_selector(service, selector)
        self._port = port
        self._scheme = scheme
        self._watch_timeout_s = watch_timeout_s
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max_backoff_s
        self._objects: dict[str, list[EndpointConfig]] = {}
        self.relists = 0
        """How many times the list was read (1 + the relists after a 410 or a failure)."""
        self.reconnects = 0
        """How many watches were opened after the first."""

    def _endpoints_of(self, obj: Mapping[str, Any]) -> list[EndpointConfig]:
        if self._pods:
            return pod_endpoints(obj, self._scheme, self._port)
        return slice_endpoints(obj, self._scheme, self._port)

    def current(self) -> list[EndpointConfig]:
        """The union of every object's ready endpoints, one per name, sorted by name."""
        merged: dict[str, EndpointConfig] = {}
        for endpoints in self._objects.values():
            for endpoint in endpoints:
                merged.setdefault(endpoint.endpoint_name, endpoint)
        return [merged[name] for name in sorted(merged)]

    def _list_call(self, api: client.ApiClient) -> Callable[..., Any]:
        if self._pods:
            return client.CoreV1Api(api).list_namespaced_pod
        return client.DiscoveryV1Api(api).list_namespaced_endpoint_slice

    async def _list(self, api: client.ApiClient) -> str:
        """Replace the known objects with a fresh list; its resourceVersion."""
        result = await self._list_call(api)(self._namespace, label_selector=self._selector)
        raw: dict[str, Any] = api.sanitize_for_serialization(result)
        self.relists += 1
        self._objects = {
            str((item.get("metadata") or {}).get("name")): self._endpoints_of(item)
            for item in raw.get("items") or []
        }
        return str((raw.get("metadata") or {}).get("resourceVersion") or "")

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            self._objects.pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._objects[name] = self._endpoints_of(obj)

    async def endpoint_sets(self) -> AsyncGenerator[list[EndpointConfig], None]:
        api = await self._open_api()
        last: EndpointKey | None = None
        backoff = self._min_backoff_s
        version: str | None = None
        try:
            while True:
                try:
                    if version is None:
                        version = await self._list(api)
                        backoff = self._min_backoff_s
                        current = self.current()
                        if endpoint_key(current) != last:
                            last = endpoint_key(current)
                            yield current
                    async for kind, obj in self._watch(api, version):
                        backoff = self._min_backoff_s
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        if kind == "BOOKMARK":
                            continue
                        self._apply(kind, obj)
                        current = self.current()
                        if endpoint_key(current) != last:
                            last = endpoint_key(current)
                            yield current
                    self.reconnects += 1  # the server closed the watch (its timeout): carry on from version
                    continue
                except _Gone:
                    log.info("discovery: resourceVersion %s is gone; relisting", version)
                    version = None
                    continue
                except (TimeoutError, ApiException, aiohttp.ClientError, ValueError) as exc:
                    log.warning(
                        "discovery: watch of %s failed (%s); retrying in %.1fs", self._selector, exc, backoff
                    )
                await anyio.sleep(backoff)
                backoff = min(self._max_backoff_s, backoff * 2)
                self.reconnects += 1
        finally:
            await api.close()

    async def _watch(self, api: client.ApiClient, version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        watcher = watch.Watch()
        try:
            stream = watcher.stream(
                self._list_call(api),
                self._namespace,
                label_selector=self._selector,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout_s,
            )
            async for event in stream:
                if not isinstance(event, dict):
                    raise ValueError(f"not a watch event: {event!r:.200}")
                yield str(event.get("type")), dict(event.get("raw_object") or {})
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone() from exc
            raise
        finally:
            await watcher.close()
