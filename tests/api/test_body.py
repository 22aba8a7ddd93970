"""Request bodies: a key named twice in one object is refused, wherever it is."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from llmgw.api.body import reject_duplicate_keys
from llmgw.errors import InvalidRequest
from tests.conftest import Gateway

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
        reject_duplicate_keys(raw, orjson.loads(raw))
    assert "more than once" in caught.value.message


@pytest.mark.parametrize("raw", UNIQUE)
def test_distinct_keys_pass(raw: bytes) -> None:
    reject_duplicate_keys(raw, orjson.loads(raw))


def test_nesting_too_deep_for_the_exact_check_is_a_400() -> None:
    raw = b'{"s":"\\":","a":' + b"[" * 1000 + b"]" * 1000 + b"}"
    with pytest.raises(InvalidRequest):
        reject_duplicate_keys(raw, orjson.loads(raw))


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
