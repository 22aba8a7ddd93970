"""AWS Bedrock's runtime API as an upstream (``kind = "bedrock"``).

The connection pool, timeouts, retries and bounded reads are the OpenAI-compatible adapter's; what
differs is the API, and that every attempt is signed (SigV4, ``providers.aws``) with the
credentials of AWS's standard chain. The endpoint is ``https://bedrock-runtime.{region}.amazonaws.com``
unless ``endpoint_url`` (a VPC endpoint) or ``base_url`` names another; the model id, which may hold
``:`` and ``/`` (inference profiles, ARNs), is one encoded path segment, and signed as such.

    chat, Responses, Messages (non-Anthropic model)   Converse / ConverseStream, through Messages
                                                      (``translation.converse``)
    /v1/messages for an Anthropic model              InvokeModel / InvokeModelWithResponseStream,
                                                      the caller's Messages body passed through
    /v1/messages/count_tokens                        CountTokens
    /v1/embeddings                                   InvokeModel with Titan's or Cohere's body

A model is Anthropic's when its id names it (``anthropic.claude-...``, ``us.anthropic.claude-...``,
an ARN ending in one). Streams come as AWS's binary event stream, decoded frame by frame as it
arrives (botocore's parser checks each frame's CRCs) and relayed as SSE. Errors are Bedrock's
exceptions, given the statuses the gateway's routing reads: ``ThrottlingException`` 429,
``ModelNotReadyException`` 503, ``ValidationException`` for a too-long input the context-length
class, ``AccessDeniedException`` the credentials' class (502 ``upstream_auth_failed``).
"""

from __future__ import annotations

import base64
import logging
import re
import struct
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final, Protocol
from urllib.parse import quote

import attrs
import orjson
from aiohttp.typedefs import StrOrURL
from yarl import URL

from llmgw.config.converter import check
from llmgw.errors import InvalidRequest, UpstreamAuthFailed
from llmgw.providers.anthropic import as_messages_errors
from llmgw.providers.aws import AwsSigner, EventStreamBuffer, ParserError
from llmgw.providers.base import (
    ChatStream,
    UpstreamCall,
    UpstreamResponse,
    UpstreamStream,
)
from llmgw.providers.json_bodies import (
    answer_document,
    counted_tokens,
    invalid_answer,
    with_json_body,
)
from llmgw.providers.openai_compatible import OpenAICompatibleProvider
from llmgw.providers.plugin import Capabilities, ProviderPlugin, ProviderSetup
from llmgw.providers.translated_stream import TranslatedStream
from llmgw.translation.anthropic_stream import sse_event
from llmgw.translation.chat_to_messages import chat_to_messages, trims_prefill
from llmgw.translation.converse import ConverseEvents, converse_request, message_from_converse
from llmgw.translation.messages_to_chat import ChatChunks, completion_from_message

__all__ = ["ANTHROPIC_VERSION", "PLUGIN", "BedrockOptions", "BedrockProvider"]

log = logging.getLogger(__name__)

# What Bedrock's Anthropic models take in the body instead of the anthropic-version header.
ANTHROPIC_VERSION: Final = "bedrock-2023-05-31"
_EVENT_STREAM: Final = "application/vnd.amazon.eventstream"
_JSON: Final = "application/json"
_REGION: Final = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")
_ANTHROPIC_MODEL: Final = re.compile(r"(^|[./])anthropic\.")
_NO_MODELS: Final = UpstreamResponse(200, b'{"object":"list","data":[]}', _JSON)

# Bedrock's exceptions whose status the gateway reads otherwise than Bedrock sends it.
_STATUSES: Final = {
    "ModelNotReadyException": 503,  # the model is being loaded: retried, as an overload is
    "ModelErrorException": 502,  # the model failed on this request: another may not
    "ThrottlingException": 429,
    "ServiceQuotaExceededException": 429,
    "ServiceUnavailableException": 503,
}
# How Bedrock says an input is longer than the model takes (its own words, and Claude's).
_TOO_LONG: Final = ("input is too long", "too many input tokens", "prompt is too long")


