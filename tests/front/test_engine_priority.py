"""The priority band written into the forwarded body as vLLM's ``priority`` (flow_control.engine_priority)."""

from __future__ import annotations

import json

from burstsched.framework import ApiKind
from burstsched.front.engine_priority import with_engine_priority
from burstsched.front.request import parse_request


def test_the_band_goes_in_negated_and_the_clients_bytes_follow_untouched() -> None:
    body = b' {"model": "m", "messages": [{"role": "user", "content": "hi \\u00e9"}], "stream": true}'
    parsed = parse_request(ApiKind.CHAT, body)
    urgent = with_engine_priority(parsed, 10)
    assert json.loads(urgent.body) == {**json.loads(body), "priority": -10}
    assert urgent.body.endswith(body[2:])  # the rest as the client wrote it
    assert urgent.payload["priority"] == -10 and urgent.stream and urgent.rendered == parsed.rendered
    sheddable = with_engine_priority(parse_request(ApiKind.COMPLETIONS, b'{"model":"m","prompt":"x"}'), -1)
    assert json.loads(sheddable.body) == {"model": "m", "prompt": "x", "priority": 1}


def test_band_zero_and_a_clients_own_priority_leave_the_body_as_it_came() -> None:
    plain = parse_request(ApiKind.CHAT, b'{"model":"m","messages":[{"role":"user","content":"hi"}]}')
    assert with_engine_priority(plain, 0) is plain
    own = parse_request(
        ApiKind.CHAT, b'{"model":"m","priority":3,"messages":[{"role":"user","content":"x"}]}'
    )
    assert with_engine_priority(own, 10) is own
