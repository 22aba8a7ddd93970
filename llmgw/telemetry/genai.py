"""One GenAI client span and its metrics per upstream operation.

A ``ChatObservation`` is opened before the provider is called and finished exactly once, by the
pipeline, when the response (or the stream) ends: completed, failed or cancelled. It only observes:
what a request is charged is accounting's business. Per-chunk work is a clock read and adding
the gap to the stream's own bucket counts, which join the histogram when the stream ends.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import orjson
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from llmgw.accounting.usage import CostReport, Usage
from llmgw.telemetry import semconv as sc
from llmgw.telemetry.local_metrics import AttributeSet, GapHistogram, LocalMeter
from llmgw.telemetry.model_names import metric_model_name

if TYPE_CHECKING:
    from llmgw.providers.base import Deployment

__all__ = ["ChatObservation", "GatewayInstruments", "Outcome", "content_messages"]

# Request fields the conventions name, and the attribute each becomes.
_REQUEST_PARAMETERS: Mapping[str, str] = {
    "max_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "max_completion_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "temperature": sc.GEN_AI_REQUEST_TEMPERATURE,
    "top_p": sc.GEN_AI_REQUEST_TOP_P,
    "top_k": sc.GEN_AI_REQUEST_TOP_K,
    "frequency_penalty": sc.GEN_AI_REQUEST_FREQUENCY_PENALTY,
    "presence_penalty": sc.GEN_AI_REQUEST_PRESENCE_PENALTY,
    "seed": sc.GEN_AI_REQUEST_SEED,
}


class Outcome:
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class GatewayInstruments:
    """Every metric instrument, created once per meter (see local_metrics for why it is ours)."""

    def __init__(self, meter: LocalMeter) -> None:
        self.operation_duration = meter.create_histogram(
            sc.METRIC_OPERATION_DURATION,
            unit="s",
            description="GenAI operation duration",
            boundaries=sc.DURATION_BUCKETS,
        )
        self.token_usage = meter.create_histogram(
            sc.METRIC_TOKEN_USAGE,
            unit="{token}",
            description="Number of input and output tokens used",
            boundaries=sc.TOKEN_BUCKETS,
        )
        self.time_to_first_chunk = meter.create_histogram(
            sc.METRIC_TIME_TO_FIRST_CHUNK,
            unit="s",
            description="Time to receive the first chunk of a streamed response",
            boundaries=sc.DURATION_BUCKETS,
        )
        self.time_per_output_chunk = meter.create_histogram(
            sc.METRIC_TIME_PER_OUTPUT_CHUNK,
            unit="s",
            description="Time between consecutive chunks of a streamed response",
            boundaries=sc.DURATION_BUCKETS,
        )
        self.requests = meter.create_counter(
            sc.METRIC_GATEWAY_REQUESTS, unit="{request}", description="HTTP requests answered"
        )
        self.rate_limit_refusals = meter.create_counter(
            sc.METRIC_RATE_LIMIT_REFUSALS, unit="{request}", description="Requests refused (429)"
        )
        self.auth_failures = meter.create_counter(
            sc.METRIC_AUTH_FAILURES, unit="{request}", description="Requests refused (401)"
        )
        self.upstream_retries = meter.create_counter(
            sc.METRIC_UPSTREAM_RETRIES, unit="{retry}", description="Upstream calls retried"
        )
        self.stream_malformed_events = meter.create_counter(
            sc.METRIC_STREAM_MALFORMED_EVENTS,
            unit="{event}",
            description="Provider stream events that were not JSON, dropped",
        )
        self.stream_continuations = meter.create_counter(
            sc.METRIC_STREAM_CONTINUATIONS,
            unit="{stream}",
            description="Broken streams the gateway tried to finish on another attempt, by outcome",
        )
        self.provider_cost = meter.create_counter(
            sc.METRIC_PROVIDER_COST, unit="USD", description="Cost the provider reported, by model"
        )
        self.usage_ledger_dropped = meter.create_counter(
            sc.METRIC_USAGE_LEDGER_DROPPED,
            unit="{row}",
            description="Usage rows dropped because the ledger queue was full",
        )
        self.usage_ledger_dead_letters = meter.create_counter(
            sc.METRIC_USAGE_LEDGER_DEAD_LETTERS,
            unit="{row}",
            description="Usage rows the database refused, set aside in usage_dead_letters",
        )
        self.client_connection_resets = meter.create_counter(
            sc.METRIC_CLIENT_CONNECTION_RESETS,
            unit="{connection}",
            description="Answers cut off because the caller hung up (counted, not logged)",
        )


def content_messages(messages: Any) -> str:
    """Chat messages in the conventions' JSON form (role + parts); used only when capture is on."""
    converted = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        parts: list[dict[str, Any]] = []
        if isinstance(content, str):
            parts.append({"type": "text", "content": content})
        elif isinstance(content, list):
            parts.extend(
                {"type": "text", "content": part.get("text", "")}
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            )
        converted.append({"role": message.get("role"), "parts": parts})
    return orjson.dumps(converted).decode()


