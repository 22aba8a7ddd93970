"""Images and audio: POST /v1/images/generations, /v1/audio/speech and /v1/audio/transcriptions.

Forwarded to the route's provider like chat completions are (keys, limits, allowlists, telemetry,
a ledger row each); only their bodies differ. Speech is relayed to the client as the provider sends
it, never buffered; a transcription upload is multipart, bounded by AUDIO_UPLOAD_LIMIT_BYTES rather
than REQUEST_BODY_LIMIT_BYTES, and re-encoded for the provider.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from typing import Any

import aiohttp
import attrs
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from llmgw import app_keys
from llmgw.accounting import metering
from llmgw.api.body import read_json_object
from llmgw.api.pipeline import (
    CLIENT_CLOSED_REQUEST,
    Exchange,
    Operation,
    UpstreamRequest,
    observe_upstream,
    proxy,
    start_call,
)
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.errors import (
    GatewayError,
    InvalidRequest,
    RequestTimeout,
    UnsupportedMediaType,
)
from llmgw.providers.base import UpstreamCall, UpstreamStream
from llmgw.routing.fallback import FallbackChain
from llmgw.telemetry import semconv as sc
from llmgw.telemetry.genai import Outcome

__all__ = ["create_image", "create_speech", "create_transcription"]

_READ_SIZE = 64 * 1024


def _require_model(fields: dict[str, Any]) -> str:
    model = fields.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("'model' must be a non-empty string.", param="model")
    return model


def _require_text(fields: dict[str, Any], name: str) -> None:
    value = fields.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"'{name}' must be a non-empty string.", param=name)


def _validate_image(body: dict[str, Any]) -> tuple[str, bool]:
    model = _require_model(body)
    _require_text(body, "prompt")
    return model, False


IMAGES = Operation(
    name=sc.OPERATION_IMAGE_GENERATION,
    validate=_validate_image,
    complete=lambda provider, call: provider.forward("/images/generations", call),
    produces_output=False,
    sends_chat=False,
    meter=metering.IMAGES,
)


async def create_image(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    return await proxy(request, key, IMAGES)


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # relayed as the provider sent it; billed by the upload's length
    return document if isinstance(document, dict) else None


# Speech ----------------------------------------------------------------------------------------


async def create_speech(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    raw, body = await read_json_object(request)
    model = _require_model(body)
    _require_text(body, "input")
    upstream = UpstreamRequest(
        sc.OPERATION_TEXT_TO_SPEECH,
        model,
        True,
        body,
        raw,
        produces_output=False,
        metered=metering.SPEECH.requested(body),
    )
    route, call, exchange = await start_call(request, key, upstream)
    opened = await observe_upstream(
        exchange,
        functools.partial(_open_speech, route, call, exchange),
        translate_errors=False,
    )
    if isinstance(opened, web.StreamResponse):
        return opened  # the provider's error, forwarded
    exchange.observation.retries = opened.retries
    return await _relay_audio(request, opened, exchange)


async def _open_speech(
    route: FallbackChain, call: UpstreamCall, exchange: Exchange
) -> UpstreamStream:
    answer = await route.first_answer(
        call, lambda provider, c: provider.forward_stream("/audio/speech", c, accept="*/*")
    )
    return exchange.answered(answer)


async def _relay_audio(
    request: web.Request, upstream: UpstreamStream, exchange: Exchange
) -> web.StreamResponse:
    """The provider's audio, written to the client chunk by chunk as it arrives."""
    observation, record = exchange.observation, exchange.record
    response = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": upstream.content_type or "application/octet-stream",
            "Cache-Control": "no-cache",
        },
    )
    outcome, status = Outcome.CANCELLED, CLIENT_CLOSED_REQUEST
    error_type: str | None = "cancelled"
    try:
        await response.prepare(request)
        async for data in upstream.chunks():
            observation.chunk_arrived()
            if record.first_chunk_at is None:
                record.first_chunk_at = time.perf_counter()
            await response.write(data)
        await response.write_eof()
        outcome, error_type, status = Outcome.COMPLETED, None, 200
    except GatewayError as error:
        # Audio has no error frame: the connection is cut so the client sees a truncated body.
        outcome, error_type, status = Outcome.FAILED, error.error_kind, 200
        if request.transport is not None:
            request.transport.abort()
    finally:
        await upstream.close()
        exchange.end(status, outcome, error_type)
    return response


