"""Native ``/v1/messages`` (a route of ``kind = "anthropic"`` deployments) billed from what the
upstream did, whatever it reported: the anthropic SDK through a real gateway to the fake Anthropic
(tests/fake_anthropic.py) over real sockets, each row read back from the ledger.

A stream that ends before its ``message_delta`` (the caller left, the gateway cut it) is billed the
larger of the count so far and the estimate of what was relayed; a count that is no count falls
back to the estimate, flagged; a repeated ``message_start`` lowers nothing; an answer without usage
is estimated from its content blocks; the gateway's own errors mid-stream are Anthropic's ``error``
events; a header sent on several lines goes on as one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from llmgw.accounting.estimate import estimate_output_tokens
from llmgw.config import load_settings
from tests.conftest import Gateway
from tests.fake_anthropic import (
    CACHE_CREATION,
    CACHE_READ,
    FAKE_ANTHROPIC_KEY,
    THINKING,
    FakeAnthropic,
    input_tokens,
)
from tests.fake_venice import FAKE_VENICE_KEY, FakeVenice
from tests.test_anthropic_upstream import CLAUDE, CLAUDE_PRICES, HELLO, config
from tests.test_messages import ADD_TOOL

# Long enough that its estimate (1,000 tokens) is far above the 1 of message_start.
LONG_REPLY = "word " * 799 + "end."


async def priced_gateway(
    start_gateway: Any,
    fake_anthropic: FakeAnthropic,
    fake_venice: FakeVenice,
    tmp_path: Path,
    stall_timeout_seconds: float | None = None,
    **overrides: Any,
) -> Gateway:
    toml = config(fake_anthropic.base_url, fake_venice.base_url) + CLAUDE_PRICES
    if stall_timeout_seconds is not None:
        toml = toml.replace(
            'kind = "anthropic"',
            f'kind = "anthropic"\nstall_timeout_seconds = {stall_timeout_seconds}',
        )
    path = tmp_path / "llmgw.toml"
    path.write_text(toml)
    keys = {"ANTHROPIC_KEY": FAKE_ANTHROPIC_KEY, "VENICE_API_KEY": FAKE_VENICE_KEY}
    settings = load_settings({"LLMGW_CONFIG": str(path), **keys})
    gateway: Gateway = await start_gateway(
        providers=settings.providers,
        model_aliases=settings.model_aliases,
        prices=settings.prices,
        **overrides,
    )
    return gateway


@pytest.fixture
async def fake_anthropic() -> Any:
    async with FakeAnthropic(reply=LONG_REPLY, chunks=8) as fake:
        yield fake


@pytest.fixture
async def gateway(
    start_gateway: Any, fake_anthropic: FakeAnthropic, fake_venice: FakeVenice, tmp_path: Path
) -> Gateway:
    return await priced_gateway(start_gateway, fake_anthropic, fake_venice, tmp_path)


def all_input(fake: FakeAnthropic) -> int:
    """What the fake reports as input (fresh, cache reads and writes) for its last request."""
    return input_tokens(fake.received[-1].json) + CACHE_READ + CACHE_CREATION


def assert_estimated(row: Any, *, output: int, flags: list[str] | None = None) -> None:
    assert row["usage_source"] == "estimated"
    assert row["output_tokens"] == output
    assert row["cost_usd"] is not None and row["cost_usd"] > 0 and row["cost_computed"]
    assert row["flags"] == (flags or [])


# 1. A stream whose final usage never comes -------------------------------------------------------


async def test_a_caller_leaving_before_message_delta_is_billed_what_was_relayed(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.stall_before_final = True  # every text delta sent, then nothing
    client = gateway.anthropic_client(await gateway.create_key(name="leaves"))
    text = ""
    async with client.messages.stream(model=CLAUDE, max_tokens=4096, messages=HELLO) as stream:
        async for piece in stream.text_stream:
            text += piece
            if text == LONG_REPLY:
                break  # leaves: the context closes the connection
    (row,) = await gateway.ledger_rows(1)
    assert (row["status"], row["error_type"]) == (499, "cancelled")
    assert row["input_tokens"] == all_input(fake_anthropic)  # message_start's own count
    # Not message_start's 1 output token, marked reported: what was relayed, marked estimated.
    assert_estimated(row, output=estimate_output_tokens(len(LONG_REPLY)))


@pytest.mark.parametrize(
    ("overrides", "error_type", "anthropic_type"),
    [
        ({"upstream_max_event_bytes": 8192}, "upstream_event_too_large", "api_error"),
        ({"stream_max_seconds": 1.0}, "stream_max_duration", "timeout_error"),
        ({"stall_timeout_seconds": 0.5}, "upstream_stream_timeout", "timeout_error"),
    ],
    ids=["event too large", "stream max seconds", "stall"],
)
async def test_a_stream_the_gateway_ends_before_message_delta_raises_in_the_sdk_and_is_billed(
    start_gateway: Any,
    fake_anthropic: FakeAnthropic,
    fake_venice: FakeVenice,
    tmp_path: Path,
    overrides: dict[str, Any],
    error_type: str,
    anthropic_type: str,
) -> None:
    gateway = await priced_gateway(
        start_gateway, fake_anthropic, fake_venice, tmp_path, **overrides
    )
    if "upstream_max_event_bytes" in overrides:
        padding = {"type": "ping", "padding": "x" * 10_000}
        fake_anthropic.before_final = b"event: ping\ndata: " + orjson.dumps(padding) + b"\n\n"
    else:
        fake_anthropic.stall_before_final = True
    client = gateway.anthropic_client(await gateway.create_key(name="cut"))
    text = ""
    # 4. The gateway's own error is Anthropic's error event: the SDK raises, it does not end
    # quietly with stop_reason None.
    with pytest.raises(anthropic.APIStatusError) as raised:
        async with client.messages.stream(model=CLAUDE, max_tokens=4096, messages=HELLO) as stream:
            async for piece in stream.text_stream:
                text += piece
    assert text == LONG_REPLY
    body = raised.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == anthropic_type and body["error"]["message"]
    (row,) = await gateway.ledger_rows(1)
    assert (row["status"], row["error_type"]) == (200, error_type)
    assert row["input_tokens"] == all_input(fake_anthropic)
    assert_estimated(row, output=estimate_output_tokens(len(LONG_REPLY)))


async def test_the_error_event_of_a_native_stream_is_anthropics_on_the_wire(
    start_gateway: Any, fake_anthropic: FakeAnthropic, fake_venice: FakeVenice, tmp_path: Path
) -> None:
    gateway = await priced_gateway(
        start_gateway, fake_anthropic, fake_venice, tmp_path, upstream_max_event_bytes=8192
    )
    fake_anthropic.before_final = b"event: ping\ndata: " + b"x" * 10_000 + b"\n\n"
    key = await gateway.create_key(name="wire")
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url("/v1/messages"),
            json={"model": CLAUDE, "max_tokens": 64, "messages": HELLO, "stream": True},
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        )
        relayed = await response.read()
    last = relayed.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    name, data = last.split(b"\n")
    assert name == b"event: error"
    error = orjson.loads(data.removeprefix(b"data: "))
    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    assert "larger than the gateway accepts" in error["error"]["message"]


# 6. Usage values a native upstream should never send ---------------------------------------------

ESTIMATED_OUTPUT = estimate_output_tokens(len(LONG_REPLY))
# (usage over the answer's or message_start's, over message_delta's, what the row must say)
HOSTILE_USAGE: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "negative output": (
        {"output_tokens": -3},
        {"output_tokens": -3},
        {"output": ESTIMATED_OUTPUT, "flags": ["output_tokens:out_of_range"]},
    ),
    "output 10^30": (
        {"output_tokens": 1e30},
        {"output_tokens": 1e30},
        {"output": ESTIMATED_OUTPUT, "flags": ["output_tokens:out_of_range"]},
    ),
    "output 1e18": (
        {"output_tokens": 10**18},
        {"output_tokens": 10**18},
        {"output": ESTIMATED_OUTPUT, "flags": ["output_tokens:out_of_range"]},
    ),
    "negative input beside a large cache read": (
        {"input_tokens": -1000, "cache_read_input_tokens": 50_000},
        {},
        {"input_at_least": 50_000 + CACHE_CREATION, "flags": ["input_tokens:out_of_range"]},
    ),
}


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
@pytest.mark.parametrize("case", sorted(HOSTILE_USAGE))
async def test_a_count_that_cannot_be_kept_is_the_estimate_and_flagged(
    gateway: Gateway, fake_anthropic: FakeAnthropic, case: str, stream: bool
) -> None:
    start, final, expected = HOSTILE_USAGE[case]
    if stream and final:
        fake_anthropic.final_usage_patch = final
    else:
        fake_anthropic.usage_patch = start
    client = gateway.anthropic_client(await gateway.create_key(name="hostile"))
    if stream:
        async with client.messages.stream(model=CLAUDE, max_tokens=4096, messages=HELLO) as s:
            await s.get_final_message()
    else:
        await client.messages.create(model=CLAUDE, max_tokens=4096, messages=HELLO)
    (row,) = await gateway.ledger_rows(1)
    assert row["status"] == 200
    assert row["usage_source"] == "estimated"
    assert row["flags"] == expected["flags"]
    assert row["cost_usd"] is not None and row["cost_usd"] > 0 and row["cost_computed"]
    if "output" in expected:
        assert row["output_tokens"] == expected["output"]
        assert row["input_tokens"] == all_input(fake_anthropic)  # what could be kept is kept
    else:
        assert row["input_tokens"] >= expected["input_at_least"]
        assert row["cache_read_input_tokens"] == 50_000


async def test_a_second_message_start_never_lowers_the_counts(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.restart_usage = {"input_tokens": 1, "output_tokens": 1}
    client = gateway.anthropic_client(await gateway.create_key(name="restart"))
    async with client.messages.stream(model=CLAUDE, max_tokens=4096, messages=HELLO) as stream:
        message = await stream.get_final_message()
    (row,) = await gateway.ledger_rows(1)
    assert row["input_tokens"] == all_input(fake_anthropic)
    assert row["cache_read_input_tokens"] == CACHE_READ
    assert row["output_tokens"] == message.usage.output_tokens
    assert (row["usage_source"], row["flags"]) == ("reported", [])


async def test_parts_that_do_not_add_up_are_flagged(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    # More hour-long cache writes than cache writes.
    fake_anthropic.usage_patch = {
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 5_000}
    }
    client = gateway.anthropic_client(await gateway.create_key(name="parts"))
    await client.messages.create(model=CLAUDE, max_tokens=4096, messages=HELLO)
    (row,) = await gateway.ledger_rows(1)
    assert row["flags"] == ["cache_creation_input_tokens:parts_exceed_total"]


# 7. An answer without usable usage ---------------------------------------------------------------


@pytest.mark.parametrize("usage_patch", [None, {"output_tokens": "many"}], ids=["none", "text"])
async def test_an_answer_without_usage_is_estimated_from_its_content_blocks(
    gateway: Gateway, fake_anthropic: FakeAnthropic, usage_patch: dict[str, Any] | None
) -> None:
    fake_anthropic.usage_patch = usage_patch
    client = gateway.anthropic_client(await gateway.create_key(name="no-usage"))
    message = await client.messages.create(
        model=CLAUDE,
        max_tokens=4096,
        thinking={"type": "enabled", "budget_tokens": 2048},
        tools=[ADD_TOOL],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "What is 4 + 6?"}],
    )
    assert [block.type for block in message.content] == ["thinking", "tool_use"]
    (row,) = await gateway.ledger_rows(1)
    produced = len(THINKING) + len(orjson.dumps({"a": 4, "b": 6}))
    assert row["output_tokens"] == estimate_output_tokens(produced) > 0
    assert row["usage_source"] == "estimated"
    assert row["input_tokens"] > 0
    assert row["cost_usd"] > 0


# 10. A header on several lines -------------------------------------------------------------------


async def test_a_repeated_anthropic_beta_header_is_forwarded_with_every_value(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    key = await gateway.create_key(name="betas")
    headers = [
        ("x-api-key", key),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "prompt-caching-2024-07-31"),
        ("anthropic-beta", "interleaved-thinking-2025-05-14,context-1m-2025-08-07"),
    ]
    body = {"model": CLAUDE, "max_tokens": 64, "messages": HELLO}
    async with aiohttp.ClientSession() as session:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            async with session.post(gateway.url(path), json=body, headers=headers) as response:
                assert response.status == 200, await response.text()
    for received in fake_anthropic.received:
        assert received.headers["anthropic-beta"] == (
            "prompt-caching-2024-07-31,interleaved-thinking-2025-05-14,context-1m-2025-08-07"
        )
    assert len(fake_anthropic.received) == 2
