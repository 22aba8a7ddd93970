"""Reading and checking request bodies: only what the gateway itself needs is validated."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Final

import orjson
from aiohttp import web

from llmgw import app_keys
from llmgw.body_memory import BodyAllowance
from llmgw.errors import InvalidRequest, RequestTimeout, UnsupportedMediaType

__all__ = [
    "MAX_JSON_DEPTH",
    "forget_raw_body",
    "parse_json",
    "read_body",
    "read_json_object",
    "refuse_control_characters",
    "validate_chat_request",
    "validate_embeddings_request",
]

# The deepest nesting of objects and arrays a request body may have. orjson reads 1,024 levels but
# writes only 254, and the gateway writes what it was sent, wrapped a few levels deeper (a
# translated request, a stored response, a stream event), so an accepted body must stay far below
# 254 (128 leaves room for any wrapping). Real bodies need far less: OpenAI's structured outputs
# allow a schema 10 levels deep, and a Claude Code request with its tools nests 11.
MAX_JSON_DEPTH: Final = 128

# Every object key ends in a quote, optional whitespace and a colon; strings may hold more such
# sequences, never fewer. So this count is at least the number of keys in the document.
_KEY_END = re.compile(rb'"[ \t\n\r]*:')


def _shape(document: Any) -> tuple[int, int]:
    """(keys, depth): the keys in every object of a parsed document (duplicates already merged)
    and how deeply its objects and arrays nest. Walked a level at a time, without recursion, and
    no further than one level past MAX_JSON_DEPTH."""
    keys = depth = 0
    level = [document]
    while level and depth <= MAX_JSON_DEPTH:
        below: list[Any] = []
        nests = False
        for value in level:
            if type(value) is dict:
                keys += len(value)
                below.extend(value.values())
                nests = True
            elif type(value) is list:
                below.extend(value)
                nests = True
        depth += nests
        level = below
    return keys, depth


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for name, value in pairs:
        if name in document:
            raise InvalidRequest(
                f"The request body has the key {name!r} more than once in one object."
            )
        document[name] = value
    return document


def parse_json(raw: bytes) -> Any:
    """A request body's JSON document; InvalidRequest when it is not JSON, nests deeper than
    MAX_JSON_DEPTH, or names a key twice in one object.

    A duplicate is refused because the gateway and the provider could each read a different one (a
    checked ``model`` and a forwarded one); orjson keeps the last silently. The exact, slower parse
    runs only when the cheap count of key endings in the raw text exceeds the keys parsed (a
    duplicate, or ``":`` inside a string).
    """
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc.msg}.") from None
    keys, depth = _shape(document)
    if depth > MAX_JSON_DEPTH:
        raise InvalidRequest(
            f"The request body nests objects and arrays more than {MAX_JSON_DEPTH} levels deep."
        )
    if len(_KEY_END.findall(raw)) != keys:
        json.loads(raw, object_pairs_hook=_refuse_duplicates)
    return document


# C0, DEL and C1: no model name holds one, and a NUL cannot even be stored in the usage ledger.
_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f]")


async def read_json_object(request: web.Request) -> tuple[bytes, dict[str, Any]]:
    """The raw body (forwarded as is when possible) and its parsed JSON object."""
    if request.content_type != "application/json" and not request.content_type.endswith("+json"):
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, not {request.content_type or 'missing'!r}."
        )
    raw = await read_body(request)
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return raw, body


async def read_body(request: web.Request) -> bytes:
    """The whole body, within the route's limit and the memory all bodies may hold (the request's
    ``BodyAllowance``, see ``gateway_middleware``)."""
    allowance = request[app_keys.BODY_ALLOWANCE]
    if allowance.body is not None:
        return allowance.body
    # A declared length: 413 before a byte is read, memory for all of it before it arrives.
    await allowance.hold(request.content_length or 0)
    if request.content.is_eof():
        # All of it has arrived already (the usual small body): nothing to wait for, no timer.
        body = await _read_arriving(request, allowance)
    else:
        # This bounds the time a client may take to send it, so a slow-loris body cannot hold a
        # handler open forever.
        timeout = request.config_dict[app_keys.SETTINGS].request_timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                body = await _read_arriving(request, allowance)
        except TimeoutError:
            raise RequestTimeout(
                f"The request body did not arrive within {timeout:g}s (REQUEST_TIMEOUT_SECONDS)."
            ) from None
    allowance.body = bytes(body)
    return allowance.body


async def _read_arriving(request: web.Request, allowance: BodyAllowance) -> bytearray:
    body = bytearray()
    while chunk := await request.content.readany():
        # A chunked body is refused as soon as it passes the limit, and reserves memory as it
        # grows (a declared one reserved it all before: nothing to ask for).
        size = len(body) + len(chunk)
        if size > allowance.reserved:
            await allowance.hold(size, arriving=True)
        body += chunk
    return body


def forget_raw_body(request: web.Request) -> None:
    """The raw body will not be sent (the request is re-encoded): it need not be kept."""
    request[app_keys.BODY_ALLOWANCE].body = None


def refuse_control_characters(model: str) -> None:
    """Every operation's model, whatever its API: it is routed on, logged and billed."""
    if _CONTROL_CHARACTER.search(model):
        raise InvalidRequest("'model' must not contain control characters.", param="model")


def _require_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("'model' must be a non-empty string.", param="model")
    return model


def validate_chat_request(body: dict[str, Any]) -> tuple[str, bool]:
    """Check the fields the gateway reads; return (model, stream). The rest is the provider's."""
    model = _require_model(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list of messages.", param="messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(
                f"messages[{index}] must be an object.", param=f"messages[{index}]"
            )
        if not isinstance(message.get("role"), str):
            raise InvalidRequest(
                f"messages[{index}].role must be a string.", param=f"messages[{index}].role"
            )
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be true or false.", param="stream")
    return model, stream


def validate_embeddings_request(body: dict[str, Any]) -> str:
    """Check the fields the gateway reads; return the model. The rest is the provider's."""
    model = _require_model(body)
    if "input" not in body:
        raise InvalidRequest("'input' is required.", param="input")
    return model
