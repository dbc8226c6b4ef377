"""Span and attribute names: OpenTelemetry semantic conventions where they exist, ``burstsched.*`` otherwise.

The GenAI and HTTP names are the semantic conventions' own (a test checks them against
``opentelemetry-semantic-conventions``); they are spelt out here so the request path needs no semconv import.
"""

from __future__ import annotations

from typing import Final

# --- GenAI semantic conventions --------------------------------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"

OPERATION_CHAT: Final = "chat"
OPERATION_TEXT_COMPLETION: Final = "text_completion"

# --- HTTP, URL, server, client, error semantic conventions ------------------------------------------------
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
HTTP_ROUTE: Final = "http.route"
HTTP_REQUEST_RESEND_COUNT: Final = "http.request.resend_count"
URL_FULL: Final = "url.full"
URL_PATH: Final = "url.path"
URL_SCHEME: Final = "url.scheme"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
CLIENT_ADDRESS: Final = "client.address"
CLIENT_PORT: Final = "client.port"
NETWORK_PROTOCOL_VERSION: Final = "network.protocol.version"
USER_AGENT_ORIGINAL: Final = "user_agent.original"
ERROR_TYPE: Final = "error.type"

# --- burstsched's own ---------------------------------------------------------------------------------------
REQUEST_ID: Final = "burstsched.front.request.id"
REQUEST_STREAM: Final = "burstsched.front.request.stream"
ENDPOINT: Final = "burstsched.endpoint"
"""The endpoint (replica) name, as in the metrics' ``endpoint`` label."""
WINDOW_ID: Final = "burstsched.window.id"
GROUP_ID: Final = "burstsched.group.id"
GROUP_SIZE: Final = "burstsched.group.size"
GROUP_ROLE: Final = "burstsched.group.role"
GROUP_SHARED_BLOCKS: Final = "burstsched.group.shared_blocks"
ADMISSION_BYPASS: Final = "burstsched.admission.bypass"
ADMISSION_WAITED_S: Final = "burstsched.admission.waited_s"
SCHEDULE_CANDIDATES: Final = "burstsched.schedule.candidates"
SCHEDULE_PLACED_BY: Final = "burstsched.schedule.placed_by"
"""``request`` (ranked for this request alone) or ``window`` (ranked for its group when the window sealed)."""
SCHEDULE_RANKED: Final = "burstsched.schedule.ranked"
"""On the lean ``burstsched.schedule`` event: the candidates in rank order (the first was chosen); the
``burstsched.score.*`` arrays beside it follow the same order."""
PREFIX_INDEX: Final = "burstsched.prefix.index"
"""The index that knew the chosen endpoint's prefix match: ``precise`` (KV events) or ``approximate``."""
PREFIX_MATCHED_BLOCKS: Final = "burstsched.prefix.matched_blocks"
PREFIX_TOTAL_BLOCKS: Final = "burstsched.prefix.total_blocks"
SCORE_PREFIX: Final = "burstsched.score."
"""Prefix of a scorer's clamped score on an endpoint's ``score`` event: ``burstsched.score.<scorer>``."""
SCORE_TOTAL: Final = "burstsched.score.total"
SCORE_RANK: Final = "burstsched.rank"
QUEUE_WAITED_S: Final = "burstsched.queue.waited_s"
QUEUE_PRIORITY: Final = "burstsched.queue.priority"
QUEUE_FLOW: Final = "burstsched.queue.flow"
QUEUE_OVERTOOK: Final = "burstsched.queue.overtook"
"""Requests queued before this one still waiting when it was released (the reordering it benefited from)."""
UPSTREAM_ATTEMPT: Final = "burstsched.upstream.attempt"
UPSTREAM_RESULT: Final = "burstsched.upstream.result"

# --- span and event names -----------------------------------------------------------------------------------
SPAN_ADMISSION: Final = "burstsched.admission"
SPAN_SCHEDULE: Final = "burstsched.schedule"
EVENT_SCORE: Final = "score"
EVENT_SCHEDULE: Final = "burstsched.schedule"
EVENT_QUEUE: Final = "burstsched.queue"
"""On the SERVER span of a request that waited in the flow-control queue, at its release."""
EVENT_FIRST_TOKEN: Final = "first_token"
