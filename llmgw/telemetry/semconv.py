"""Every OpenTelemetry name llmgw emits, in one place (GenAI semantic conventions v1.41.0).

Moving to a newer convention release (see shared/otel-genai.md B4) is an edit to this file only.
"""

from __future__ import annotations

from typing import Final

# Attributes: GenAI
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K: Final = "gen_ai.request.top_k"
GEN_AI_REQUEST_FREQUENCY_PENALTY: Final = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY: Final = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_STOP_SEQUENCES: Final = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_SEED: Final = "gen_ai.request.seed"
GEN_AI_REQUEST_CHOICE_COUNT: Final = "gen_ai.request.choice.count"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"

# Attributes: general
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
HTTP_ROUTE: Final = "http.route"
URL_PATH: Final = "url.path"

# Attributes: llmgw extensions (a provider's reported extras are named by it: Usage.extras)
LLMGW_RETRY_COUNT: Final = "llmgw.upstream.retry_count"
LLMGW_STREAM_OUTCOME: Final = "llmgw.stream.outcome"
LLMGW_REQUEST_ID: Final = "llmgw.request_id"
LLMGW_DEPLOYMENT: Final = "llmgw.deployment"  # "provider:model" that answered (or failed last)
LLMGW_DEPLOYMENTS_TRIED: Final = "llmgw.deployments_tried"
LLMGW_USAGE_SOURCE: Final = "llmgw.usage.source"  # "reported" by the provider, or "estimated"
# The types of the Responses tools a chat-only provider was not offered (hosted ones: web_search...).
LLMGW_OMITTED_TOOLS: Final = "llmgw.responses.omitted_tools"
# Request parameters the answering deployment was not sent (its provider does not accept them).
LLMGW_OMITTED_PARAMS: Final = "llmgw.request.omitted_params"
LLMGW_CACHE_RESULT: Final = "llmgw.cache.result"  # hit | miss | bypass
# Stream events whose data was not JSON: dropped, never relayed.
LLMGW_STREAM_MALFORMED_EVENTS: Final = "llmgw.stream.malformed_events"
# A broken stream finished on another attempt: the span event, and its attributes.
EVENT_STREAM_CONTINUATION: Final = "llmgw.stream.continuation"
LLMGW_CONTINUATION_REASON: Final = "llmgw.continuation.reason"  # the failure that broke the stream
LLMGW_CONTINUATION_MODE: Final = "llmgw.continuation.mode"  # prefill, restart, or none
LLMGW_CONTINUATION_SENT_CHARS: Final = "llmgw.continuation.sent_chars"  # answer text already sent
LLMGW_CONTINUATION_OUTCOME: Final = "llmgw.continuation.outcome"  # continued, or why not
# The deployment that continues the answer (llmgw.deployment: the one whose stream broke).
LLMGW_CONTINUATION_DEPLOYMENT: Final = "llmgw.continuation.deployment"

# Values
OPERATION_CHAT: Final = "chat"
OPERATION_EMBEDDINGS: Final = "embeddings"
# v1.41.0 names no operation for these; llmgw's own values (also the ledger's operation column).
OPERATION_IMAGE_GENERATION: Final = "image_generation"
OPERATION_TEXT_TO_SPEECH: Final = "text_to_speech"
OPERATION_SPEECH_TO_TEXT: Final = "speech_to_text"
# A Messages request's input counted (POST /v1/messages/count_tokens): billed nothing.
OPERATION_COUNT_TOKENS: Final = "count_tokens"
TOKEN_TYPE_INPUT: Final = "input"
TOKEN_TYPE_OUTPUT: Final = "output"

# Metrics: GenAI client (v1.41.0)
METRIC_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
METRIC_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
METRIC_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.operation.time_to_first_chunk"
METRIC_TIME_PER_OUTPUT_CHUNK: Final = "gen_ai.client.operation.time_per_output_chunk"

DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TOKEN_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

# Metrics: gateway
METRIC_GATEWAY_REQUESTS: Final = "llmgw.requests"
METRIC_RATE_LIMIT_REFUSALS: Final = "llmgw.rate_limit.refusals"
METRIC_AUTH_FAILURES: Final = "llmgw.auth.failures"
METRIC_UPSTREAM_RETRIES: Final = "llmgw.upstream.retries"
METRIC_STREAM_MALFORMED_EVENTS: Final = "llmgw.stream.malformed_events"
METRIC_STREAM_CONTINUATIONS: Final = "llmgw.stream.continuations"
METRIC_PROVIDER_COST: Final = "llmgw.provider.cost"  # was llmgw.venice.cost
METRIC_USAGE_LEDGER_DROPPED: Final = "llmgw.usage_ledger.dropped"
METRIC_USAGE_LEDGER_DEAD_LETTERS: Final = "llmgw.usage_ledger.dead_letters"
METRIC_CLIENT_CONNECTION_RESETS: Final = "llmgw.client.connection_resets"
METRIC_CACHE_LOOKUPS: Final = "llmgw.cache.lookups"
METRIC_CACHE_BYTES: Final = "llmgw.cache.bytes"
METRIC_CACHE_EVICTIONS: Final = "llmgw.cache.evictions"
METRIC_UPSTREAM_CONNECTIONS_IN_USE: Final = "llmgw.upstream.connections.in_use"
METRIC_UPSTREAM_CONNECTIONS_WAITING: Final = "llmgw.upstream.connections.waiting"
METRIC_UPSTREAM_CONNECTIONS_LIMIT: Final = "llmgw.upstream.connections.limit"
