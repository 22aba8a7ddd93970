"""Open files: the soft limit raised at start, and new requests refused (not reset) near it.

The end-to-end tests start ``serve`` with a lowered limit (``prlimit`` in ``preexec_fn``) and
hold many concurrent streams through it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import resource
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from llmgw.config import Settings
from llmgw.lifecycle.open_files import (
    OPEN_FILES,
    SAMPLE_SECONDS,
    OpenFiles,
    raise_open_file_limit,
)
from llmgw.storage import api_keys
from tests.conftest import StartGateways, gateway_env, make_telemetry, middleware_alone
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour, FakeVenice
from tests.processes import Clock


def test_connections_and_requests_since_the_last_reading_are_counted() -> None:
    clock, readings = Clock(), iter([100, 500])
    guard = OpenFiles(1000, reserve=100, count_open=lambda: next(readings), clock=clock)
    assert guard.estimate() == 100
    for _ in range(400):
        guard.connection_made()
    assert all(guard.admit() for _ in range(400))  # 100 + 400 connections + 400 requests
    assert (guard.estimate(), guard.admit()) == (900, False)  # the reserve is left
    clock.now += SAMPLE_SECONDS  # a new reading: what is really open
    assert (guard.estimate(), guard.admit()) == (500, True)


def test_a_run_of_refusals_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    guard = OpenFiles(100, reserve=10, count_open=lambda: 95, clock=Clock())
    assert not any(guard.admit() for _ in range(5))
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_where_descriptors_cannot_be_counted_nothing_is_refused() -> None:
    guard = OpenFiles(10, count_open=lambda: None, clock=Clock())
    for _ in range(100):
        guard.connection_made()
    assert all(guard.admit() for _ in range(100))


async def test_near_the_limit_a_request_gets_503_in_its_shape_and_healthz_still_answers(
    aiohttp_client: Any,
) -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[middleware_alone(make_telemetry(Settings()).telemetry)])
    app[OPEN_FILES] = OpenFiles(100, reserve=10, count_open=lambda: 95, clock=Clock())
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_get("/healthz", answer)
    client = await aiohttp_client(app)
    async with client.post("/v1/chat/completions", json={}) as refused:
        assert (refused.status, refused.headers["Retry-After"]) == (503, "5")
        assert refused.headers["Connection"] == "close"
        assert (await refused.json())["error"]["code"] == "too_many_open_files"
    async with client.get("/healthz") as health:
        assert health.status == 200


@pytest.fixture
def own_limit() -> Iterator[None]:
    """This process's limit, restored after a test that raised it."""
    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, saved)


