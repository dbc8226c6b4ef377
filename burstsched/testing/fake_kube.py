"""An in-process fake of the Kubernetes API's list and watch of EndpointSlices and Pods, and of reading an
``InferencePool`` (``inference.networking.k8s.io/v1``), for the discovery tests and the discovery load test
(serve its ``app`` with uvicorn and point ``discovery.api_url`` at it).

It keeps a resourceVersion counter and an event log; a watch from a version older than the log's start
(``compact``) gets an ERROR event with code 410, as the real API server sends; ``bookmark`` sends a
BOOKMARK to the open watches; ``drop_watches`` cuts them mid-stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

API_VERSION = "discovery.k8s.io/v1"
POOL_GROUP = "inference.networking.k8s.io"
_KINDS = {"EndpointSlice": API_VERSION, "Pod": "v1", "InferencePool": f"{POOL_GROUP}/v1"}


def pod(name: str, ip: str, labels: dict[str, str], *, ready: bool = True) -> dict[str, Any]:
    """A running pod with ``labels`` at ``ip``, Ready or not."""
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "status": {"phase": "Running", "podIP": ip, "conditions": [condition]},
    }


def inference_pool(
    name: str,
    labels: dict[str, str],
    ports: list[int],
    *,
    picker: str = "epp",
    failure_mode: str = "FailClose",
) -> dict[str, Any]:
    """An ``InferencePool`` selecting pods by ``labels`` on ``ports``, its picker the Service ``picker``."""
    return {
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": labels},
            "targetPorts": [{"number": p} for p in ports],
            "endpointPickerRef": {"name": picker, "port": {"number": 9002}, "failureMode": failure_mode},
        },
    }


def endpoint_slice(
    name: str, service: str, pods: dict[str, str], port: int, *, ready: bool = True
) -> dict[str, Any]:
    """A slice of ``service`` with one endpoint per ``pod name -> IP``, all at ``port``."""
    return {
        "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [ip], "conditions": {"ready": ready}, "targetRef": {"kind": "Pod", "name": pod}}
            for pod, ip in pods.items()
        ],
    }


class FakeKubeApi:
    """The state of the fake API server and its Starlette app (``app``)."""

    def __init__(self) -> None:
        self.version = 100
        self.objects: dict[str, dict[str, Any]] = {}
        """EndpointSlices by name; pods and pools are keyed ``Pod/NAME``, ``InferencePool/NAME``."""
        self.log: list[tuple[int, str, dict[str, Any]]] = []
        self.oldest = 0
        """Watches from a resourceVersion below this get 410 Gone."""
        self.lists = 0
        self.watches: list[dict[str, str]] = []
        """The query of every watch request, in order."""
        self.gone_sent = 0
        self._changed = asyncio.Condition()
        self._generation = 0  # drop_watches bumps it: open watches with an older one end
        self.app = Starlette(
            routes=[
                Route("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self._endpointslices),
                Route("/api/v1/namespaces/{ns}/pods", self._pods),
                Route(f"/apis/{POOL_GROUP}/v1/namespaces/{{ns}}/inferencepools/{{name}}", self._pool),
            ]
        )

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def put(self, obj: dict[str, Any]) -> None:
        """Create or replace an object (ADDED or MODIFIED): an EndpointSlice unless its ``kind`` says
        ``Pod`` or ``InferencePool``."""
        kind_name = obj.get("kind", "EndpointSlice")
        name = _key(kind_name, obj["metadata"]["name"])
        kind = "MODIFIED" if name in self.objects else "ADDED"
        self.version += 1
        obj = json.loads(json.dumps(obj))
        obj["kind"] = kind_name
        obj["apiVersion"] = _KINDS[kind_name]
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[name] = obj
        self.log.append((self.version, kind, obj))
        await self._notify()

    async def delete(self, name: str, kind: str = "EndpointSlice") -> None:
        obj = self.objects.pop(_key(kind, name))
        self.version += 1
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
        self.log.append((self.version, "DELETED", obj))
        await self._notify()

    async def bookmark(self) -> None:
        """Move the version on and send every open watch a BOOKMARK at it."""
        self.version += 1
        self.log.append((self.version, "BOOKMARK", {}))
        await self._notify()

    def compact(self) -> None:
        """Forget the log: a watch from any version seen so far gets 410 Gone."""
        self.version += 1
        self.oldest = self.version
        self.log = []

    async def drop_watches(self) -> None:
        """Cut every open watch connection."""
        self._generation += 1
        await self._notify()

    async def _endpointslices(self, request: Request) -> Response:
        return self._list_or_watch(request, "EndpointSlice")

    async def _pods(self, request: Request) -> Response:
        return self._list_or_watch(request, "Pod")

    async def _pool(self, request: Request) -> Response:
        obj = self.objects.get(_key("InferencePool", request.path_params["name"]))
        if obj is None:
            status = {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
            return JSONResponse(status, status_code=404)
        return JSONResponse(obj)

    def _list_or_watch(self, request: Request, kind: str) -> Response:
        query = dict(request.query_params)
        selector = _labels(query.get("labelSelector", ""))
        if query.get("watch") in ("true", "1", "True"):
            self.watches.append(query)
            return StreamingResponse(self._watch(query, kind, selector), media_type="application/json")
        self.lists += 1
        items = [o for o in self.objects.values() if self._selected(o, kind, selector)]
        return JSONResponse(
            {
                "kind": f"{kind}List",
                "apiVersion": _KINDS[kind],
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
        )

    @staticmethod
    def _selected(obj: dict[str, Any], kind: str, selector: dict[str, str]) -> bool:
        labels = obj.get("metadata", {}).get("labels", {})
        return obj.get("kind") == kind and all(labels.get(k) == v for k, v in selector.items())

    async def _watch(
        self, query: dict[str, str], kind_name: str, selector: dict[str, str]
    ) -> AsyncIterator[bytes]:
        since = int(query.get("resourceVersion") or self.version)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "True", "1")
        generation = self._generation
        if since < self.oldest:
            self.gone_sent += 1
            status = {
                "kind": "Status",
                "status": "Failure",
                "reason": "Expired",
                "code": 410,
                "message": f"too old resource version: {since} ({self.oldest})",
            }
            yield (json.dumps({"type": "ERROR", "object": status}) + "\n").encode()
            return
        while True:
            for version, kind, obj in list(self.log):
                if version <= since:
                    continue
                since = version
                if kind == "BOOKMARK":
                    if bookmarks:
                        mark = {
                            "kind": kind_name,
                            "apiVersion": _KINDS[kind_name],
                            "metadata": {"resourceVersion": str(version)},
                        }
                        yield (json.dumps({"type": "BOOKMARK", "object": mark}) + "\n").encode()
                elif self._selected(obj, kind_name, selector):
                    yield (json.dumps({"type": kind, "object": obj}) + "\n").encode()
            async with self._changed:
                if generation != self._generation:
                    return
                if not any(v > since for v, _, _ in self.log):
                    await self._changed.wait()
            if generation != self._generation:
                return


def _key(kind: str, name: str) -> str:
    return name if kind == "EndpointSlice" else f"{kind}/{name}"


def _labels(selector: str) -> dict[str, str]:
    """An equality-based label selector (``a=b,c=d``) as a dict."""
    pairs = (part.split("=", 1) for part in selector.split(",") if "=" in part)
    return {k.strip(): v.strip() for k, v in pairs}
