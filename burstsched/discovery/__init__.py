"""Endpoint discovery: the replicas from the static list, a DNS name, the Kubernetes API, or an
InferencePool."""

from burstsched.discovery.build import build_discovery
from burstsched.discovery.dns import DnsDiscovery, Resolver, loop_resolver
from burstsched.discovery.inference_pool import InferencePoolDiscovery, InferencePoolError
from burstsched.discovery.kubernetes import KubernetesDiscovery, api_factory, label_selector
from burstsched.discovery.source import Discovery, StaticDiscovery, address_name, address_url

__all__ = [
    "Discovery",
    "DnsDiscovery",
    "InferencePoolDiscovery",
    "InferencePoolError",
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
