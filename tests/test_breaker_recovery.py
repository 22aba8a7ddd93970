"""Issue 29 item 6, through a real gateway with the fakes and a wall clock the test moves: a breaker
that probes, not hammers, and gives the traffic back. A failing deployment is not retried while
another is left, a probe is one attempt, and a recovered primary carries its traffic again within
its cooldown and a second."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw import app_keys
from llmgw.clocks import Clocks
from tests.conftest import Gateway, eventually
from tests.fake_openai import FakeOpenAI, providers_settings
from tests.fake_venice import Behaviour, FakeVenice
from tests.processes import Clock
from tests.test_providers_routing import KEYS, OPENAI_TEXT, VENICE_TEXT, alias, provider

PRIMARY = "venice:qwen3-5-9b"
COOLDOWN = 2.0
OUTAGE = 6.0
EVERY = 0.5


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


async def ask(client: openai.AsyncOpenAI) -> str:
    completion = await client.chat.completions.create(
        model="sturdy", messages=[{"role": "user", "content": "flap"}]
    )
    return completion.choices[0].message.content or ""


def heard(replicas: list[Gateway]) -> bool:
    """Whether each replica knows what the other told of the primary (its failures in a row, its
    breaker), as it would by the time a request 0.5 s later arrives."""
    if len(replicas) == 1:
        return True
    first, second = (r.server.app[app_keys.PROVIDERS].routing for r in replicas)
    now = time.monotonic()
    return (
        first._load.failing_elsewhere(PRIMARY, now) == second._load.failing.get(PRIMARY, [])
        and second._load.failing_elsewhere(PRIMARY, now) == first._load.failing.get(PRIMARY, [])
        and first.health(PRIMARY).open_until == second.health(PRIMARY).open_until
    )


@pytest.mark.parametrize("replicas", [1, 2])
async def test_a_flapping_primary_is_probed_not_hammered_and_gets_its_traffic_back(
    start_gateway: Any,
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    fake_venice: FakeVenice,
    replicas: int,
) -> None:
    """Cooldown 2 s, an outage of 6 s, a request every 0.5 s (taking turns between two replicas on
    one Postgres): at most 6 attempts on the primary while it is down, and its traffic back within
    3 s of its recovery."""
    toml = provider(
        "venice",
        "venice",
        fake_venice.base_url,
        "VENICE_API_KEY",
        circuit_cooldown_seconds=COOLDOWN,
        max_retries=2,  # spent only on the last deployment of a route
    ) + provider("openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY")
    toml += alias("sturdy", PRIMARY, "openai:gpt-4o-mini")
    clock = Clock(time.time())
    settings = providers_settings(tmp_path, toml, **KEYS)
    gateways = [await start_gateway(clocks=Clocks(wall=clock), **settings) for _ in range(replicas)]
    # Not the key's limits under test: 48 requests within a minute, whatever replica slices hold.
    key = await gateways[0].create_key(name="flapping", rate_limit_requests=100_000)
    clients = [gateway.client(key) for gateway in gateways]
    started = clock.now
    attempts_while_down = 0
    back_after: float | None = None
    for step in range(int(4 * OUTAGE / EVERY)):
        elapsed = step * EVERY
        clock.now = started + elapsed
        down = elapsed < OUTAGE
        fake_venice.default_behaviour = Behaviour(status=503) if down else Behaviour()
        before = len(fake_venice.chats())
        text = await ask(clients[step % replicas])
        await eventually(lambda: heard(gateways), within=2.0, what="the replicas heard")
        if down:
            attempts_while_down += len(fake_venice.chats()) - before
            assert text == OPENAI_TEXT, "the fallback answers while the primary is down"
        elif back_after is None and text == VENICE_TEXT:
            back_after = elapsed - OUTAGE
        elif back_after is not None:
            assert text == VENICE_TEXT, "once back, the primary keeps its traffic"
    # Three failed requests open it (t = 0, 0.5, 1), one probe per cooldown (t = 3, 5).
    assert attempts_while_down <= 6, attempts_while_down
    assert attempts_while_down == 5
    assert back_after is not None
    assert back_after <= COOLDOWN + 1.0, back_after
