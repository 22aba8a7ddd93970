"""GET /openapi.json: an OpenAPI 3.1 document of every route the application serves.

Every operation comes from its route's record (llmgw/route_table.py): its summary, whether it
needs a key, what it answers, and its request body: a schema below, or an attrs class whose fields
are the schema (the admin API's bodies). The schemas below say what the gateway itself checks in a
body; fields it does not read are listed without constraints because they reach the provider
unchanged. A route with no record (a sub-application's, say) gets a generic entry, so the document
never leaves one out. The document is built from the router on the first request and then served
from memory.
"""

from __future__ import annotations

import types
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin, get_type_hints

import attrs
import orjson
from aiohttp import web

from llmgw.cache.controls import TTL_HEADER
from llmgw.cache.policy import BYPASS, CACHE_HEADER, HIT, MISS
from llmgw.route_table import CONSOLE_PREFIX, DESCRIBED, JSON, Doc, ErrorSet, Route

if TYPE_CHECKING:
    from attrs import AttrsInstance

__all__ = ["attrs_schema", "build_document", "openapi_handler"]

_SCHEMAS = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _SCHEMAS + name}


_PASSED_THROUGH = "Not read by the gateway: sent to the provider unchanged."

_SCHEMA_COMPONENTS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "description": "Every error the gateway answers itself (OpenAI's error shape).",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "code": {"type": ["string", "null"]},
                    "param": {"type": ["string", "null"]},
                },
            }
        },
    },
    "ProviderError": {
        "type": "object",
        "description": "An error the provider answered with, passed through with its own status.",
    },
    "NonBlankString": {"type": "string", "pattern": "\\S"},
    "ChatMessage": {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string", "examples": ["system", "user", "assistant", "tool"]},
            "content": {"description": "A string or a list of content parts."},
        },
    },
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": {
                **_ref("NonBlankString"),
                "description": "A model id, or 'provider/model' to pick a provider.",
            },
            "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
            "stream": {
                "type": ["boolean", "null"],
                "description": "true = answer with server-sent events.",
            },
            "stream_options": {"description": _PASSED_THROUGH},
            "max_tokens": {"description": _PASSED_THROUGH},
            "max_completion_tokens": {"description": _PASSED_THROUGH},
            "temperature": {"description": _PASSED_THROUGH},
            "top_p": {"description": _PASSED_THROUGH},
            "stop": {"description": _PASSED_THROUGH},
            "tools": {"description": _PASSED_THROUGH},
            "tool_choice": {"description": _PASSED_THROUGH},
            "response_format": {"description": _PASSED_THROUGH},
            "venice_parameters": {"description": _PASSED_THROUGH},
        },
    },
    "ChatCompletion": {
        "type": "object",
        "description": "The provider's answer, forwarded byte for byte.",
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array"},
            "usage": {"type": ["object", "null"]},
        },
    },
    "StreamEvent": {
        "type": "object",
        "description": (
            "One server-sent event (before OpenAPI 3.2, an event stream's schema describes each "
            "event): data is a chat.completion.chunk, an error object, or [DONE] at the end."
        ),
        "required": ["data"],
        "properties": {"data": {"type": "string"}},
    },
    "EmbeddingsRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _ref("NonBlankString"),
            "input": {
                "description": "Checked by the provider, not the gateway.",
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "minItems": 1, "items": {"type": "string"}},
                ],
            },
        },
        "description": "Other fields (dimensions, encoding_format, user) reach the provider as sent.",
    },
    "EmbeddingList": {
        "type": "object",
        "properties": {
            "object": {"type": "string"},
            "data": {"type": "array"},
            "model": {"type": "string"},
            "usage": {"type": "object"},
        },
    },
    "ResponseRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _ref("NonBlankString"),
            "input": {
                "description": "A string, or a list of input items (messages, function calls and "
                "their outputs).",
                "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}],
            },
            "instructions": {"type": ["string", "null"]},
            "stream": {"type": ["boolean", "null"]},
            "store": {"type": ["boolean", "null"]},
            "background": {"type": ["boolean", "null"], "enum": [False, None]},
            "previous_response_id": {
                "type": ["string", "null"],
                "description": "A response this key stored; unknown or expired ids get a 400.",
            },
            "tools": {"description": "Function and custom tools (translated providers)."},
            "tool_choice": {"description": "none, auto, required or a tool."},
            "max_output_tokens": {"description": _PASSED_THROUGH},
            "temperature": {"description": _PASSED_THROUGH},
            "top_p": {"description": _PASSED_THROUGH},
            "text": {"description": "format (json_object, json_schema) and verbosity."},
            "reasoning": {"description": "effort (and summary, for native providers)."},
            "metadata": {"description": "Echoed in the response."},
        },
    },
    "Response": {
        "type": "object",
        "description": "A Response object (OpenAI's shape), as made or stored by the gateway.",
        "required": ["id", "object", "status", "output"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string"},
            "status": {"type": "string"},
            "output": {"type": "array"},
            "usage": {"type": ["object", "null"]},
        },
    },
    "ResponseDeleted": {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string"},
            "deleted": {"type": "boolean"},
        },
    },
    "ResponseItemList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"type": "string"}, "data": {"type": "array"}},
    },
    "ResponseStreamEvent": {
        "type": "object",
        "description": (
            "One server-sent event: 'event: <type>' and data, a JSON object with type and "
            "sequence_number (response.created ... response.completed)."
        ),
        "required": ["data"],
        "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    },
    "ImageRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            "model": _ref("NonBlankString"),
            "prompt": {"type": "string", "minLength": 1},
            "n": {"description": _PASSED_THROUGH},
            "size": {"description": _PASSED_THROUGH},
            "response_format": {"description": _PASSED_THROUGH},
        },
    },
    "ImageList": {
        "type": "object",
        "properties": {"created": {"type": "integer"}, "data": {"type": "array"}},
    },
    "SpeechRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _ref("NonBlankString"),
            "input": {"type": "string", "minLength": 1},
            "voice": {"description": _PASSED_THROUGH},
            "response_format": {"description": _PASSED_THROUGH},
            "speed": {"description": _PASSED_THROUGH},
        },
    },
    "TranscriptionRequest": {
        "type": "object",
        "description": (
            "Form fields are text whatever they hold, so only their presence is checked: a model "
            "and a file part."
        ),
        "required": ["model", "file"],
        "properties": {
            "model": {"description": "A model id (a text field)."},
            "file": {"description": "The audio (a file part)."},
            "language": {"description": _PASSED_THROUGH},
            "response_format": {"description": _PASSED_THROUGH},
        },
    },
    "Transcription": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
    },
    "AnthropicError": {
        "type": "object",
        "description": "Every error on the Anthropic Messages routes, the provider's included.",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "AnthropicMessage": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"enum": ["user", "assistant", "system"]},
            "content": {
                "description": "A string, or content blocks (text, image, document, tool_use, "
                "tool_result, thinking, ...).",
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["type"],
                            "properties": {"type": {"type": "string"}},
                        },
                    },
                ],
            },
        },
    },
    "MessagesRequest": {
        "type": "object",
        "required": ["model", "max_tokens", "messages"],
        "description": "Translated to chat completions; fields with no chat equivalent are dropped.",
        "properties": {
            "model": _ref("NonBlankString"),
            "max_tokens": {"type": "integer", "minimum": 0},
            "messages": {"type": "array", "minItems": 1, "items": _ref("AnthropicMessage")},
            "system": {"description": "A string or a list of text blocks."},
            "stream": {"type": ["boolean", "null"]},
            "tools": {"description": "Client tools become functions; server tools are dropped."},
            "tool_choice": {"description": "auto, any, tool {name} or none."},
            "stop_sequences": {"description": "Sent as stop."},
            "temperature": {"description": _PASSED_THROUGH},
            "top_p": {"description": _PASSED_THROUGH},
            "top_k": {"description": _PASSED_THROUGH},
            "metadata": {"description": "user_id is sent as user."},
            "thinking": {"description": "Sent as reasoning_effort (lossy)."},
        },
    },
    "CountTokensRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": _ref("NonBlankString"),
            "messages": {"type": "array", "minItems": 1, "items": _ref("AnthropicMessage")},
        },
        "description": "system, tools and the rest count too; nothing reaches the provider.",
    },
    "Message": {
        "type": "object",
        "required": ["id", "type", "role", "content", "model", "stop_reason", "usage"],
        "properties": {
            "id": {"type": "string"},
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "content": {"type": "array", "items": {"type": "object"}},
            "model": {"type": "string"},
            "stop_reason": {"type": "string"},
            "stop_sequence": {"type": ["string", "null"]},
            "usage": {"type": "object"},
        },
    },
    "TokenCount": {
        "type": "object",
        "required": ["input_tokens"],
        "properties": {"input_tokens": {"type": "integer", "minimum": 1}},
    },
    "ModelList": {
        "type": "object",
        "properties": {"object": {"type": "string"}, "data": {"type": "array"}},
    },
    "Status": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string"}},
    },
}

_ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "The body is not valid JSON or a field the gateway reads is wrong (param names it).",
    401: "Missing, malformed, unknown or revoked key.",
    403: "The key may not use this model.",
    404: "Not found.",
    408: "The request body did not arrive within REQUEST_TIMEOUT_SECONDS.",
    413: "The body is larger than the route's limit: REQUEST_BODY_LIMIT_BYTES; "
    "MESSAGES_BODY_LIMIT_BYTES on /v1/messages, RESPONSES_BODY_LIMIT_BYTES on /v1/responses, "
    "AUDIO_UPLOAD_LIMIT_BYTES for uploads.",
    415: "The body is not JSON (Content-Type), or not multipart/form-data for uploads.",
    429: "The key's rate limit is reached; Retry-After says when to retry.",
    502: "The provider could not be reached or answered with something unusable.",
    503: "The gateway's database is unreachable, or it holds as many request bodies as it may "
    "(REQUEST_BODY_MEMORY_BYTES); retry shortly (Retry-After).",
    504: "The provider did not answer within REQUEST_TIMEOUT_SECONDS.",
}


def _error(status: int, *, provider_may_answer: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = (
        {"anyOf": [_ref("Error"), _ref("ProviderError")]} if provider_may_answer else _ref("Error")
    )
    return {"description": _ERROR_DESCRIPTIONS[status], "content": {JSON: {"schema": schema}}}


def _json_answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _proxied_errors() -> dict[str, Any]:
    errors = {
        str(status): _error(status, provider_may_answer=True) for status in _ERROR_DESCRIPTIONS
    }
    errors["default"] = _json_answer(
        "Any other error the provider answered with, passed through as it is.",
        _ref("ProviderError"),
    )
    return errors


def _anthropic_errors() -> dict[str, Any]:
    """Errors in Anthropic's shape: the gateway's own and the provider's (its status kept)."""
    errors = {
        str(status): _json_answer(description, _ref("AnthropicError"))
        for status, description in _ERROR_DESCRIPTIONS.items()
    }
    errors["default"] = _json_answer(
        "Any other error the provider answered with, its status and message kept.",
        _ref("AnthropicError"),
    )
    return errors


_REQUEST_ID = {
    "name": "X-Request-Id",
    "in": "header",
    "required": False,
    "description": "Echoed in the response when it matches [A-Za-z0-9._:-]{1,128}; made otherwise.",
    "schema": {"type": "string"},
}


# The response cache's say on an operation it may answer (docs/cache.md).
_CACHE_CONTROLS = [
    {
        "name": "Cache-Control",
        "in": "header",
        "required": False,
        "description": (
            "When the response cache is on: no-store (neither read nor write it), no-cache (do "
            "not read it, store the fresh answer), max-age=N (only an answer at most N seconds "
            "old)."
        ),
        "schema": {"type": "string"},
    },
    {
        "name": TTL_HEADER,
        "in": "header",
        "required": False,
        "description": (
            "Store this answer for N seconds (at most the configured CACHE_TTL_SECONDS); a value "
            "that is not a whole number of seconds is ignored, as HTTP caches ignore a malformed "
            "directive."
        ),
        "schema": {"type": "string"},
    },
]
_CACHE_HEADERS = {
    CACHE_HEADER: {
        "description": (
            "hit (answered by the response cache), miss (read, nothing usable) or bypass (not "
            "read); absent when the cache is off."
        ),
        "schema": {"type": "string", "enum": [HIT, MISS, BYPASS]},
    },
    "Age": {
        "description": "On a hit: the stored answer's age in seconds.",
        "schema": {"type": "integer", "minimum": 0},
    },
}


def _generic(method: str, path: str) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": f"{method.upper()} {path}",
        "responses": {
            "2XX": {"description": "Success.", "content": {JSON: {"schema": {}}}},
            "default": _json_answer("An error.", _ref("Error")),
        },
    }
    if method in ("post", "put", "patch"):
        operation["requestBody"] = {"content": {JSON: {"schema": {"type": "object"}}}}
    return operation


