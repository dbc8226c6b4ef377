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
from burstsched.epp.pb.ext_proc_pb2 import HeaderValueOption, Metadata, ProcessingRequest

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
