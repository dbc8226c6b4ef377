"""Endpoint discovery: the replicas from the static list, a DNS name, or the Kubernetes API."""

from burstsched.discovery.build import build_discovery
from burstsched.discovery.dns import DnsDiscovery, Resolver, loop_resolver
from burstsched.discovery.kubernetes import KubernetesDiscovery, api_factory, label_selector
from burstsched.discovery.source import Discovery, StaticDiscovery, address_name, address_url

__all__ = [
    "Discovery",
    "DnsDiscovery",
    "KubernetesDiscovery",
    "Resolver",
    "StaticDiscovery",
    "address_name",
    "address_url",
    "api_factory",
    "build_discovery",
    "label_selector",
    "loop_resolver",
]
