"""Replicas of ``python -m llmgw serve`` on one Redis, as an operator runs them, under load: many
fetches followed at once, and clears from the command line."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import attrs
import openai
import pytest

from llmgw.storage import api_keys
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour, FakeVenice
from tests.processes import clean_env, eventually, free_port, run_llmgw, serve, stop, wait_for_http

REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL")
pytestmark = pytest.mark.skipif(not REDIS_URL, reason="set LLMGW_TEST_REDIS_URL to test Redis")


@attrs.define
class Replica:
    url: str
    process: subprocess.Popen[bytes]
    log: Path  # its output: a file, since a pipe nobody reads fills and stalls a busy gateway

    def output(self) -> str:
        """What it logged, once it is stopped."""
        stop(self.process)
        return self.log.read_text()


@pytest.fixture
def replicas(database_url: str, fake_venice: FakeVenice, tmp_path: Path) -> Iterator[Any]:
    """``replicas(n, **settings)``: ``n`` gateways on the test Redis, stopped after the test."""
    started: list[Replica] = []

    def start(count: int, **settings: str) -> list[Replica]:
        assert REDIS_URL is not None
        env = clean_env(
            DATABASE_URL=database_url,
            VENICE_API_KEY=FAKE_VENICE_KEY,
            VENICE_BASE_URL=fake_venice.base_url,
            LLMGW_CACHE="redis",
            REDIS_URL=REDIS_URL,
            **settings,
        )
        for _ in range(count):
            port = free_port()
            log = tmp_path / f"gateway-{port}.log"
            with log.open("wb") as output:
                process = serve(env, port, stdout=output, stderr=subprocess.STDOUT)
            replica = Replica(f"http://127.0.0.1:{port}", process, log)
            started.append(replica)
            wait_for_http(f"{replica.url}/healthz", process=process)
        return started[-count:]

    yield start
    for replica in started:
        stop(replica.process)


async def _key(db: asyncpg.Connection) -> api_keys.IssuedKey:
    # Enough requests a minute for a burst: the limits are not what is tested here.
    settings = api_keys.KeySettings(name="replicas", rate_limit_requests=100_000)
    return await api_keys.create_key(db, settings)


async def _ask(base: str, key: str, content: str) -> str:
    """The cache's header on one chat request (a client of its own: one burst's requests are
    in flight together, not queued in one client's pool)."""
    async with openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120
    ) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="qwen3-5-9b", messages=[{"role": "user", "content": content}]
        )
        raw.parse()
        return raw.headers["x-llmgw-cache"]


@pytest.mark.slow  # a fleet of 240 clients
async def test_a_replica_following_many_fetches_still_reads_and_shares_the_cache(
    replicas: Any, db: asyncpg.Connection, fake_venice: FakeVenice
) -> None:
    """A replica follows each fetch another replica makes by waiting on Redis for its next
    event (``XREAD BLOCK``). More fetches followed at once than its Redis client's connections
    (redis-py's default pool: 100) must not turn that replica's cache off: its other lookups
    bypassed, the followers past the pool's size calling the provider themselves, and a warning
    line for each flap, while Redis is well and answers at once."""
    first, second = replicas(2)
    key = (await _key(db)).plaintext
    fetches = 120
    leading = functools.partial(_ask, first.url, key)
    following = functools.partial(_ask, second.url, key)
    assert await following("stored before") == "miss"

    async def stored() -> bool:
        return await following("stored before") == "hit"

    await eventually(stored, what="the answer stored")
    calls = len(fake_venice.chats())
    # Each answer held back a while: the fetches are in flight together on the first.
    fake_venice.default_behaviour = Behaviour(delay_before_headers=4.0)
    leaders = [asyncio.ensure_future(leading(f"question {n}")) for n in range(fetches)]
    await eventually(
        lambda: len(fake_venice.chats()) == calls + fetches, within=10, what="all fetching"
    )
    followers = [asyncio.ensure_future(following(f"question {n}")) for n in range(fetches)]
    await asyncio.sleep(1.0)  # every follower is waiting on its fetch now
    during = await following("stored before")
    results = Counter(await asyncio.gather(*followers))
    await asyncio.gather(*leaders)
    logs = first.output() + second.output()
    # Its connections never ran out. (A call past its 50 ms budget on a machine this busy is
    # still a bypass, as it should be: what else is asserted holds when none did;
    # tests/cache/test_cache_policy.py checks the same without budgets to overrun.)
    assert "Too many connections" not in logs
    if "unreachable" not in logs:
        assert during == "hit"
        assert results == {"hit": fetches}
        assert len(fake_venice.chats()) == calls + fetches  # one call per question


async def test_cache_clear_takes_a_key_id_as_the_admin_api_does(
    replicas: Any, db: asyncpg.Connection, database_url: str
) -> None:
    """``llmgw cache clear --key-id`` in Redis itself reads the id as a UUID, as
    ``DELETE /admin/v1/cache?key_id=`` does: written in capitals (as some tools print UUIDs) it
    still names the key, and what is not a key id is refused, not "deleted 0"."""
    (replica,) = replicas(1)
    issued = await _key(db)
    for question in ("one", "two"):
        assert await _ask(replica.url, issued.plaintext, question) == "miss"
    assert REDIS_URL is not None
    env = clean_env(DATABASE_URL=database_url, LLMGW_CACHE="redis", REDIS_URL=REDIS_URL)
    key_id = str(issued.record.id).upper()

    async def both_stored() -> bool:
        return all([await _ask(replica.url, issued.plaintext, q) == "hit" for q in ("one", "two")])

    await eventually(both_stored, what="both answers stored")
    cleared = run_llmgw("cache", "clear", "--key-id", key_id, env=env)
    assert (cleared.returncode, cleared.stdout.strip()) == (0, "deleted 2 cached answers")
    refused = run_llmgw("cache", "clear", "--key-id", "not-a-key-id", env=env)
    assert refused.returncode != 0 and "deleted" not in refused.stdout
