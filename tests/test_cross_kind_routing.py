"""One alias over three kinds (Azure OpenAI, Anthropic, Venice), end to end: each deployment's
failure moves the request on to the next kind, and each caller's API gets its answer in its own
shape, whichever kind gave it (#20: routing and fallbacks work across kinds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmgw.telemetry import semconv as sc
from tests.conftest import Gateway
from tests.fake_anthropic import FAKE_ANTHROPIC_KEY, FakeAnthropic
from tests.fake_azure import FakeAzure
from tests.fake_openai import providers_settings
from tests.fake_venice import FAKE_VENICE_KEY, FakeVenice
from tests.test_azure_openai import AZURE_TEXT, KEYS, MESSAGES, VENICE_TEXT, azure, venice
from tests.test_providers_routing import alias, chat_span, provider

CLAUDE = "claude-sonnet-4-5"
CLAUDE_TEXT = "Hello from fake Claude!"
EVERY_KIND = ["azure:prod-chat", f"claude:{CLAUDE}", "venice:qwen3-5-9b"]


async def start(
    start_gateway: Any,
    tmp_path: Path,
    azure_fake: FakeAzure,
    claude: FakeAnthropic,
    venice_fake: FakeVenice,
) -> tuple[Gateway, str]:
    toml = azure(azure_fake, "classic", max_retries=0)
    toml += provider("claude", "anthropic", claude.base_url, "ANTHROPIC_KEY", max_retries=0)
    toml += venice(venice_fake, max_retries=0)
    toml += alias("every-kind", *EVERY_KIND)
    keys = {**KEYS, "ANTHROPIC_KEY": FAKE_ANTHROPIC_KEY, "VENICE_API_KEY": FAKE_VENICE_KEY}
    gateway: Gateway = await start_gateway(**providers_settings(tmp_path, toml, **keys))
    return gateway, await gateway.create_key(name="every-kind")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_chat_caller_is_answered_by_each_kind_in_turn_as_the_ones_before_fail(
    start_gateway: Any,
    tmp_path: Path,
    fake_venice: FakeVenice,
    stream: bool,
) -> None:
    async with FakeAzure() as fake_azure, FakeAnthropic() as fake_anthropic:
        gateway, key = await start(start_gateway, tmp_path, fake_azure, fake_anthropic, fake_venice)
        client = gateway.client(key)

        async def answer() -> tuple[str, str]:
            gateway.telemetry.spans.clear()
            if stream:
                chunks = await client.chat.completions.create(
                    model="every-kind", messages=MESSAGES, stream=True
                )
                text = "".join(
                    [c.choices[0].delta.content or "" async for c in chunks if c.choices]
                )
            else:
                completion = await client.chat.completions.create(
                    model="every-kind", messages=MESSAGES
                )
                text = completion.choices[0].message.content or ""
            return text, chat_span(gateway, "every-kind")[sc.LLMGW_DEPLOYMENT]

        assert await answer() == (AZURE_TEXT, EVERY_KIND[0])
        fake_azure.fail_next(503)  # Azure overloaded: Anthropic answers, translated to chat
        assert await answer() == (CLAUDE_TEXT, EVERY_KIND[1])
        fake_azure.fail_next(503)
        fake_anthropic.fail_next(529)  # and Anthropic overloaded too: Venice answers
        assert await answer() == (VENICE_TEXT, EVERY_KIND[2])

    # Each kind was asked in its own API: Azure by deployment, Anthropic in Messages.
    assert len(fake_azure.received) == 3
    assert [r.json["model"] for r in fake_anthropic.calls("/v1/messages")] == [CLAUDE, CLAUDE]
    assert "messages" in fake_anthropic.calls("/v1/messages")[0].json
    assert fake_venice.received[-1].json["model"] == "qwen3-5-9b"


async def test_a_messages_caller_gets_anthropic_s_shape_from_every_kind(
    start_gateway: Any, tmp_path: Path, fake_venice: FakeVenice
) -> None:
    async with FakeAzure() as fake_azure, FakeAnthropic() as fake_anthropic:
        gateway, key = await start(start_gateway, tmp_path, fake_azure, fake_anthropic, fake_venice)
        client = gateway.anthropic_client(key)
        texts = []
        for failing in ([], [fake_azure], [fake_azure, fake_anthropic]):
            for fake in failing:
                fake.fail_next(503 if fake is fake_azure else 529)
            message = await client.messages.create(
                model="every-kind",
                max_tokens=64,
                messages=[{"role": "user", "content": "Say hello"}],
            )
            assert message.type == "message"
            texts.append(message.content[0].text)  # type: ignore[union-attr]
    assert texts == [AZURE_TEXT, CLAUDE_TEXT, VENICE_TEXT]
    # A route that mixes kinds is no native Messages route: the caller's body is translated.
    assert fake_venice.received[-1].json["model"] == "qwen3-5-9b"
