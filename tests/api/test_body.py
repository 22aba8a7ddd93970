"""Request bodies: a key named twice in one object is refused, wherever it is, and so is nesting
deeper than MAX_JSON_DEPTH, on every route that reads JSON, before anything is admitted or sent."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from llmgw.api.body import MAX_JSON_DEPTH, parse_json
from llmgw.errors import InvalidRequest
from tests.conftest import Gateway
from tests.test_policy_and_ledger import flush

ADMIN_TOKEN = "admin-token-for-depth-tests-0123"

DUPLICATES = [
    b'{"model":"a","model":"b","messages":[]}',
    b'{"messages":[{"role":"user","role":"system","content":"x"}],"model":"m"}',
    b'{"a": {"b": 1, "b" : 2}}',
    b'{"a" :1,"a":2}',
    b'{"a":1,"a":2,"s":"\\":"}',
    b'{"x":"\\": \\":","k":1,"k":1}',
]
UNIQUE = [
    b'{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"user","content":"ho"}]}',
    b'{"a":"text with \\": inside","b":{"c":[{"d":1},{"d":2}]}}',
    b'{ "a" : 1 , "b" : [ { "a" : 2 } ] }',
    b"{}",
]


@pytest.mark.parametrize("raw", DUPLICATES)
def test_a_duplicate_key_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_json(raw)
    assert "more than once" in caught.value.message


@pytest.mark.parametrize("raw", UNIQUE)
def test_distinct_keys_pass(raw: bytes) -> None:
    assert parse_json(raw) == orjson.loads(raw)


def nested(depth: int) -> Any:
    """A JSON value whose objects and arrays nest ``depth`` levels deep."""
    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"type": "object", "items": value}
    return value


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 255, 1000])
def test_nesting_past_the_limit_is_refused(depth: int) -> None:
    raw = orjson.dumps(nested(depth)) if depth <= 254 else b"[" * depth + b"]" * depth
    with pytest.raises(InvalidRequest) as caught:
        parse_json(raw)
    assert f"more than {MAX_JSON_DEPTH} levels deep" in caught.value.message


def test_nesting_at_the_limit_passes_and_stays_writable_with_room_to_spare() -> None:
    document = {"tools": [{"parameters": nested(MAX_JSON_DEPTH - 3)}]}
    assert parse_json(orjson.dumps(document)) == document
    # The gateway wraps what it was sent (translations, stored responses, stream events) a few
    # levels deeper; orjson writes 254.
    wrapped: Any = document
    for _ in range(254 - MAX_JSON_DEPTH):
        wrapped = {"wrapped": wrapped}
    orjson.dumps(wrapped)


async def test_the_gateway_answers_400_and_forwards_nothing(gateway: Gateway, api_key: str) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/chat/completions"),
            data=b'{"model":"allowed","messages":[{"role":"user","content":"hi"}],"model":"other"}',
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        ) as response,
    ):
        assert response.status == 400
        error = (await response.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert "'model'" in error["message"]
    assert gateway.fake.received == []


TOO_DEEP = nested(MAX_JSON_DEPTH)  # the body's own object makes it one level too many
HI = [{"role": "user", "content": "hi"}]
JSON_ROUTES = {
    "/v1/chat/completions": {"model": "qwen3-5-9b", "messages": HI, "metadata": TOO_DEEP},
    "/v1/embeddings": {"model": "text-embedding-qwen3-0-6b", "input": "hi", "extra": TOO_DEEP},
    "/v1/messages": {
        "model": "qwen3-5-9b",
        "max_tokens": 16,
        "messages": HI,
        "tools": [{"name": "deep", "input_schema": TOO_DEEP}],
    },
    "/v1/messages/count_tokens": {
        "model": "qwen3-5-9b",
        "messages": HI,
        "tools": [{"name": "deep", "input_schema": TOO_DEEP}],
    },
    "/v1/responses": {
        "model": "qwen3-5-9b",
        "input": "hi",
        "stream": True,
        "tools": [{"type": "function", "name": "deep", "parameters": TOO_DEEP}],
    },
    "/v1/images/generations": {"model": "qwen3-5-9b", "prompt": "a cat", "style": TOO_DEEP},
    "/admin/v1/keys": {"name": "deep", "metadata": TOO_DEEP},
}
ANTHROPIC_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")


@pytest.mark.parametrize("path", list(JSON_ROUTES))
async def test_every_json_route_refuses_a_body_nested_too_deeply(
    start_gateway: Any, path: str
) -> None:
    gateway: Gateway = await start_gateway(admin_token=ADMIN_TOKEN)
    key = ADMIN_TOKEN if path.startswith("/admin/") else await gateway.create_key()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url(path), json=JSON_ROUTES[path], headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        assert response.status == 400
        answer = await response.json()
    if path in ANTHROPIC_ROUTES:
        assert answer["type"] == "error"
    error = answer["error"]
    assert error["type"] == "invalid_request_error"
    assert f"more than {MAX_JSON_DEPTH} levels deep" in error["message"]
    assert gateway.fake.received == []
    await flush(gateway)
    assert await gateway.db.fetchval("SELECT count(*) FROM usage_events") == 0
    assert await gateway.db.fetchval("SELECT count(*) FROM api_keys WHERE name = 'deep'") == 0


@pytest.mark.parametrize(
    ("path", "tool"),
    [
        ("/v1/messages", {"name": "deep", "input_schema": nested(MAX_JSON_DEPTH - 3)}),
        (
            "/v1/responses",
            {"type": "function", "name": "deep", "parameters": nested(MAX_JSON_DEPTH - 3)},
        ),
        (
            "/v1/chat/completions",
            {
                "type": "function",
                "function": {"name": "deep", "parameters": nested(MAX_JSON_DEPTH - 4)},
            },
        ),
    ],
)
async def test_a_body_at_the_limit_is_translated_streamed_stored_and_billed(
    gateway: Gateway, api_key: str, path: str, tool: dict[str, Any]
) -> None:
    """Everything the gateway writes of such a body (the chat request, the span, the stream's
    events, the stored response, the ledger row) stays within what orjson can write."""
    body: dict[str, Any] = {"model": "qwen3-5-9b", "stream": True, "tools": [tool]}
    body |= {"input": "hi"} if path == "/v1/responses" else {"messages": HI, "max_tokens": 16}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url(path), json=body, headers={"Authorization": f"Bearer {api_key}"}
        ) as response,
    ):
        events = await response.read()
        assert response.status == 200, events
    assert b"event: error" not in events and b'data: {"error"' not in events
    await flush(gateway)
    row = await gateway.db.fetchrow("SELECT status, error_type, flags FROM usage_events")
    assert (row["status"], row["error_type"], row["flags"]) == (200, None, [])
