"""The response cache of real ``python -m llmgw serve`` processes, set up by their environment
alone, driven by the real SDKs: a repeat is a hit in both forms and APIs, keys do not share under
the default scope, and two replicas on one Redis share their hits."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import anthropic
import asyncpg
import openai
import pytest

from llmgw.storage import api_keys
from tests.cache.test_cache_requests import eventually_hit
from tests.fake_venice import FAKE_VENICE_KEY, FakeVenice
from tests.processes import clean_env, free_port, start_gateway, stop

REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL")
MESSAGES: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture
def serve_cached(database_url: str, fake_venice: FakeVenice) -> Iterator[Any]:
    """``serve_cached(n, LLMGW_CACHE=...)``: the base URLs of ``n`` gateways serving with those
    settings, stopped after the test."""
    processes = []

    def start(count: int = 1, **settings: str) -> list[str]:
        env = clean_env(
            DATABASE_URL=database_url,
            VENICE_API_KEY=FAKE_VENICE_KEY,
            VENICE_BASE_URL=fake_venice.base_url,
            **settings,
        )
        urls = []
        for _ in range(count):
            port = free_port()
            processes.append(start_gateway(env, port))
            urls.append(f"http://127.0.0.1:{port}")
        return urls

    yield start
    for process in processes:
        stop(process)


async def _key(db: asyncpg.Connection) -> str:
    return (await api_keys.create_key(db, api_keys.KeySettings(name="cache"))).plaintext


async def _chat(base: str, key: str, *, stream: bool) -> tuple[str, str, str | None]:
    """The cache's header, the answer's text and the Age header of one chat request."""
    async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="qwen3-5-9b", messages=MESSAGES, stream=stream
        )
        if stream:
            text = ""
            async for chunk in raw.parse():
                text += "".join(c.delta.content or "" for c in chunk.choices)
        else:
            text = raw.parse().choices[0].message.content or ""
        return raw.headers["x-llmgw-cache"], text, raw.headers.get("age")


async def test_a_served_gateway_caches_as_its_environment_says(
    serve_cached: Any, db: asyncpg.Connection, fake_venice: FakeVenice
) -> None:
    (base,) = serve_cached(LLMGW_CACHE="memory", CACHE_TTL_SECONDS="600")
    key, other = await _key(db), await _key(db)
    result, text, age = await _chat(base, key, stream=False)
    assert (result, age) == ("miss", None) and text
    for stream in (True, False):
        result, again, age = await _chat(base, key, stream=stream)
        assert (result, again) == ("hit", text)
        assert age is not None and 0 <= int(age) < 600
    assert (await _chat(base, other, stream=True))[0] == "miss"  # another key: its own entry
    async with anthropic.AsyncAnthropic(base_url=base, api_key=key, max_retries=0) as client:
        first = await client.messages.with_raw_response.create(
            model="qwen3-5-9b", max_tokens=64, messages=MESSAGES
        )
        again = await client.messages.with_raw_response.create(
            model="qwen3-5-9b", max_tokens=64, messages=MESSAGES
        )
    assert (first.headers["x-llmgw-cache"], again.headers["x-llmgw-cache"]) == ("miss", "hit")
    assert (await again.parse()).content == (await first.parse()).content
    assert len(fake_venice.chats()) == 3  # chat for two keys, and the Messages request


@pytest.mark.skipif(not REDIS_URL, reason="set LLMGW_TEST_REDIS_URL to test Redis")
async def test_two_served_replicas_on_one_redis_share_hits(
    serve_cached: Any, db: asyncpg.Connection, fake_venice: FakeVenice
) -> None:
    assert REDIS_URL is not None
    first, second = serve_cached(2, LLMGW_CACHE="redis", REDIS_URL=REDIS_URL)
    key = await _key(db)
    result, text, _ = await _chat(first, key, stream=True)
    assert result == "miss"

    async def from_the_other() -> tuple[str, str, str | None]:
        return await _chat(second, key, stream=False)

    assert (await eventually_hit(from_the_other))[1] == text
    assert len(fake_venice.chats()) == 1
