"""A native ``/v1/messages`` (a route of ``kind = "anthropic"`` deployments) cached: the anthropic SDK
through a real gateway to the fake Anthropic, an answer stored in one form replayed in both, every
block as the provider sent it (thinking and its signature, tool_use and its input)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Gateway
from tests.fake_anthropic import FakeAnthropic
from tests.fake_venice import FakeVenice
from tests.test_anthropic_native_usage import priced_gateway
from tests.test_anthropic_upstream import CLAUDE
from tests.test_messages import ADD_TOOL

ASK = {
    "model": CLAUDE,
    "max_tokens": 2048,
    "messages": [{"role": "user", "content": "Add 2 and 3"}],
    "tools": [ADD_TOOL],
    "thinking": {"type": "enabled", "budget_tokens": 1024},
}


@pytest.fixture
async def fake_anthropic() -> Any:
    async with FakeAnthropic() as fake:
        yield fake


async def _json(client: Any) -> tuple[str, Any]:
    raw = await client.messages.with_raw_response.create(**ASK)
    return raw.headers["x-llmgw-cache"], await raw.parse()


async def _streamed(client: Any) -> tuple[str, Any]:
    async with client.messages.stream(**ASK) as stream:
        message = await stream.get_final_message()
        return stream.response.headers["x-llmgw-cache"], message


def _same(a: Any, b: Any) -> None:
    assert [block.model_dump() for block in a.content] == [
        block.model_dump() for block in b.content
    ]
    assert (a.stop_reason, a.usage.input_tokens, a.usage.output_tokens) == (
        b.stop_reason,
        b.usage.input_tokens,
        b.usage.output_tokens,
    )


@pytest.mark.parametrize("first", [_json, _streamed], ids=["stored-as-json", "stored-as-stream"])
async def test_a_native_messages_answer_is_replayed_in_both_forms(
    start_gateway: Any,
    fake_anthropic: FakeAnthropic,
    fake_venice: FakeVenice,
    tmp_path: Path,
    first: Any,
) -> None:
    gateway: Gateway = await priced_gateway(
        start_gateway, fake_anthropic, fake_venice, tmp_path, cache="memory"
    )
    client = gateway.anthropic_client(await gateway.create_key())
    result, answer = await first(client)
    assert result == "miss"
    assert [block.type for block in answer.content] == ["thinking", "tool_use"]
    for form in (_json, _streamed):
        result, again = await form(client)
        assert result == "hit"
        _same(again, answer)
    assert len(fake_anthropic.calls("/v1/messages")) == 1
