"""Streams end as what happened: real SDK clients and a fake upstream that frames, pauses and
misbehaves as other OpenAI-compatible servers do. The record is the billing record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import asyncpg
import openai
import orjson
import pytest

from llmgw.storage import api_keys
from tests.conftest import Gateway, StartGateways, eventually, gateway_env
from tests.fake_venice import Behaviour, FakeVenice, expected_cost_usd

MESSAGES = [{"role": "user", "content": "three words here"}]  # 3 prompt tokens at the fake
REPLY = "Hello from fake Venice!"
REPORTED = {
    "input_tokens": 3,
    "output_tokens": 5,
    "cost_usd": pytest.approx(expected_cost_usd(3, 5)),
}


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> Callable[[], list[dict[str, Any]]]:
    """The billing records written so far, as the fields of their log lines."""

    def read() -> list[dict[str, Any]]:
        return [
            {name: getattr(record, name, None) for name in FIELDS}
            for record in caplog.records
            if record.name == "llmgw.billing"
        ]

    return read


FIELDS = ("outcome", "status", "error_type", "stream", "input_tokens", "output_tokens", "cost_usd")
Records = Callable[[], list[dict[str, Any]]]


def billed(record: dict[str, Any]) -> dict[str, Any]:
    return {name: record[name] for name in ("input_tokens", "output_tokens", "cost_usd")}


async def readme_loop(gateway: Gateway, key: str) -> str:
    """The README's streaming example: ``chunk.choices[0]`` on every chunk the caller gets."""
    stream = await gateway.client(key).chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    return "".join([chunk.choices[0].delta.content or "" async for chunk in stream])


async def test_the_sync_sdk_streaming_30_times_gives_30_completed_records(
    gateway: Gateway, api_key: str, records: Records
) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0)

    def stream_30_times() -> list[str]:
        texts = []
        for _ in range(30):
            stream = client.chat.completions.create(
                model="qwen3-5-9b", messages=MESSAGES, stream=True
            )
            texts.append("".join(chunk.choices[0].delta.content or "" for chunk in stream))
        return texts

    assert await asyncio.to_thread(stream_30_times) == [REPLY] * 30
    found = records()
    assert [(row["outcome"], row["status"]) for row in found] == [("completed", 200)] * 30
    assert all(billed(row) == REPORTED for row in found)


FRAMINGS = {
    "spaced JSON": Behaviour(spaced_json=True),
    "CRLF cut between reads": Behaviour(line_ending=b"\r\n", split_line_ends=True),
    "bare CR": Behaviour(line_ending=b"\r", split_line_ends=True),
    "data: without the space": Behaviour(data_space=False),
    "no [DONE] after the finish": Behaviour(omit_done=True),
    "all of them": Behaviour(
        spaced_json=True,
        line_ending=b"\r\n",
        split_line_ends=True,
        data_space=False,
        omit_done=True,
    ),
}


@pytest.mark.parametrize("placement", ["separate", "finish"])
@pytest.mark.parametrize("framing", list(FRAMINGS))
async def test_any_valid_framing_streams_completes_and_bills(
    gateway: Gateway, api_key: str, records: Records, framing: str, placement: Any
) -> None:
    gateway.fake.usage_placement = placement
    gateway.fake.enqueue(FRAMINGS[framing])
    assert await readme_loop(gateway, api_key) == REPLY
    (row,) = records()
    assert (row["outcome"], row["status"], row["error_type"]) == ("completed", 200, None)
    assert billed(row) == REPORTED


async def test_a_json_answer_to_a_stream_reaches_the_caller_as_a_stream_and_is_billed(
    gateway: Gateway, api_key: str, records: Records
) -> None:
    gateway.fake.enqueue(Behaviour(json_answer=True))
    assert await readme_loop(gateway, api_key) == REPLY
    (row,) = records()
    assert (row["outcome"], row["stream"]) == ("completed", True)
    assert billed(row) == REPORTED


async def read_until_finish_then_hang_up(gateway: Gateway, key: str) -> None:
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url("/v1/chat/completions"),
            json={"model": "qwen3-5-9b", "messages": MESSAGES, "stream": True},
            headers={"Authorization": f"Bearer {key}"},
        )
        while b'"finish_reason":"stop"' not in await response.content.readline():
            pass
        response.close()


