from __future__ import annotations

import json

import pytest

from burstsched.config import PrefixHashingConfig
from burstsched.framework import ApiKind
from burstsched.front.request import RequestError, parse_request


@pytest.mark.parametrize(
    ("api", "body", "param"),
    [
        (ApiKind.CHAT, b"\xff\xfe{}", None),
        (ApiKind.CHAT, b"{not json", None),
        (ApiKind.CHAT, b"[1, 2]", None),
        (ApiKind.CHAT, b'{"model": "m"}', "messages"),
        (ApiKind.CHAT, b'{"model": "m", "messages": "hi"}', "messages"),
        (ApiKind.CHAT, b'{"model": "m", "messages": []}', "messages"),
        (ApiKind.CHAT, b'{"model": "m", "messages": [{"content": "x"}]}', "messages[0].role"),
        (
            ApiKind.CHAT,
            b'{"model": "m", "messages": [{"role": "user", "content": 5}]}',
            "messages[0].content",
        ),
        (ApiKind.CHAT, b'{"model": 5, "messages": [{"role": "user", "content": "x"}]}', "model"),
        (ApiKind.CHAT, b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
        (ApiKind.CHAT, b'{"messages": [{"role": "user", "content": "x"}], "tools": {}}', "tools"),
        (ApiKind.COMPLETIONS, b'{"model": "m"}', "prompt"),
        (ApiKind.COMPLETIONS, b'{"model": "m", "prompt": 3}', "prompt"),
        (ApiKind.COMPLETIONS, b'{"model": "m", "prompt": [1, -2]}', "prompt"),
        (ApiKind.COMPLETIONS, b'{"model": "m", "prompt": [99999999999]}', "prompt"),
        (ApiKind.COMPLETIONS, b'{"model": "m", "prompt": "x", "cache_salt": 1}', "cache_salt"),
    ],
)
def test_bad_bodies_are_400_with_param(api: ApiKind, body: bytes, param: str | None) -> None:
    with pytest.raises(RequestError) as excinfo:
        parse_request(api, body)
    assert excinfo.value.status == 400
    assert excinfo.value.param == param


def test_valid_bodies_parse_and_forward_unchanged() -> None:
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x" * 600}], "stream": True}
    ).encode()
    parsed = parse_request(ApiKind.CHAT, body)
    assert parsed.body is body and parsed.stream and parsed.model == "m"
    request = parsed.to_sched_request("id-1", "m", PrefixHashingConfig())
    assert len(request.block_hashes) == len(parsed.rendered) // 256 == 2
    for prompt in ("text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        assert parse_request(ApiKind.COMPLETIONS, json.dumps({"prompt": prompt}).encode()).model is None