# Every Claude model on Bedrock thinks and continues a trailing assistant message, and takes its
# Messages body as it is; other models are reached through Converse, which carries both too.
BEDROCK_CAPABILITIES: Final = Capabilities(reasoning=True, prefill=True, native_messages=True)


def _endpoint(options: BedrockOptions) -> str:
    return options.endpoint_url or f"https://bedrock-runtime.{options.region}.amazonaws.com"


def _optional_url(value: str | None) -> bool:
    return value is None or value.startswith(("https://", "http://"))


@attrs.frozen
class BedrockOptions:
    """The keys of a ``kind = "bedrock"`` entry beyond every provider's."""

    region: str = attrs.field(
        validator=check(lambda r: _REGION.fullmatch(r) is not None, 'an AWS region, "us-east-1"')
    )
    # A VPC endpoint, or a test's fake; the region's public endpoint when not set.
    endpoint_url: str | None = attrs.field(
        default=None, validator=check(_optional_url, "an http(s) URL")
    )
    profile: str | None = None  # a shared-config profile; the chain's default when not set


class BedrockProvider(OpenAICompatibleProvider):
    def __init__(self, *, signer: AwsSigner, **options: Any) -> None:
        super().__init__(**options)
        self._signer = signer

    # -- transport: URLs, signatures, errors --------------------------------------------------

    def _url(self, path: str, model: str | None) -> str:
        if not model or model in (".", ".."):
            raise InvalidRequest(f"{model!r} is not a Bedrock model id.", param="model")
        return f"{self._base_url}/model/{quote(model, safe='')}{path}"

    async def _authorize(
        self, url: StrOrURL, call: UpstreamCall, headers: Mapping[str, str], *, renew: bool
    ) -> tuple[StrOrURL, Mapping[str, str]]:
        # Signed afresh each attempt (a retry's date is its own); the URL is sent as encoded,
        # as it was signed: aiohttp would otherwise decode the model's "%3A" to ":".
        signed = await self._signer.sign(str(url), headers, call.body)
        return URL(str(url), encoded=True), signed

    def _check_credentials_accepted(self, status: int) -> None:
        if status in (401, 403):
            log.warning("provider %s refused the AWS credentials (HTTP %d)", self.name, status)
            raise UpstreamAuthFailed.gateway_credentials(
                self.name,
                f"refused the gateway's AWS credentials (HTTP {status}): their role may lack "
                "bedrock:InvokeModel for this model, or the model access is not enabled",
            )

    def _openai_error(
        self, answer: UpstreamResponse, headers: Mapping[str, str]
    ) -> UpstreamResponse:
        return _error_answer(answer, headers.get("x-amzn-ErrorType", ""))

    async def _send(
        self, operation: str, call: UpstreamCall, body: Any
    ) -> tuple[UpstreamResponse, int | None]:
        """POST ``body`` and read the answer, with the input tokens InvokeModel reports in a
        header (Cohere's embeddings have no count in their body)."""
        call = with_json_body(call, body)
        slot = await self.connections.acquire(call.deadline)
        try:
            response, retries, _ = await self._post(operation, call, accept=_JSON, streaming=False)
            tokens = response.headers.get("X-Amzn-Bedrock-Input-Token-Count", "")
            answer = await self._read_answer(response, retries)
        finally:
            slot.release()
        return answer, int(tokens) if tokens.isdigit() else None

    async def _open(
        self, operation: str, call: UpstreamCall, body: Any, translator: _Translator
    ) -> UpstreamStream:
        stream = await super().forward_stream(
            operation, with_json_body(call, body), accept=_EVENT_STREAM
        )
        return _EventStream(stream, self.name, translator)

    # -- the Provider's operations ------------------------------------------------------------

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        messages = chat_to_messages(orjson.loads(call.body))
        answer, _ = await self._send("/converse", call, converse_request(messages))
        message = message_from_converse(answer_document(answer, self.name), model=_model(call))
        completion = completion_from_message(message, created=int(time.time()))
        return attrs.evolve(answer, body=orjson.dumps(completion), content_type=_JSON)

    async def stream_chat_completion(self, call: UpstreamCall) -> ChatStream:
        body = orjson.loads(call.body)
        options = body.get("stream_options")
        chunks = ChatChunks(
            created=int(time.time()),
            include_usage=isinstance(options, dict) and options.get("include_usage") is True,
            trimmed_prefill=trims_prefill(body),
        )
        translator = _ConverseAsChat(ConverseEvents(model=_model(call)), chunks)
        request = converse_request(chat_to_messages(body))
        return await self._open("/converse-stream", call, request, translator)

    async def embeddings(self, call: UpstreamCall) -> UpstreamResponse:
        request = orjson.loads(call.body)
        model = _model(call)
        inputs = _embedding_inputs(request.get("input"))
        vectors: Any
        if "cohere." in model:
            body = {"texts": inputs, "input_type": "search_document"}
            answer, counted = await self._send("/invoke", call, body)
            vectors = answer_document(answer, self.name).get("embeddings")
            if isinstance(vectors, dict):  # Cohere v4 (and v3 when types were asked): by type
                vectors = vectors.get("float")
            tokens = counted or 0
        elif "titan-embed" in model:
            vectors, tokens = [], 0
            for text in inputs:  # Titan embeds one text a call
                titan: dict[str, Any] = {"inputText": text}
                if isinstance(request.get("dimensions"), int):
                    titan["dimensions"] = request["dimensions"]
                answer, _ = await self._send("/invoke", call, titan)
                document = answer_document(answer, self.name)
                vectors.append(document.get("embedding"))
                count = document.get("inputTextTokenCount")
                tokens += count if isinstance(count, int) else 0
        else:
            raise InvalidRequest(
                f"The provider {self.name} (Bedrock) embeds with Amazon Titan and Cohere models; "
                f"{model!r} is neither.",
                param="model",
            )
        if not isinstance(vectors, list) or len(vectors) != len(inputs):
            raise invalid_answer(self.name)
        as_base64 = request.get("encoding_format") == "base64"
        result = {
            "object": "list",
            "data": [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": _base64_floats(v) if as_base64 else v,
                }
                for i, v in enumerate(vectors)
            ],
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return attrs.evolve(answer, body=orjson.dumps(result), content_type=_JSON)

    async def forward(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        model = _model(call)
        body = orjson.loads(call.body)
        with as_messages_errors():
            if path == "/messages/count_tokens":
                return await self._count_tokens(call, body)
            if path != "/messages":
                raise self._not_offered(path)
            if _is_anthropic(model):
                answer, _ = await self._send("/invoke", call, _invoke_body(body, call))
                return attrs.evolve(answer, content_type=_JSON)
            answer, _ = await self._send("/converse", call, converse_request(body))
        message = message_from_converse(answer_document(answer, self.name), model=model)
        return attrs.evolve(answer, body=orjson.dumps(message), content_type=_JSON)

    async def forward_stream(self, path: str, call: UpstreamCall, *, accept: str) -> UpstreamStream:
        if path != "/messages":
            raise self._not_offered(path)
        model = _model(call)
        body = orjson.loads(call.body)
        with as_messages_errors():
            if _is_anthropic(model):
                invoke = _invoke_body(body, call)
                return await self._open("/invoke-with-response-stream", call, invoke, _Invoked())
            translator = _ConverseAsMessages(ConverseEvents(model=model))
            return await self._open("/converse-stream", call, converse_request(body), translator)

    async def _count_tokens(self, call: UpstreamCall, body: dict[str, Any]) -> UpstreamResponse:
        model = _model(call)
        if _is_anthropic(model):
            invoke = orjson.dumps(_invoke_body({**body, "max_tokens": 1}, call))
            request = {"input": {"invokeModel": {"body": base64.b64encode(invoke).decode()}}}
        else:
            converse = converse_request(body)
            fields = ("messages", "system", "toolConfig", "additionalModelRequestFields")
            request = {"input": {"converse": {k: converse[k] for k in fields if k in converse}}}
        answer, _ = await self._send("/count-tokens", call, request)
        return counted_tokens(answer, self.name, "inputTokens")

    def _not_offered(self, path: str) -> InvalidRequest:
        return InvalidRequest(
            f"The model's provider {self.name} (Bedrock) has no {path}.", param="model"
        )

    async def list_models(self, deadline: float) -> UpstreamResponse:
        # Bedrock's runtime lists no models (its control plane does, with other permissions):
        # callers reach a Bedrock provider through aliases and "provider/model" names.
        return _NO_MODELS


def _from_setup(setup: ProviderSetup[BedrockOptions]) -> BedrockProvider:
    options = setup.options
    signer = AwsSigner(
        provider=setup.name, service="bedrock", region=options.region, profile=options.profile
    )
    return BedrockProvider.from_setup(setup, signer=signer)


PLUGIN: Final[ProviderPlugin[BedrockOptions]] = ProviderPlugin(
    factory=_from_setup,
    options=BedrockOptions,
    capabilities=BEDROCK_CAPABILITIES,
    summary="AWS Bedrock (Converse for any model, Claude's Messages as sent; SigV4, AWS credentials)",
    default_base_url=_endpoint,
)


# -- helpers -------------------------------------------------------------------------------------


def _model(call: UpstreamCall) -> str:
    if not call.model:
        raise InvalidRequest("model: a Bedrock model id is required.", param="model")
    return call.model


def _is_anthropic(model: str) -> bool:
    return _ANTHROPIC_MODEL.search(model) is not None


def _invoke_body(body: dict[str, Any], call: UpstreamCall) -> dict[str, Any]:
    """The caller's Messages body as Bedrock's Claude takes it: the model is in the URL, the
    operation says whether to stream, and the version and beta flags are in the body."""
    invoke = {k: v for k, v in body.items() if k not in ("model", "stream")}
    invoke["anthropic_version"] = ANTHROPIC_VERSION
    flags = [f.strip() for f in call.caller_headers.get("anthropic-beta", "").split(",")]
    flags = [f for f in flags if f]
    if flags:
        already = invoke.get("anthropic_beta")
        invoke["anthropic_beta"] = [*(already if isinstance(already, list) else []), *flags]
    return invoke


def _embedding_inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    raise InvalidRequest(
        "input: Bedrock embeds text: a string or a list of strings.", param="input"
    )


def _base64_floats(vector: Any) -> str:
    floats = [float(v) for v in vector]
    return base64.b64encode(struct.pack(f"<{len(floats)}f", *floats)).decode()


def _error_answer(answer: UpstreamResponse, header: str) -> UpstreamResponse:
    """A Bedrock error answer in OpenAI's error shape, which the routing reads and a chat caller
    gets (a Messages caller gets Anthropic's, see anthropic.as_messages_errors); the exception's name is the
    ``type``, a too-long input has the ``context_length_exceeded`` code."""
    try:
        document = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        document = None
    document = document if isinstance(document, dict) else {}
    kind = header.split(":")[0] or str(document.get("__type", "")).rpartition("#")[2]
    message = document.get("message") or document.get("Message")
    text = message if isinstance(message, str) and message else f"Bedrock answered {answer.status}."
    too_long = kind == "ValidationException" and any(m in text.lower() for m in _TOO_LONG)
    error = {
        "message": text,
        "type": kind or "BedrockError",
        "param": None,
        "code": "context_length_exceeded" if too_long else None,
    }
    status = _STATUSES.get(kind, answer.status)
    return attrs.evolve(
        answer, status=status, body=orjson.dumps({"error": error}), content_type=_JSON
    )


# -- streams -------------------------------------------------------------------------------------


class _Translator(Protocol):
    """What one stream's events become for its caller."""

    def feed(self, kind: str, event: dict[str, Any]) -> list[bytes]:
        """The bytes for one event (``:event-type`` ``kind``, its JSON payload)."""
        ...

    def end(self) -> list[bytes] | None:
        """The last bytes once the stream has ended; None when it ended before its last event."""
        ...


class _ConverseAsChat:
    def __init__(self, events: ConverseEvents, chunks: ChatChunks) -> None:
        self._events = events
        self._chunks = chunks

    def feed(self, kind: str, event: dict[str, Any]) -> list[bytes]:
        return self._chat(self._events.feed(kind, event))

    def end(self) -> list[bytes] | None:
        last = self._chat(self._events.finish())
        return last if self._events.finished else None

    def _chat(self, events: list[dict[str, Any]]) -> list[bytes]:
        return [
            b"data: " + (chunk if isinstance(chunk, bytes) else orjson.dumps(chunk)) + b"\n\n"
            for event in events
            for chunk in self._chunks.feed(event)
        ]


class _ConverseAsMessages:
    def __init__(self, events: ConverseEvents) -> None:
        self._events = events

    def feed(self, kind: str, event: dict[str, Any]) -> list[bytes]:
        return [sse_event(e["type"], e) for e in self._events.feed(kind, event)]

    def end(self) -> list[bytes] | None:
        last = [sse_event(e["type"], e) for e in self._events.finish()]
        return last if self._events.finished else None


class _Invoked:
    """InvokeModelWithResponseStream's ``chunk`` events: each one Messages event, base64 JSON."""

    def __init__(self) -> None:
        self._stopped = False

    def feed(self, kind: str, event: dict[str, Any]) -> list[bytes]:
        if kind != "chunk" or not isinstance(event.get("bytes"), str):
            return []
        document = orjson.loads(base64.b64decode(event["bytes"]))
        if not isinstance(document, dict) or not isinstance(document.get("type"), str):
            return []
        document.pop("amazon-bedrock-invocationMetrics", None)  # Bedrock's, not Messages'
        self._stopped = self._stopped or document["type"] == "message_stop"
        return [sse_event(document["type"], document)]

    def end(self) -> list[bytes] | None:
        return [] if self._stopped else None


class _EventStream(TranslatedStream):
    """An AWS event stream read frame by frame as it arrives, relayed as its translator says.

    A frame is relayed as soon as it is whole, so tokens reach the caller as Bedrock sends them.
    An exception frame, a frame that fails its checks, or an end before the answer's last event
    is a broken stream (``upstream_stream_interrupted``), which the route may continue elsewhere.
    """

    def __init__(self, upstream: UpstreamStream, provider: str, translator: _Translator) -> None:
        super().__init__(upstream, provider)
        self._translator = translator

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        frames = EventStreamBuffer()
        async for data in self._upstream.chunks():
            frames.add_data(data)
            out: list[bytes] = []
            try:
                for frame in frames:
                    out.extend(self._frame(frame.headers, frame.payload))
            except ParserError as exc:
                raise self.interrupted(
                    f"sent a frame that is not valid ({type(exc).__name__})"
                ) from None
            if out:
                yield b"".join(out)
        last = self._translator.end()
        if last is None:
            raise self.interrupted("ended the stream before the answer was complete")
        if last:
            yield b"".join(last)

    def _frame(self, headers: Mapping[str, Any], payload: bytes) -> list[bytes]:
        message_type = headers.get(":message-type")
        if message_type == "event":
            try:
                event = orjson.loads(payload) if payload else {}
            except orjson.JSONDecodeError:
                raise self.interrupted("sent an event that is not JSON") from None
            kind = headers.get(":event-type")
            if not isinstance(event, dict) or not isinstance(kind, str):
                return []
            try:
                return self._translator.feed(kind, event)
            except ValueError:  # a chunk whose bytes are not base64 JSON
                raise self.interrupted(f"sent a {kind} event that is not valid") from None
        # An exception (or error) frame: Bedrock's failure mid-stream, with its type and message.
        kind = headers.get(":exception-type") or headers.get(":error-code") or "error"
        try:
            message = orjson.loads(payload).get("message")
        except (orjson.JSONDecodeError, AttributeError):
            message = None
        said = f": {message}" if isinstance(message, str) else ""
        raise self.interrupted(f"ended the stream with {kind}{said}")
