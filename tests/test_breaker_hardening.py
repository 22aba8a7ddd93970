"""Issue 34 item 2 against two gateways on one Postgres: a caller cannot switch a deployment off for
everyone. No opening outlasts ``circuit_max_cooldown_seconds`` (a Retry-After of a day or an HTTP
date decades ahead included), a 429 about the request itself is no failure of the deployment, and
one key's crafted requests do not open a deployment other keys are being served by."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from llmgw import app_keys
from llmgw.routing.breaker import FAILURES_TO_OPEN
from tests.conftest import Gateway, eventually
from tests.fake_openai import FakeOpenAI, providers_settings
from tests.fake_venice import Behaviour, FakeVenice
from tests.test_providers_routing import (
    ADMIN_TOKEN,
    KEYS,
    OPENAI_TEXT,
    VENICE_TEXT,
    alias,
    provider,
    routes_of,
    state_of,
)

PRIMARY = "venice:qwen3-5-9b"
MAX_COOLDOWN = 20


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


async def two_replicas(
    start_gateway: Any,
    tmp_path: Path,
    fake_venice: FakeVenice,
    fake_openai: FakeOpenAI,
    **primary: Any,
) -> tuple[Gateway, Gateway]:
    toml = provider(
        "venice", "venice", fake_venice.base_url, "VENICE_API_KEY", **primary
    ) + provider("openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY")
    toml += alias("sturdy", PRIMARY, "openai:gpt-4o-mini")
    overrides = providers_settings(tmp_path, toml, **KEYS)
    overrides["admin_token"] = ADMIN_TOKEN
    first: Gateway = await start_gateway(**overrides)
    second: Gateway = await start_gateway(**overrides)
    return first, second


async def ask(client: openai.AsyncOpenAI, text: str = "route me") -> str:
    completion = await client.chat.completions.create(
        model="sturdy", messages=[{"role": "user", "content": text}]
    )
    return completion.choices[0].message.content or ""


async def health(gateway: Gateway) -> dict[str, Any]:
    (found,) = [d for d in (await routes_of(gateway))["deployments"] if d["deployment"] == PRIMARY]
    return found  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "retry_after",
    [str(86400), formatdate(time.time() + 40 * 365 * 86400, usegmt=True)],
    ids=["a-day", "a-date-decades-ahead"],
)
async def test_a_retry_after_far_ahead_opens_it_on_both_replicas_for_at_most_the_max_cooldown(
    start_gateway: Any,
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    fake_venice: FakeVenice,
    retry_after: str,
) -> None:
    first, second = await two_replicas(
        start_gateway,
        tmp_path,
        fake_venice,
        fake_openai,
        circuit_cooldown_seconds=5,
        circuit_max_cooldown_seconds=MAX_COOLDOWN,
    )
    client = first.client(await first.create_key(name="only"))
    fake_venice.fail_times(1, status=429, retry_after=retry_after)

    before = time.time()
    assert await ask(client) == OPENAI_TEXT
    for replica in (first, second):
        await eventually(
            lambda r=replica: _in_state(r, "open"), within=1.0, what="the opening is shared"
        )
        open_until = (await health(replica))["open_until"]
        assert before < open_until <= time.time() + MAX_COOLDOWN


async def _in_state(gateway: Gateway, state: str) -> bool:
    return await state_of(gateway, PRIMARY) == state


TOO_LARGE = orjson.dumps(
    {
        "error": {
            "message": "Request too large for qwen3-5-9b in organization org-1 on tokens per min "
            "(TPM): Limit 30000, Requested 30601. The input or output tokens must be reduced in "
            "order to run successfully.",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
)
INPUT_TOKENS = orjson.dumps(
    {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "This request would exceed the rate limit for your organization (org-1) "
            "of 40,000 input tokens per minute. For details, refer to the rate limits docs.",
        },
    }
)


@pytest.mark.parametrize("body", [TOO_LARGE, INPUT_TOKENS], ids=["too-large", "input-tokens"])
async def test_a_429_about_the_request_itself_never_opens_the_deployment(
    start_gateway: Any,
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    fake_venice: FakeVenice,
    body: bytes,
) -> None:
    first, second = await two_replicas(start_gateway, tmp_path, fake_venice, fake_openai)
    client = first.client(await first.create_key(name="only"))
    fake_venice.enqueue(
        *(
            Behaviour(status=429, error_body=body, retry_after="86400")
            for _ in range(FAILURES_TO_OPEN * 2)
        )
    )
    for _ in range(FAILURES_TO_OPEN * 2):
        assert await ask(client) == OPENAI_TEXT
    assert await state_of(first, PRIMARY) == "closed"
    assert await state_of(second, PRIMARY) == "closed"
    assert await ask(second.client(await first.create_key(name="other"))) == VENICE_TEXT


async def test_one_keys_crafted_requests_do_not_open_the_primary_for_keys_it_serves(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    """The probe's attack: content that makes only the primary answer 503, from one key, while
    another key is served by the primary through the other replica."""
    first, second = await two_replicas(start_gateway, tmp_path, fake_venice, fake_openai)
    alice_key = await first.create_key(name="alice")
    mallory_key = await first.create_key(name="mallory")
    fake_venice.poison = (b"make-the-primary-fail", Behaviour(status=503, retry_after="86400"))

    assert await ask(second.client(alice_key)) == VENICE_TEXT
    # The first replica hears from the second whom the primary serves (its load reports).
    routing = first.server.app[app_keys.PROVIDERS].routing
    await eventually(
        lambda: routing._load.others_served(PRIMARY, "someone else", time.monotonic()),
        within=2.0,
        what="the first replica learns the primary serves alice",
    )

    mallory = first.client(mallory_key)
    for _ in range(FAILURES_TO_OPEN * 3):
        assert await ask(mallory, "make-the-primary-fail") == OPENAI_TEXT
    for replica in (first, second):
        assert await state_of(replica, PRIMARY) == "closed"
        assert await ask(replica.client(alice_key)) == VENICE_TEXT

    # Failures of two keys' requests are the deployment's: it opens everywhere.
    fake_venice.poison = None
    fake_venice.fail_times(FAILURES_TO_OPEN, status=503)
    for key in (mallory_key, alice_key, mallory_key):
        assert await ask(first.client(key)) == OPENAI_TEXT
    for replica in (first, second):
        await eventually(lambda r=replica: _in_state(r, "open"), within=1.0, what="it opens")
