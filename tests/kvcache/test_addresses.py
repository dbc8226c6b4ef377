"""Each endpoint's event addresses: its own, or the templates filled from its URL; and the command line's."""

from __future__ import annotations

import pytest

from burstsched.config import (
    ConfigError,
    EndpointConfig,
    KVEventsConfig,
    RouterConfig,
    attach_kv_events,
    parse_config_text,
)
from burstsched.kvcache import StreamAddress, stream_addresses


def test_templates_fill_in_each_endpoint_and_explicit_addresses_win() -> None:
    endpoints = [
        EndpointConfig(url="http://10.0.0.5:8000", name="a"),
        EndpointConfig(url="http://[::1]:8001"),
        EndpointConfig(
            url="http://h:9", name="c", kv_events="tcp://other:1", kv_events_replay="tcp://other:2"
        ),
    ]
    config = KVEventsConfig(endpoint_template="tcp://{host}:5557", replay_template="tcp://{host}:{port}9")
    assert stream_addresses(endpoints, config) == [
        StreamAddress("a", "tcp://10.0.0.5:5557", "tcp://10.0.0.5:80009"),
        StreamAddress("::1:8001", "tcp://[::1]:5557", "tcp://[::1]:80019"),
        StreamAddress("c", "tcp://other:1", "tcp://other:2"),
    ]


def test_without_a_template_only_explicit_endpoints_have_streams() -> None:
    endpoints = [
        EndpointConfig(url="http://a:1", name="a"),
        EndpointConfig(url="http://b:1", name="b", kv_events="ipc:///tmp/x"),
    ]
    assert stream_addresses(endpoints, KVEventsConfig()) == [StreamAddress("b", "ipc:///tmp/x", None)]


def test_bad_addresses_and_templates_are_refused_with_their_path() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_config_text("kv_events: {endpoint_template: 'tcp://{hots}:1'}\n")
    assert "kv_events.endpoint_template" in str(excinfo.value)
    with pytest.raises(ConfigError) as excinfo:
        parse_config_text("endpoints: [{url: 'http://a:1', kv_events: 'http://a:2'}]\n")
    assert "endpoints[0].kv_events" in str(excinfo.value) or "endpoints.0.kv_events" in str(excinfo.value)


def test_command_line_kv_events_attach_to_named_endpoints() -> None:
    config = RouterConfig(
        endpoints=[EndpointConfig(url="http://a:1", name="a"), EndpointConfig(url="http://b:1", name="b")]
    )
    attached = attach_kv_events(config, ["a=tcp://a:5557"], ["a=tcp://a:5558"])
    assert (
        attached.endpoints[0].kv_events == "tcp://a:5557"
        and attached.endpoints[0].kv_events_replay == "tcp://a:5558"
    )
    assert attached.endpoints[1].kv_events is None
    for bad in (["z=tcp://a:1"], ["a"], ["a=http://x:1"]):
        with pytest.raises(ConfigError):
            attach_kv_events(config, bad)