@attrs.frozen(slots=True)
class _MetricSets:
    """The attribute sets of a request's end's metric points, made once for all the requests
    whose (bounded) metric attributes and error type are the same."""

    answered: AttributeSet  # the operation's: time to first chunk, the chunks' gaps
    input_tokens: AttributeSet  # with gen_ai.token.type
    output_tokens: AttributeSet
    cost: AttributeSet  # the requested model's alone
    ended: AttributeSet  # the answered ones and the error type, if any: duration, retries


# Process-wide, like the instruments; bounded as model_names bounds the names in them.
_SETS: dict[tuple[Any, ...], _MetricSets] = {}
_MAX_SETS = 4096


def _metric_sets(attributes: dict[str, Any], error_type: str | None) -> _MetricSets:
    key = (*attributes.items(), error_type)
    sets = _SETS.get(key)
    if sets is None:
        if len(_SETS) >= _MAX_SETS:
            _SETS.clear()
        answered = AttributeSet(attributes)
        sets = _SETS[key] = _MetricSets(
            answered=answered,
            input_tokens=AttributeSet({**attributes, sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_INPUT}),
            output_tokens=AttributeSet({**attributes, sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_OUTPUT}),
            cost=AttributeSet({sc.GEN_AI_REQUEST_MODEL: attributes[sc.GEN_AI_REQUEST_MODEL]}),
            ended=answered
            if error_type is None
            else AttributeSet({**attributes, sc.ERROR_TYPE: error_type}),
        )
    return sets


