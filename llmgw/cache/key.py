"""What makes two requests the same answer: the API, the model as the caller named it, the
scope (who may share it) and the body in canonical form without ``stream``/``stream_options``
(a streamed and a JSON request share one entry, replayed in the form each asked for)."""

from __future__ import annotations

import hashlib
from typing import Any

import attrs
import orjson

__all__ = ["SCOPES", "CacheKey", "cache_key", "cacheable", "scope_of"]

SCOPES = ("key", "subject", "team", "shared")

# The APIs whose answers are cached, by the name the pipeline gives them. A native /v1/messages
# or /v1/responses (a provider that speaks that API itself) keeps its answers apart: they are
# Messages or Responses, not chat.
CHAT, EMBEDDINGS, MESSAGES, RESPONSES = "chat", "embeddings", "messages", "responses"
NATIVE_MESSAGES, NATIVE_RESPONSES = "messages:native", "responses:native"

_NOT_KEYED = ("stream", "stream_options")


@attrs.frozen
class CacheKey:
    digest: str  # hex sha256 of everything that makes the answer
    key_id: str  # the API key that asked: entries are cleared by it (DELETE ?key_id=)
    model: str  # as the caller named it: entries are cleared by it (DELETE ?model=)


def scope_of(scope: str, key_id: str, subject_id: str | None, team_id: str | None = None) -> str:
    """Who shares entries with this key: under ``subject`` the keys of its subject, under
    ``team`` the keys of its team (the team it is in when it asks), under ``shared`` every key.
    A key outside any subject or team shares with itself only."""
    if scope == "shared":
        return "shared"
    if scope == "subject" and subject_id is not None:
        return f"subject:{subject_id}"
    if scope == "team" and team_id is not None:
        return f"team:{team_id}"
    return f"key:{key_id}"


def cache_key(api: str, model: str, scope: str, body: dict[str, Any], key_id: str) -> CacheKey:
    fields = {name: value for name, value in body.items() if name not in _NOT_KEYED}
    canonical = orjson.dumps([api, model, scope, fields], option=orjson.OPT_SORT_KEYS)
    return CacheKey(hashlib.sha256(canonical).hexdigest(), key_id, model)


def cacheable(api: str, body: dict[str, Any]) -> bool:
    """Responses only when it neither stores nor continues state: a replay would store nothing
    and could continue nothing."""
    if api in (RESPONSES, NATIVE_RESPONSES):
        return body.get("store") is False and body.get("previous_response_id") is None
    return True
