"""POST /v1/responses (the OpenAI Responses API), and GET/DELETE of the responses it stored.

A route whose providers all speak Responses (``responses = "native"`` in LLMGW_CONFIG) is sent the
request itself; any other is sent chat completions and its answer translated back
(``llmgw.translation.responses``). Either way the gateway keeps the state: a stored response's
items are what ``previous_response_id`` continues, resolved here into the full input, since
providers like Venice are stateless and would silently ignore the field.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson
from aiohttp import web
from opentelemetry import trace

from llmgw import app_keys
from llmgw.api.body import read_json_object
from llmgw.api.pipeline import Operation, proxy
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.cache.key import NATIVE_RESPONSES as NATIVE_RESPONSES_API
from llmgw.cache.key import RESPONSES as RESPONSES_API
from llmgw.errors import GatewayError, InvalidRequest, NotFound
from llmgw.storage.responses import ResponseStore, StoredResponse
from llmgw.streaming.translate import StreamTranslator
from llmgw.telemetry import semconv as sc
from llmgw.translation import responses as translation
from llmgw.translation.responses_stream import ResponsesStreamTranslator, response_event

__all__ = [
    "OMITTED_TOOLS_HEADER",
    "RESPONSE_STORE",
    "create_response",
    "delete_response",
    "get_response",
    "list_input_items",
]

RESPONSE_STORE = web.AppKey("response_store", ResponseStore)
# Names the tools a translated request could not offer the provider, e.g. "web_search, mcp".
OMITTED_TOOLS_HEADER = "llmgw-omitted-tools"


class _Saver:
    """Stores a finished response (unless the caller sent ``store: false``) with its input, and
    returns it as it is to be answered: with ``store: false`` when the store could not keep it."""

    def __init__(
        self,
        store: ResponseStore,
        key: AuthenticatedKey,
        body: dict[str, Any],
        history: list[dict[str, Any]],
    ) -> None:
        self._store = store
        self._key = key
        self._enabled = body.get("store") is not False
        self._input_items = [*history, *translation.input_items(body)]

    async def __call__(self, response: dict[str, Any]) -> dict[str, Any]:
        if not self._enabled or response.get("status") not in ("completed", "incomplete"):
            return response
        if await self._store.save(self._key.id, response, self._input_items):
            return response
        return {**response, "store": False}


class _ResponsesCodec:
    """What a Responses codec knows of its one request: the history it continues, where the
    answer is saved, and the id it gets."""

    def __init__(
        self, history: list[dict[str, Any]], save: _Saver, ids: translation.ResponseIds
    ) -> None:
        self._history = history
        self.save = save
        self._ids = ids
        self._response_id = ids.new_id("resp")


class TranslatedResponses(_ResponsesCodec):
    """The ApiCodec of Responses over chat completions, for one request."""

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return translation.to_chat(body, self._history)

    async def from_chat(self, completion: dict[str, Any], *, request: dict[str, Any]) -> bytes:
        response = translation.from_chat(
            completion, request=request, response_id=self._response_id, ids=self._ids
        )
        return orjson.dumps(await self.save(response))

    def stream_translator(
        self, *, request: dict[str, Any], estimated_input_tokens: int
    ) -> StreamTranslator:
        return ResponsesStreamTranslator(
            request,
            response_id=self._response_id,
            ids=self._ids,
            estimated_input_tokens=estimated_input_tokens,
            on_finish=self.save,
        )


class NativeResponses(_ResponsesCodec):
    """The ApiCodec of a provider that serves Responses itself: the request keeps its shape (with
    the stored history folded in), the answer gets the gateway's id so it can be continued here."""

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return translation.native_request(body, self._history)

    def as_ours(self, response: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        envelope = translation.response_envelope(
            request, response_id=self._response_id, created_at=int(self._ids.clock())
        )
        # The provider's fields win, but for the id and what it does not echo (Venice is terse).
        return {
            **envelope,
            **{k: v for k, v in response.items() if v is not None},
            "id": self._response_id,
        }

    async def from_chat(self, completion: dict[str, Any], *, request: dict[str, Any]) -> bytes:
        return orjson.dumps(await self.save(self.as_ours(completion, request)))

    def stream_translator(
        self, *, request: dict[str, Any], estimated_input_tokens: int
    ) -> StreamTranslator:
        return _NativeEvents(self, request)


class _NativeEvents:
    """Relays a provider's own Responses events, each framed with ``event:`` and re-identified.

    The terminal event of a completed response is held until the stream ends: the response is
    stored first, so that event can say whether it was."""

    _LIFECYCLE = frozenset(
        {
            "response.created",
            "response.in_progress",
            "response.completed",
            "response.incomplete",
            "response.failed",
        }
    )

    def __init__(self, codec: NativeResponses, request: dict[str, Any]) -> None:
        self._codec = codec
        self._request = request
        self._sequence = 0
        self._completed: dict[str, Any] | None = None  # the held terminal event

    def start(self) -> bytes:
        return b""

    def feed(self, chunk: dict[str, Any]) -> bytes:
        kind = chunk.get("type")
        if not isinstance(kind, str):
            return b""
        if kind in self._LIFECYCLE and isinstance(chunk.get("response"), dict):
            response = self._codec.as_ours(chunk["response"], self._request)
            chunk = {**chunk, "response": response}
        sequence = chunk.get("sequence_number")
        if isinstance(sequence, int):
            self._sequence = sequence + 1
        if kind in ("response.completed", "response.incomplete") and "response" in chunk:
            self._completed = chunk
            return b""
        return response_event(kind, chunk)

    async def finish(self) -> bytes:
        completed, self._completed = self._completed, None
        if completed is None:
            return b""
        response = await self._codec.save(completed["response"])
        return response_event(completed["type"], {**completed, "response": response})

    def error(self, error: GatewayError) -> bytes:
        """``error`` then ``response.failed``: Codex ends a turn only on a terminal event."""
        failed = self._codec.as_ours({"status": "failed"}, self._request)
        failed["error"] = {"code": "server_error", "message": error.message}
        events = (
            ("error", {"code": error.code, "message": error.message, "param": error.param}),
            ("response.failed", {"response": failed}),
        )
        framed = []
        for kind, fields in events:
            framed.append(
                response_event(kind, {"type": kind, "sequence_number": self._sequence, **fields})
            )
            self._sequence += 1
        return b"".join(framed)


_TRANSLATED = Operation(
    name=sc.OPERATION_CHAT,
    validate=translation.validate_request,
    complete=lambda provider, call: provider.chat_completion(call),
    cache_api=RESPONSES_API,  # when it neither stores nor continues (llmgw.cache.key.cacheable)
)
_NATIVE = Operation(
    name=sc.OPERATION_CHAT,
    validate=translation.validate_request,
    complete=lambda provider, call: provider.forward("/responses", call),
    open_stream=lambda provider, call: provider.forward_stream(
        "/responses", call, accept="text/event-stream"
    ),
    sends_chat=False,
    # Kept and replayed as Responses (llmgw.cache.responses), when it neither stores nor continues.
    cache_api=NATIVE_RESPONSES_API,
)


class PreviousResponseNotFound(InvalidRequest):
    code = "previous_response_not_found"


class ConversationTooLarge(InvalidRequest):
    """A chain of responses grown past what one request may carry (OpenAI's code for an input
    too long for the model: the remedy, a shorter history, is the same)."""

    code = "context_length_exceeded"


async def _history(
    request: web.Request, key: AuthenticatedKey, body: dict[str, Any], body_size: int
) -> list[dict[str, Any]]:
    """The stored items ``previous_response_id`` continues; refused when that history and this
    request together are larger than the route's body limit, since all of it is sent upstream."""
    previous = body.get("previous_response_id")
    if previous is None:
        return []
    stored = await request.app[RESPONSE_STORE].load(previous, key.id)
    if stored is None:
        raise PreviousResponseNotFound(
            f"Previous response with id '{previous}' not found.", param="previous_response_id"
        )
    limit = request.app[app_keys.SETTINGS].responses_body_limit_bytes
    if stored.size + body_size > limit:
        raise ConversationTooLarge(
            f"The conversation continued from '{previous}' is, with this input, about "
            f"{stored.size + body_size} bytes: more than this gateway sends in one request "
            f"({limit} bytes, RESPONSES_BODY_LIMIT_BYTES). Start a new conversation, or send a "
            "shorter history as input.",
            param="previous_response_id",
        )
    return stored.history()


async def create_response(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    raw, body = await read_json_object(request)
    body_size = len(raw)
    del raw  # not kept while the answer is produced: the proxy re-encodes the body it sends
    model, _ = translation.validate_request(body)
    store = request.app[RESPONSE_STORE]
    history = await _history(request, key, body, body_size)
    save = _Saver(store, key, body, history)
    ids = translation.ResponseIds()
    if request.app[app_keys.PROVIDERS].resolve(model).capabilities.native_responses:
        operation = attrs.evolve(_NATIVE, codec=NativeResponses(history, save, ids))
    else:
        _state_omitted_tools(request, translation.chat_tools(body.get("tools")).omitted)
        operation = attrs.evolve(_TRANSLATED, codec=TranslatedResponses(history, save, ids))
    return await proxy(request, key, operation)


def _state_omitted_tools(request: web.Request, omitted: tuple[str, ...]) -> None:
    """Tools chat cannot offer are left out, not refused, and said so: on the answer (a header,
    whatever its status) and on the request's span."""
    if omitted:
        headers = request.setdefault(app_keys.RESPONSE_HEADERS, {})
        headers[OMITTED_TOOLS_HEADER] = ", ".join(omitted)
        trace.get_current_span().set_attribute(sc.LLMGW_OMITTED_TOOLS, omitted)


async def _stored(request: web.Request, key: AuthenticatedKey) -> tuple[str, StoredResponse]:
    response_id = request.match_info["response_id"]
    stored = await request.app[RESPONSE_STORE].load(response_id, key.id)
    if stored is None:
        raise NotFound(f"No response found with id '{response_id}'.", param="response_id")
    return response_id, stored


async def get_response(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    _, stored = await _stored(request, key)
    return web.Response(body=orjson.dumps(stored.response), content_type="application/json")


async def list_input_items(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    _, stored = await _stored(request, key)
    items = stored.input_items
    page = {
        "object": "list",
        "data": items,
        "first_id": items[0].get("id") if items else None,
        "last_id": items[-1].get("id") if items else None,
        "has_more": False,
    }
    return web.Response(body=orjson.dumps(page), content_type="application/json")


async def delete_response(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    response_id = request.match_info["response_id"]
    if not await request.app[RESPONSE_STORE].delete(response_id, key.id):
        raise NotFound(f"No response found with id '{response_id}'.", param="response_id")
    deleted = {"id": response_id, "object": "response", "deleted": True}
    return web.Response(body=orjson.dumps(deleted), content_type="application/json")