@attrs.define(slots=True)
class ChatObservation:
    tracer_span: trace.Span
    instruments: GatewayInstruments
    metric_attributes: dict[str, Any]
    provider_cost_report: CostReport | None
    capture_content: bool
    stream: bool
    started: float = attrs.field(factory=time.perf_counter)
    first_chunk_at: float | None = None
    last_chunk_at: float | None = None
    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: list[str] = attrs.field(factory=list)
    usage: Usage | None = None
    usage_source: str = "reported"  # "estimated": set by the pipeline when none was reported
    retries: int = 0
    output_text: list[str] = attrs.field(factory=list)
    finished: bool = False
    deployment: str | None = None
    deployments_tried: int = 0
    chunk_gaps: GapHistogram | None = None  # summed per chunk, recorded once at the end

    @classmethod
    def start(
        cls,
        tracer: trace.Tracer,
        instruments: GatewayInstruments,
        *,
        operation: str,
        provider_name: str,
        server_address: str,
        server_port: int,
        provider_cost_report: CostReport | None,
        body: dict[str, Any],
        model: str,
        stream: bool,
        capture_content: bool,
    ) -> ChatObservation:
        attributes: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: operation,
            sc.GEN_AI_PROVIDER_NAME: provider_name,
            sc.GEN_AI_REQUEST_MODEL: model,
            sc.SERVER_ADDRESS: server_address,
            sc.SERVER_PORT: server_port,
        }
        metric_attributes = dict(attributes)
        if stream:
            attributes[sc.GEN_AI_REQUEST_STREAM] = True
        for field, attribute in _REQUEST_PARAMETERS.items():
            if field not in body:
                continue  # most are not: a lookup without a call
            value = body[field]
            if isinstance(value, int | float) and not isinstance(value, bool):
                attributes[attribute] = value
        stop = body.get("stop")
        if isinstance(stop, str):
            attributes[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = [stop]
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            attributes[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = stop
        choices = body.get("n")
        if isinstance(choices, int) and choices != 1:
            attributes[sc.GEN_AI_REQUEST_CHOICE_COUNT] = choices
        if capture_content and "messages" in body:
            attributes[sc.GEN_AI_INPUT_MESSAGES] = content_messages(body["messages"])
        span = tracer.start_span(
            f"{operation} {model}", kind=SpanKind.CLIENT, attributes=attributes
        )
        return cls(
            tracer_span=span,
            instruments=instruments,
            metric_attributes=metric_attributes,
            provider_cost_report=provider_cost_report,
            capture_content=capture_content,
            stream=stream,
        )

    def deployment_tried(self, deployment: Deployment, tried: int) -> None:
        """A route is about to call its ``tried``-th deployment: it answers unless it fails too."""
        provider = deployment.provider
        self.deployment = deployment.label
        self.deployments_tried = tried
        self.provider_cost_report = provider.cost_report
        answering: dict[str, str | int] = {
            sc.GEN_AI_PROVIDER_NAME: provider.name,
            sc.SERVER_ADDRESS: provider.server_address,
            sc.SERVER_PORT: provider.server_port,
        }
        self.metric_attributes.update(answering)
        self.tracer_span.set_attributes(answering)

    # Streaming hooks ---------------------------------------------------------------------------

    def chunk_arrived(self) -> None:
        now = time.perf_counter()
        if self.first_chunk_at is None:
            self.first_chunk_at = now
            self.chunk_gaps = self.instruments.time_per_output_chunk.gaps()
        else:
            assert self.last_chunk_at is not None
            assert self.chunk_gaps is not None
            self.chunk_gaps.add(now - self.last_chunk_at)
        self.last_chunk_at = now

    def note_document(self, document: dict[str, Any]) -> None:
        """Read finish reasons and (captured) content from a response (its ids: the request's
        record has them, see the pipeline)."""
        choices = document.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                self.finish_reasons.append(reason)
            if self.capture_content:
                message = choice.get("message") or choice.get("delta") or {}
                text = message.get("content") if isinstance(message, dict) else None
                if isinstance(text, str):
                    self.output_text.append(text)

    def note_ids(self, document: dict[str, Any]) -> None:
        """The response's id and model, from the first document that names them."""
        if self.response_id is None and isinstance(document.get("id"), str):
            self.response_id = document["id"]
        if self.response_model is None and isinstance(document.get("model"), str):
            self.response_model = document["model"]

    # Ending ------------------------------------------------------------------------------------

    def _bounded_metric_attributes(self, *, answered: bool) -> dict[str, Any]:
        """The metric attributes with model names only the gateway knows (see model_names)."""
        requested = self.metric_attributes[sc.GEN_AI_REQUEST_MODEL]
        bounded = {
            **self.metric_attributes,
            sc.GEN_AI_REQUEST_MODEL: metric_model_name(requested, answered=answered),
        }
        if self.response_model is not None:
            bounded[sc.GEN_AI_RESPONSE_MODEL] = metric_model_name(
                self.response_model, answered=answered
            )
        return bounded

    def finish(self, *, status: int, outcome: str, error_type: str | None = None) -> None:
        assert not self.finished, "an observation finishes once"
        self.finished = True
        now = time.perf_counter()
        duration = now - self.started
        span = self.tracer_span
        metric_attributes = self._bounded_metric_attributes(answered=status < 400)
        sets = _metric_sets(metric_attributes, error_type)
        span_attributes: dict[str, Any] = {
            sc.LLMGW_RETRY_COUNT: self.retries,
            sc.HTTP_RESPONSE_STATUS_CODE: status,
        }
        if self.stream:
            span_attributes[sc.LLMGW_STREAM_OUTCOME] = outcome
        if self.deployment is not None:
            span_attributes[sc.LLMGW_DEPLOYMENT] = self.deployment
            span_attributes[sc.LLMGW_DEPLOYMENTS_TRIED] = self.deployments_tried
        if self.response_id is not None:
            span_attributes[sc.GEN_AI_RESPONSE_ID] = self.response_id
        if self.response_model is not None:
            span_attributes[sc.GEN_AI_RESPONSE_MODEL] = self.response_model
        if self.finish_reasons:
            span_attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = self.finish_reasons
        elif self.stream and outcome != Outcome.COMPLETED:
            span_attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = ["error"]
        ttfc = None
        if self.first_chunk_at is not None:
            ttfc = self.first_chunk_at - self.started
            span_attributes[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = ttfc
            self.instruments.time_to_first_chunk.record(ttfc, sets.answered)
        if self.chunk_gaps is not None:
            # The gaps of every chunk that arrived, as the points they would have been: chunks
            # came, so the models answered; an error type describes the operation's end, not
            # the chunks before it (only the operation's duration carries it).
            self.instruments.time_per_output_chunk.add_all(
                self.chunk_gaps,
                sets.answered if status < 400 else self._bounded_metric_attributes(answered=True),
            )
        if self.usage is not None:
            span_attributes[sc.LLMGW_USAGE_SOURCE] = self.usage_source
            self._record_usage(self.usage, span_attributes, sets)
        if self.capture_content and self.output_text:
            span_attributes[sc.GEN_AI_OUTPUT_MESSAGES] = orjson.dumps(
                [
                    {
                        "role": "assistant",
                        "parts": [{"type": "text", "content": "".join(self.output_text)}],
                        "finish_reason": self.finish_reasons[0] if self.finish_reasons else None,
                    }
                ]
            ).decode()
        if error_type is not None:
            span_attributes[sc.ERROR_TYPE] = error_type
            span.set_status(Status(StatusCode.ERROR, error_type))
        span.set_attributes(span_attributes)
        self.instruments.operation_duration.record(duration, sets.ended)
        if self.retries:
            self.instruments.upstream_retries.add(self.retries, sets.ended)
        span.end()

    def abandon(self) -> None:
        """End the span of an observation whose finish failed part way (or never ran): an error,
        with no figures, so no span is left open."""
        self.finished = True
        span = self.tracer_span
        if span.is_recording():
            span.set_status(Status(StatusCode.ERROR, "internal_error"))
            span.set_attribute(sc.ERROR_TYPE, "internal_error")
            span.end()

    def _record_usage(
        self, usage: Usage, span_attributes: dict[str, Any], sets: _MetricSets
    ) -> None:
        optional = (
            (sc.GEN_AI_USAGE_INPUT_TOKENS, usage.input_tokens),
            (sc.GEN_AI_USAGE_OUTPUT_TOKENS, usage.output_tokens),
            (sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, usage.cache_read_input_tokens),
            (sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, usage.cache_creation_input_tokens),
            (sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, usage.reasoning_output_tokens),
        )
        for attribute, value in optional:
            if value is not None:
                span_attributes[attribute] = value
        span_attributes.update(usage.extras)  # each under the name its provider gave it
        token_usage = self.instruments.token_usage
        if usage.input_tokens is not None:
            token_usage.record(usage.input_tokens, sets.input_tokens)
        if usage.output_tokens is not None:
            token_usage.record(usage.output_tokens, sets.output_tokens)
        if usage.cost_usd is not None:
            self.instruments.provider_cost.add(usage.cost_usd, sets.cost)