# Transcriptions --------------------------------------------------------------------------------


@attrs.frozen
class _Upload:
    fields: dict[str, str]
    file: bytes
    filename: str
    file_type: str

    def encode(self, model: str) -> bytes:
        return _multipart({**self.fields, "model": model}, self, _BOUNDARY)


_BOUNDARY = "llmgw-" + os.urandom(12).hex()
_FORM_TYPE = f"multipart/form-data; boundary={_BOUNDARY}"


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\r", " ").replace("\n", " ")


def _multipart(fields: dict[str, str], upload: _Upload, boundary: str) -> bytes:
    parts: list[bytes] = []
    for name, value in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{_quoted(name)}"\r\n\r\n'.encode(
                "utf-8", errors="replace"
            )
            + value.encode("utf-8", errors="replace")
            + b"\r\n"
        )
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="{_quoted(upload.filename)}"\r\nContent-Type: {upload.file_type}\r\n\r\n'.encode(
            "utf-8", errors="replace"
        )
        + upload.file
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts)


async def _read_upload(request: web.Request) -> _Upload:
    if request.content_type != "multipart/form-data":
        raise UnsupportedMediaType(
            f"Content-Type must be multipart/form-data, not {request.content_type or 'missing'!r}."
        )
    # The route's limit is AUDIO_UPLOAD_LIMIT_BYTES; the parts held count against the memory all
    # bodies may hold (a declared length: refused over the limit, reserved before it arrives).
    allowance = request[app_keys.BODY_ALLOWANCE]
    await allowance.hold(request.content_length or 0)
    fields: dict[str, str] = {}
    file: bytes | None = None
    filename, file_type = "audio", "application/octet-stream"
    size = 0
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, aiohttp.BodyPartReader):
                raise InvalidRequest("Nested multipart bodies are not supported.")
            data = bytearray()
            while chunk := await part.read_chunk(_READ_SIZE):
                size += len(chunk)
                await allowance.hold(size, arriving=True)
                data.extend(chunk)
            if part.name == "file":
                file = bytes(data)
                filename = part.filename or filename
                file_type = part.headers.get("Content-Type", file_type)
            elif part.name:
                fields[part.name] = data.decode("utf-8", errors="replace")
    except (ValueError, AssertionError, RuntimeError, HttpProcessingError) as exc:
        raise InvalidRequest(f"The multipart body is malformed ({type(exc).__name__}).") from None
    if file is None:
        raise InvalidRequest("'file' is required: the audio to transcribe.", param="file")
    return _Upload(fields, file, filename, file_type)


async def create_transcription(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    settings = request.app[app_keys.SETTINGS]
    try:
        async with asyncio.timeout(settings.request_timeout_seconds):
            upload = await _read_upload(request)
    except TimeoutError:
        raise RequestTimeout(
            f"The upload did not arrive within {settings.request_timeout_seconds:g}s "
            "(REQUEST_TIMEOUT_SECONDS)."
        ) from None
    model = _require_model(upload.fields)
    meter = metering.transcription_meter(upload.file)
    upstream = UpstreamRequest(
        sc.OPERATION_SPEECH_TO_TEXT,
        model,
        False,
        dict(upload.fields),
        upload.encode(model),
        content_type=_FORM_TYPE,
        encode_for_model=upload.encode,
        metered=meter.requested(upload.fields),
    )
    route, call, exchange = await start_call(request, key, upstream)
    return await observe_upstream(
        exchange,
        functools.partial(_transcribe, route, call, exchange, meter),
        translate_errors=False,
    )


async def _transcribe(
    route: FallbackChain, call: UpstreamCall, exchange: Exchange, meter: metering.Meter
) -> web.StreamResponse:
    answer = await route.first_answer(
        call, lambda provider, c: provider.forward("/audio/transcriptions", c)
    )
    result = exchange.answered(answer)
    exchange.observation.retries = result.retries
    document = _json_object(result.body) if "json" in result.content_type else None
    if document is not None:
        exchange.metered = meter.answered(document) or exchange.metered
    # JSON or text/plain (response_format=text), as the provider answered.
    return web.Response(
        status=result.status, body=result.body, headers={"Content-Type": result.content_type}
    )
