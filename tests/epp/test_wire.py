"""The picker's messages on their own: body echo pieces, the destination, the subset hint, and the generated
modules against their proto."""

from __future__ import annotations

import filecmp
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.struct_pb2 import ListValue, Struct, Value

from burstsched.epp import wire
from burstsched.epp.pb.ext_proc_pb2 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    HeaderMap,
    HeaderValue,
    HeaderValueOption,
    Metadata,
    ProcessingRequest,
    ProcessingResponse,
    StreamedBodyResponse,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("size", [0, 1, wire.BODY_CHUNK_BYTES, wire.BODY_CHUNK_BYTES + 1, 200_000])
@pytest.mark.parametrize("end_of_stream", [True, False])
def test_streamed_body_gives_back_every_byte_in_bounded_pieces(size: int, end_of_stream: bool) -> None:
    body = bytes(i % 251 for i in range(size))
    answers = list(wire.streamed(body, end_of_stream=end_of_stream, request=True))
    pieces = [a.request_body.response.body_mutation.streamed_response for a in answers]
    assert b"".join(p.body for p in pieces) == body
    assert all(len(p.body) <= wire.BODY_CHUNK_BYTES for p in pieces)
    assert [p.end_of_stream for p in pieces] == [False] * (len(pieces) - 1) + [end_of_stream]
    assert len(pieces) == max(1, -(-size // wire.BODY_CHUNK_BYTES))


@pytest.mark.parametrize("body", [b"", b"x", b"y" * (wire.BODY_CHUNK_BYTES + 1)])
@pytest.mark.parametrize("end_of_stream", [True, False])
@pytest.mark.parametrize("request_side", [True, False])
def test_streamed_pieces_are_the_bytes_of_nested_constructors(
    body: bytes, end_of_stream: bool, request_side: bool
) -> None:
    """The pieces set along their field path serialise as the messages built with constructors, empty
    pieces without end of stream included (every message on the path present)."""
    expected = []
    for start in range(0, max(len(body), 1), wire.BODY_CHUNK_BYTES):
        piece = body[start : start + wire.BODY_CHUNK_BYTES]
        last = start + wire.BODY_CHUNK_BYTES >= len(body)
        mutation = BodyMutation(
            streamed_response=StreamedBodyResponse(body=piece, end_of_stream=end_of_stream and last)
        )
        answer = BodyResponse(response=CommonResponse(body_mutation=mutation))
        built = (
            ProcessingResponse(request_body=answer)
            if request_side
            else ProcessingResponse(response_body=answer)
        )
        expected.append(built.SerializeToString())
    answers = wire.streamed(body, end_of_stream=end_of_stream, request=request_side)
    assert [a.SerializeToString() for a in answers] == expected


@pytest.mark.parametrize("buffered", [False, True])
def test_the_destination_answer_is_routing_and_metadata_in_a_fresh_message(buffered: bool) -> None:
    addresses = ("10.0.0.5:8000", "10.0.0.6:8000")
    answer = wire.request_body if buffered else wire.request_headers
    built = answer(wire.routing(addresses), wire.destination_metadata(addresses))
    first = wire.destination(list(addresses), buffered=buffered)
    assert first == built
    assert first.SerializeToString() == built.SerializeToString()
    first.Clear()  # a caller changing its answer does not change the next one
    assert wire.destination(addresses, buffered=buffered) == built


def test_the_response_headers_answer_names_the_endpoint_in_a_fresh_message() -> None:
    answer = wire.response_headers("replica-a")
    (option,) = answer.response_headers.response.header_mutation.set_headers
    assert (option.header.key, option.header.raw_value) == (wire.ENDPOINT_HEADER, b"replica-a")
    assert option.append_action == HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    answer.Clear()
    assert wire.response_headers("replica-a").response_headers.response.header_mutation.set_headers
    assert wire.response_headers(None) == ProcessingResponse(response_headers={"response": CommonResponse()})


def test_the_response_head_reads_status_and_length_as_the_header_values() -> None:
    headers = HeaderMap(
        headers=[
            HeaderValue(key=":status", raw_value=b"200"),
            HeaderValue(key="content-type", raw_value=b"application/json"),
            HeaderValue(key="content-length", value="17"),  # an older gateway's value field
            HeaderValue(key="content-length", raw_value=b"42"),  # a repeated header keeps its last value
        ]
    )
    values = wire.header_values(headers)
    assert wire.response_head(headers) == (values[":status"], values["content-length"]) == ("200", "42")
    assert wire.response_head(HeaderMap()) == ("", None)


def test_destination_overwrites_and_matches_the_metadata() -> None:
    common = wire.routing(["10.0.0.5:8000", "10.0.0.6:8000"])
    (option,) = common.header_mutation.set_headers
    assert option.header.key == wire.DESTINATION
    assert option.header.raw_value == b"10.0.0.5:8000,10.0.0.6:8000"
    assert option.append_action == HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    metadata = wire.destination_metadata(["10.0.0.5:8000", "10.0.0.6:8000"])
    assert metadata.fields["envoy.lb"].struct_value.fields[wire.DESTINATION].string_value == (
        option.header.raw_value.decode()
    )


def test_endpoint_addresses() -> None:
    assert wire.endpoint_address("http://10.0.0.5:8000") == "10.0.0.5:8000"
    assert wire.endpoint_address("http://10.0.0.5") == "10.0.0.5:80"
    assert wire.endpoint_address("https://[fd00::1]:9000/v1") == "[fd00::1]:9000"


def test_subset_hint() -> None:
    assert wire.subset_hint(ProcessingRequest()) is None
    listed = Struct(fields={wire.SUBSET_KEY: Value(list_value=ListValue(values=[Value(string_value="a:1")]))})
    request = ProcessingRequest(metadata_context=Metadata(filter_metadata={wire.SUBSET_NAMESPACE: listed}))
    assert wire.subset_hint(request) == frozenset({"a:1"})
    empty = Struct(fields={wire.SUBSET_KEY: Value(list_value=ListValue())})
    request = ProcessingRequest(metadata_context=Metadata(filter_metadata={wire.SUBSET_NAMESPACE: empty}))
    assert wire.subset_hint(request) == frozenset()


def test_immediate_response_is_an_openai_error() -> None:
    answer = wire.immediate(429, "shed", headers=[("retry-after", "1")]).immediate_response
    assert answer.status.code == 429
    headers = {o.header.key: o.header.raw_value for o in answer.headers.set_headers}
    assert headers == {"content-type": b"application/json", "retry-after": b"1"}
    assert b'"message": "shed"' in answer.body


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools (dev extras) missing"
)
def test_the_committed_modules_match_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "burstsched.epp.pb.generate", str(tmp_path)], check=True, cwd=REPO, timeout=60
    )
    for name in ("ext_proc_pb2.py", "ext_proc_pb2.pyi"):
        generated = tmp_path / "burstsched" / "epp" / "pb" / name
        assert filecmp.cmp(generated, REPO / "burstsched" / "epp" / "pb" / name, shallow=False), name
