"""A stream of chat chunk events that were recorded (a cache hit, a follower of an answer in
flight) replayed to a caller: in chat completions as they are, or through a translator into
another API's events; the usage chunk hidden from a caller who did not ask for it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, Callable, Sequence

import orjson
from aiohttp import web

from llmgw.errors import GatewayError
from llmgw.providers.sse import event_data
from llmgw.streaming.relay import STREAM_HEADERS, sse_error_event
from llmgw.streaming.translate import StreamTranslator

__all__ = ["DONE_EVENT", "replay_stream"]

DONE_EVENT = b"data: [DONE]\n\n"


async def replay_stream(
    request: web.Request,
    events: Sequence[bytes] | AsyncIterable[bytes],
    *,
    hide_usage_chunk: bool,
    translator: StreamTranslator | None,
    error_event: Callable[[GatewayError], bytes] = sse_error_event,
    end: bytes = DONE_EVENT,
) -> tuple[web.StreamResponse, GatewayError | None]:
    """Send ``events`` (no ``[DONE]``), then ``end`` (chat's ``[DONE]``; nothing after a Messages
    stream's own ``message_stop``); a GatewayError they raise ends the stream with the API's
    error event, and is returned with the response.

    Events that arrive (an async iterable: an answer in flight) are sent as they come; those of
    a stored answer (a sequence) are all here, so they go out in one write with the end, each
    still its own event: one chunk and one system call instead of one per event."""
    response = web.StreamResponse(status=200, headers=STREAM_HEADERS)
    await response.prepare(request)
    unsent: list[bytes] = []  # a stored answer's, made before its one write
    try:
        if isinstance(events, Sequence):
            if translator is not None:
                unsent.append(translator.start())
            for event in events:
                unsent.append(_replayed(event, hide_usage_chunk, translator))
            unsent.append(end if translator is None else await translator.finish())
            await response.write(b"".join(unsent))
            return response, None
        if translator is not None:
            await response.write(translator.start())
        async for event in events:
            out = _replayed(event, hide_usage_chunk, translator)
            if out:
                await response.write(out)
        await response.write(end if translator is None else await translator.finish())
    except GatewayError as error:
        with contextlib.suppress(ConnectionResetError):
            unsent.append(error_event(error) if translator is None else translator.error(error))
            await response.write(b"".join(unsent))
        return response, error
    return response, None


def _replayed(event: bytes, hide_usage_chunk: bool, translator: StreamTranslator | None) -> bytes:
    if translator is None and (not hide_usage_chunk or b'"usage"' not in event):
        return event  # as it was recorded: no decoding
    data = event_data(event)
    chunk = orjson.loads(data) if data else None
    if not isinstance(chunk, dict):
        return b""
    if translator is not None:
        return translator.feed(chunk)
    if chunk.get("usage") is not None and not chunk.get("choices"):
        return b""  # the usage chunk the gateway asked for on the caller's behalf
    return event
