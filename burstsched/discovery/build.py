"""The discovery source a config asks for."""

from __future__ import annotations

from burstsched.config import RouterConfig
from burstsched.discovery.dns import DnsDiscovery, Resolver, loop_resolver
from burstsched.discovery.kubernetes import KubernetesDiscovery, api_factory, default_namespace
from burstsched.discovery.source import Discovery, StaticDiscovery


def build_discovery(config: RouterConfig, *, resolver: Resolver = loop_resolver) -> Discovery:
    """``discovery.kind``; an llm-d pool selector (``pool.selector``) with no endpoints listed means
    Kubernetes discovery of the pods with those labels."""
    discovery = config.discovery
    selector = config.pool.selector
    if discovery.kind == "static" and selector is not None and not config.endpoints:
        return KubernetesDiscovery(
            api_factory(discovery.api_url, discovery.kubeconfig),
            namespace=selector.namespace or discovery.namespace or default_namespace(),
            selector=selector.match_labels,
            port=selector.target_port,
            scheme=discovery.scheme,
            watch_timeout_s=discovery.watch_timeout_s,
        )
    if discovery.kind == "dns":
        assert discovery.host is not None
        return DnsDiscovery(
            discovery.host,
            discovery.port,
            interval_s=discovery.interval_ms / 1000.0,
            scheme=discovery.scheme,
            resolver=resolver,
        )
    if discovery.kind == "kubernetes":
        return KubernetesDiscovery(
            api_factory(discovery.api_url, discovery.kubeconfig),
            namespace=discovery.namespace or default_namespace(),
            service=discovery.service,
            selector=discovery.selector,
            port=discovery.port,
            scheme=discovery.scheme,
            watch_timeout_s=discovery.watch_timeout_s,
        )
    return StaticDiscovery(config.endpoints)
