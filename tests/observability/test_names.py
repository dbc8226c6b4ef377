"""Attribute names match the OpenTelemetry semantic conventions; the facade exports its ``__all__``."""

from __future__ import annotations

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import (
    client_attributes,
    error_attributes,
    http_attributes,
    network_attributes,
    server_attributes,
    url_attributes,
    user_agent_attributes,
)

import burstsched.telemetry
from burstsched.dispatch import ENDPOINT_HEADER
from burstsched.telemetry import attributes as attr
from burstsched.telemetry.metrics import ENDPOINT_HEADER as METRICS_ENDPOINT_HEADER


def test_genai_names_are_the_semantic_conventions() -> None:
    assert attr.GEN_AI_OPERATION_NAME == gen_ai.GEN_AI_OPERATION_NAME
    assert attr.GEN_AI_REQUEST_MODEL == gen_ai.GEN_AI_REQUEST_MODEL
    assert attr.GEN_AI_REQUEST_MAX_TOKENS == gen_ai.GEN_AI_REQUEST_MAX_TOKENS
    assert attr.GEN_AI_REQUEST_TEMPERATURE == gen_ai.GEN_AI_REQUEST_TEMPERATURE
    assert attr.GEN_AI_REQUEST_TOP_P == gen_ai.GEN_AI_REQUEST_TOP_P
    assert attr.GEN_AI_RESPONSE_ID == gen_ai.GEN_AI_RESPONSE_ID
    assert attr.GEN_AI_RESPONSE_MODEL == gen_ai.GEN_AI_RESPONSE_MODEL
    assert attr.GEN_AI_RESPONSE_FINISH_REASONS == gen_ai.GEN_AI_RESPONSE_FINISH_REASONS
    assert attr.GEN_AI_USAGE_INPUT_TOKENS == gen_ai.GEN_AI_USAGE_INPUT_TOKENS
    assert attr.GEN_AI_USAGE_OUTPUT_TOKENS == gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS
    assert attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS == gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS
    assert attr.OPERATION_CHAT == gen_ai.GenAiOperationNameValues.CHAT.value
    assert attr.OPERATION_TEXT_COMPLETION == gen_ai.GenAiOperationNameValues.TEXT_COMPLETION.value


def test_http_names_are_the_semantic_conventions() -> None:
    assert attr.HTTP_REQUEST_METHOD == http_attributes.HTTP_REQUEST_METHOD
    assert attr.HTTP_RESPONSE_STATUS_CODE == http_attributes.HTTP_RESPONSE_STATUS_CODE
    assert attr.HTTP_ROUTE == http_attributes.HTTP_ROUTE
    assert attr.HTTP_REQUEST_RESEND_COUNT == http_attributes.HTTP_REQUEST_RESEND_COUNT
    assert attr.URL_FULL == url_attributes.URL_FULL
    assert attr.URL_PATH == url_attributes.URL_PATH
    assert attr.URL_SCHEME == url_attributes.URL_SCHEME
    assert attr.SERVER_ADDRESS == server_attributes.SERVER_ADDRESS
    assert attr.SERVER_PORT == server_attributes.SERVER_PORT
    assert attr.CLIENT_ADDRESS == client_attributes.CLIENT_ADDRESS
    assert attr.CLIENT_PORT == client_attributes.CLIENT_PORT
    assert attr.NETWORK_PROTOCOL_VERSION == network_attributes.NETWORK_PROTOCOL_VERSION
    assert attr.USER_AGENT_ORIGINAL == user_agent_attributes.USER_AGENT_ORIGINAL
    assert attr.ERROR_TYPE == error_attributes.ERROR_TYPE


def test_own_names_carry_the_burstsched_namespace() -> None:
    own = [
        value
        for name, value in vars(attr).items()
        if name.isupper()
        and isinstance(value, str)
        and not name.startswith(("SPAN_", "EVENT_", "OPERATION_"))
    ]
    standard = ("gen_ai.", "http.", "url.", "server.", "client.", "network.", "user_agent.", "error.")
    assert all(v.startswith("burstsched.") or v.startswith(standard) for v in own)
    assert not any(v.startswith("vllm") for v in own)


def test_facade_exports_exactly_its_all() -> None:
    module = burstsched.telemetry
    public = {name for name in vars(module) if not name.startswith("_")}
    exported = set(module.__all__)
    assert exported <= public
    submodules = {name for name in public if type(vars(module)[name]).__name__ == "module"}
    assert public - submodules - exported == set()


def test_metrics_read_the_endpoint_header_the_proxy_writes() -> None:
    assert METRICS_ENDPOINT_HEADER == ENDPOINT_HEADER