def test_the_soft_limit_is_raised_to_the_hard_one_and_logged(
    own_limit: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.serve")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    assert raise_open_file_limit() == hard == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert f"room for about {hard // 2} concurrent streams" in caplog.text


# End to end ----------------------------------------------------------------------------------


def limited(soft: int, hard: int) -> Callable[[], None]:
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return preexec


# The caller asks for the usage chunk itself, so the provider's stream is relayed unchanged.
STREAM_BODY = {
    "model": "qwen3-5-9b",
    "messages": [{"role": "user", "content": "hold on"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}
_IDENTITY = re.compile(rb'"created":(\d+),"id":"(chatcmpl-[0-9a-f]+)"')


async def sent_by_the_provider(fake_venice: FakeVenice) -> bytes:
    """One stream as the provider sends it, asked for directly."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{fake_venice.base_url}/chat/completions",
            json=STREAM_BODY,
            headers={"Authorization": f"Bearer {FAKE_VENICE_KEY}"},
        ) as response,
    ):
        assert response.status == 200
        return await response.read()


def as_relayed(template: bytes, body: bytes) -> bytes:
    """``template`` (one stream from the provider) with ``body``'s own completion id and
    second: what ``body`` is if every byte of its own stream was relayed, and only its own
    (a chunk of another stream carries another id)."""
    (created, completion_id), *_ = _IDENTITY.findall(template)
    found = _IDENTITY.search(body)
    if found is None:
        return b"<no chunk with an id>"
    return template.replace(b'"created":%s,"id":"%s"' % (created, completion_id), found[0])


async def hold_streams(
    url: str, key: str, count: int, apart: float = 0.0
) -> list[tuple[int, str, bytes]]:
    """``count`` streams, started ``apart`` seconds apart and each read to its end: (status,
    Retry-After, body) of each."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(index: int) -> tuple[int, str, bytes]:
            await asyncio.sleep(index * apart)
            async with session.post(
                f"{url}/v1/chat/completions",
                json=STREAM_BODY,
                headers={"Authorization": f"Bearer {key}"},
            ) as response:
                return (
                    response.status,
                    response.headers.get("Retry-After", ""),
                    await response.read(),
                )

        return await asyncio.gather(*(one(index) for index in range(count)))


async def a_key(db: asyncpg.Connection) -> str:
    settings = api_keys.KeySettings(name="open-files", rate_limit_requests=100_000)
    return (await api_keys.create_key(db, settings)).plaintext


@pytest.fixture
def many_files(own_limit: None) -> None:
    """The test process holds both ends of every stream (the client and the fake Venice)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@pytest.mark.slow  # 20-30 s: each stream lasts about 14 s
async def test_a_thousand_streams_under_a_soft_limit_of_1024_all_complete_byte_for_byte(
    many_files: None,
    gateway_processes: StartGateways,
    database_url: str,
    fake_venice: FakeVenice,
    db: asyncpg.Connection,
) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    (gateway,) = gateway_processes(
        gateway_env(database_url, fake_venice.base_url), preexec_fn=limited(1024, hard)
    )
    key = await a_key(db)
    # Each stream lasts about 14 s; they start over 4 s (admission's database round trips are not
    # what this test is about), so all are open at once for a while even on a loaded machine,
    # where starting 1,000 took more than the 7 s a stream of chunks 1 s apart lasts.
    template = await sent_by_the_provider(fake_venice)  # the same bytes, without the pauses
    fake_venice.default_behaviour = Behaviour(chunk_delay=2.0)
    most_streams = most_fds = 0

    async def watch() -> None:
        nonlocal most_streams, most_fds
        while True:
            most_streams = max(most_streams, fake_venice.active_streams)
            most_fds = max(most_fds, len(os.listdir(f"/proc/{gateway.process.pid}/fd")))
            await asyncio.sleep(0.05)

    watching = asyncio.create_task(watch())
    answers = await hold_streams(gateway.url, key, 1000, apart=0.004)
    watching.cancel()
    assert most_streams >= 950, most_streams  # open at the same time
    # ... each with both its connections: more descriptors than the limit it was started with.
    assert most_fds > 1024, most_fds
    refused = [body for status, _, body in answers if status != 200]
    assert refused == [], f"{len(refused)} not answered 200, e.g. {refused[0]!r}"
    mangled = [
        index for index, (_, _, body) in enumerate(answers) if as_relayed(template, body) != body
    ]
    assert mangled == [], (
        f"{len(mangled)} streams differ from the provider's, e.g. {answers[mangled[0]][2]!r}"
    )
    assert f"open files: soft limit {hard} " in gateway.log_text()
    assert gateway.problems() == []


@pytest.mark.slow  # hundreds of streams at once
async def test_near_its_limit_a_gateway_refuses_new_streams_with_503_not_resets(
    many_files: None,
    gateway_processes: StartGateways,
    database_url: str,
    fake_venice: FakeVenice,
    db: asyncpg.Connection,
) -> None:
    (gateway,) = gateway_processes(
        gateway_env(database_url, fake_venice.base_url), preexec_fn=limited(256, 256)
    )
    key = await a_key(db)
    fake_venice.default_behaviour = Behaviour(chunk_delay=0.5)
    # New streams keep coming while the first are still open (each lasts about 2 s).
    answers = await hold_streams(gateway.url, key, 300, apart=0.005)  # no exception: no reset
    statuses = [status for status, _, _ in answers]
    assert set(statuses) == {200, 503}, statuses
    assert 60 < statuses.count(200) < 128  # what 256 descriptors hold, less the reserve
    refused = [(retry, body) for status, retry, body in answers if status == 503]
    assert all(retry == "5" and b'"too_many_open_files"' in body for retry, body in refused)
    assert gateway.log_text().count("new requests are refused with 503") >= 1
    assert gateway.problems() == []