async def test_a_caller_hanging_up_after_the_finish_chunk_is_billed_the_reported_usage(
    gateway: Gateway, api_key: str, records: Records
) -> None:
    gateway.fake.enqueue(Behaviour(pause_before_usage=0.5))
    await read_until_finish_then_hang_up(gateway, api_key)
    await eventually(lambda: gateway.fake.completed_streams == 1, within=5)
    # The provider has sent its last event; the gateway bills once it has read it.
    await eventually(lambda: len(records()) == 1, within=5)
    (row,) = records()
    assert (row["outcome"], row["status"]) == ("completed", 200)
    assert billed(row) == REPORTED


async def test_shutdown_waits_for_the_usage_of_a_caller_who_left(
    gateway: Gateway, api_key: str, records: Records
) -> None:
    gateway.fake.enqueue(Behaviour(pause_before_usage=1.0))
    await read_until_finish_then_hang_up(gateway, api_key)
    await gateway.server.close()  # the ledger closes last, after the drain ended
    (row,) = records()
    assert billed(row) == REPORTED


async def test_a_caller_hanging_up_mid_stream_is_cancelled_499(
    gateway: Gateway, api_key: str, records: Records
) -> None:
    await gateway.hang_up_mid_stream(api_key)
    await eventually(lambda: gateway.fake.cancelled_streams == 1)
    (row,) = records()
    assert (row["outcome"], row["status"], row["error_type"]) == ("cancelled", 499, "cancelled")


async def last_event(gateway: Gateway, key: str) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/chat/completions"),
            json={"model": "qwen3-5-9b", "messages": MESSAGES, "stream": True},
            headers={"Authorization": f"Bearer {key}"},
        ) as response,
    ):
        body = await response.read()
    last = body.rstrip(b"\n").rpartition(b"\n\n")[2]
    assert last.startswith(b"data: "), body[-300:]
    return orjson.loads(last[6:]), time.monotonic() - started


async def test_an_event_with_no_end_is_cut_at_the_size_bound(
    gateway: Gateway, api_key: str, records: Records
) -> None:
    gateway.fake.enqueue(Behaviour(oversized_event_bytes=100 << 20))
    event, took = await last_event(gateway, api_key)
    assert event["error"]["code"] == "upstream_event_too_large"
    assert took < 10
    (row,) = records()
    assert (row["outcome"], row["error_type"]) == ("failed", "upstream_event_too_large")


async def test_a_stream_that_never_ends_is_cut_at_stream_max_seconds(
    start_gateway: Any, api_key_for: Any, records: Records
) -> None:
    gateway = await start_gateway(stream_max_seconds=1.0)
    key = await api_key_for(gateway)
    gateway.fake.enqueue(Behaviour(endless=True, chunk_delay=0.05))
    event, took = await last_event(gateway, key)
    assert event["error"]["code"] == "stream_max_duration"
    assert 0.9 < took < 4
    (row,) = records()
    assert (row["outcome"], row["error_type"]) == ("failed", "stream_max_duration")


async def test_a_stream_open_at_the_end_of_the_shutdown_grace_gets_an_error_event_and_fails(
    gateway_processes: StartGateways,
    database_url: str,
    db: asyncpg.Connection,
    fake_venice: FakeVenice,
) -> None:
    key = (await api_keys.create_key(db, api_keys.KeySettings(name="shutdown"))).plaintext
    (process,) = gateway_processes(
        gateway_env(database_url, fake_venice.base_url, SHUTDOWN_GRACE_SECONDS="2")
    )
    fake_venice.enqueue(Behaviour(stall_after_chunks=1))
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{process.url}/v1/chat/completions",
            json={"model": "qwen3-5-9b", "messages": MESSAGES, "stream": True},
            headers={"Authorization": f"Bearer {key}", "X-Request-Id": "open-at-shutdown"},
        ) as response,
    ):
        await response.content.readline()
        started = time.monotonic()
        process.process.terminate()
        rest = await response.read()
        took = time.monotonic() - started
    assert b'"code":"gateway_shutting_down"' in rest
    assert 1.0 < took < 6
    assert await asyncio.to_thread(process.process.wait, 15) == 0
    (record,) = [r for r in process.billing_records() if r["request_id"] == "open-at-shutdown"]
    assert (record["outcome"], record["error_type"]) == ("failed", "gateway_shutting_down")
    assert process.problems() == []