def _path_parameters(path: str) -> list[dict[str, Any]]:
    names = [part[1:-1].split(":")[0] for part in path.split("/") if part.startswith("{")]
    return [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in names
    ]


# The admin API's bodies are parsed by one strict cattrs converter (llmgw/admin/schemas.py): the
# JSON type of each field's Python type, with what the converter checks beyond it said in words.
_FIELD_TYPES: dict[Any, dict[str, Any]] = {
    bool: {"type": "boolean"},
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    uuid.UUID: {"type": "string", "description": "A UUID."},
    datetime: {"type": "string", "description": "RFC 3339 with a zone."},
    date: {"type": "string", "description": "YYYY-MM-DD."},
    type(None): {"type": "null"},
}


def _field_schema(type_: Any) -> dict[str, Any]:
    if type_ in _FIELD_TYPES:
        return _FIELD_TYPES[type_]
    origin, args = get_origin(type_), get_args(type_)
    if origin is tuple and args[1:] == (Ellipsis,):
        return {"type": "array", "items": _field_schema(args[0])}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_field_schema(arg) for arg in args]}
    raise TypeError(f"no JSON schema for {type_!r}")


def attrs_schema(cls: type[AttrsInstance], *, only: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON schema of the bodies ``cls`` is parsed from (unknown fields refused); with
    ``only``, of a change to any of those fields."""
    hints = get_type_hints(cls)
    fields = [field for field in attrs.fields(cls) if not only or field.name in only]
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {field.name: _field_schema(hints[field.name]) for field in fields},
        "additionalProperties": False,
    }
    required = [field.name for field in fields if field.default is attrs.NOTHING and not only]
    if required:
        schema["required"] = required
    return schema


def _schema(schema: str | dict[str, Any]) -> dict[str, Any]:
    return _ref(schema) if isinstance(schema, str) else schema


def _errors(errors: ErrorSet) -> dict[str, Any]:
    if errors == "proxied":
        return _proxied_errors()
    if errors == "anthropic":
        return _anthropic_errors()
    if errors == "admin":
        return {
            "default": _json_answer(
                "A body or query the admin API refuses (400), an action outside the caller's role "
                "(403), an unknown id (404), a change the state forbids (409: a team that still "
                "has keys; 422: a key naming a model its team does not allow), a database that "
                "does not answer (503).",
                _ref("Error"),
            )
        }
    return {str(status): _error(status) for status in errors}


def _request_body(doc: Doc, components: dict[str, Any]) -> dict[str, Any]:
    if isinstance(doc.request, type):
        if doc.request_fields:
            schema = attrs_schema(doc.request, only=doc.request_fields)
        else:
            components[doc.request.__name__] = attrs_schema(doc.request)
            schema = _ref(doc.request.__name__)
    else:
        schema = _schema(doc.request or {})
    return {"required": doc.request_required, "content": {doc.request_media: {"schema": schema}}}


def _operation(doc: Doc, components: dict[str, Any]) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": doc.operation_id,
        "summary": doc.summary,
        "responses": {
            doc.status: {
                "description": doc.answer,
                "content": {media: {"schema": _schema(s)} for media, s in doc.content.items()},
            },
            **_errors(doc.errors),
        },
    }
    if doc.request is not None:
        operation["requestBody"] = _request_body(doc, components)
    if doc.cached:
        operation["responses"][doc.status]["headers"] = _CACHE_HEADERS
    return operation


def _routes(app: web.Application) -> Iterator[tuple[str, str, Route | None]]:
    """(method, path, its record if it has one) of every route of ``app``."""
    described = app.get(DESCRIBED, {})
    for resource in app.router.resources():
        if resource.canonical.startswith(CONSOLE_PREFIX):
            # The console's pages are for browsers, and its /console/api is the admin API
            # (documented under /admin/v1) behind a session cookie: not for API clients.
            continue
        sub_app = resource.get_info().get("app")
        if isinstance(sub_app, web.Application):
            # add_subapp() has already prefixed the sub-application's own resources.
            yield from _routes(sub_app)
            continue
        for route in resource:
            if route.method not in ("HEAD", "*"):
                yield route.method.lower(), resource.canonical, described.get(route.handler)


def build_document(app: web.Application) -> dict[str, Any]:
    """Every route of ``app`` (sub-applications included); all but public routes need a key."""
    paths: dict[str, dict[str, Any]] = {}
    components = dict(_SCHEMA_COMPONENTS)
    for method, path, route in sorted(_routes(app), key=lambda found: found[:2]):
        operation = (
            _operation(route.doc, components) if route is not None else _generic(method, path)
        )
        operation["parameters"] = [_REQUEST_ID, *_path_parameters(path)]
        if route is not None and route.doc.cached:
            operation["parameters"].extend(_CACHE_CONTROLS)
        if route is not None and route.public:
            operation["security"] = []
        else:
            operation["security"] = [{"bearer": []}]
            operation["responses"] = {"401": _error(401), **operation["responses"]}
        paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "llmgw",
            "version": "1",
            "description": (
                "An OpenAI-compatible LLM gateway. Send 'Authorization: Bearer <llmgw key>'. "
                "Every error the gateway answers itself is {'error': {message, type, code}}; "
                "errors the provider answers with keep the provider's status and body."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def openapi_handler() -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler of GET /openapi.json; the router is frozen by the first request, so cache."""
    rendered: list[bytes] = []

    async def openapi_json(request: web.Request) -> web.Response:
        if not rendered:
            rendered.append(orjson.dumps(build_document(request.app)))
        return web.Response(body=rendered[0], content_type=JSON)

    return openapi_json
