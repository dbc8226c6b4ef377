"""A request's priority band, passed on to the replica as vLLM's ``priority`` field.

The flow queue orders what it holds; what it released still waits in the replica's own queue, in arrival
order under vLLM's default FCFS policy. With ``flow_control.engine_priority`` and replicas started with
``--scheduling-policy priority``, the router writes the band into the body it forwards, so the replica too
serves higher bands first (and preempts the lowest first when its KV cache runs out). vLLM serves lower
values first, so the value is the band negated; band 0 (vLLM's default) leaves the body as it came.
"""

from __future__ import annotations

import dataclasses
import json

from burstsched.front.request import ParsedRequest


def with_engine_priority(parsed: ParsedRequest, priority: int) -> ParsedRequest:
    """``parsed`` with ``priority`` (ours: higher goes first) in its body as vLLM's ``priority``; as it is
    when the band is 0 or the client set ``priority`` itself."""
    if priority == 0 or "priority" in parsed.payload:
        return parsed
    payload = {**parsed.payload, "priority": -priority}
    body = parsed.body
    start = body.find(b"{")
    if start < 0 or not parsed.payload:  # not an object with members (parsing let it through): rebuild it
        body = json.dumps(payload, separators=(",", ":")).encode()
    else:  # the field first, the client's bytes after it untouched
        body = body[: start + 1] + b'"priority":' + str(-priority).encode() + b"," + body[start + 1 :]
    return dataclasses.replace(parsed, body=body, payload=payload)
