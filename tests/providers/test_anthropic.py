"""The anthropic kind's configuration: its default capabilities, a per-provider override, and a route
that mixes kinds is no native Messages route. (Its traffic: tests/test_anthropic_upstream.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from llmgw.config import ConfigError, load_settings
from llmgw.providers.anthropic import AnthropicProvider
from llmgw.providers.base import UpstreamCall
from llmgw.providers.plugin import Capabilities
from llmgw.routing.registry import build_registry
from tests.fake_anthropic import FAKE_ANTHROPIC_KEY, FakeAnthropic

CONFIG = """
[[providers]]
name = "claude"
kind = "anthropic"
base_url = "https://api.anthropic.com"
api_key_env = "ANTHROPIC_KEY"

[[providers]]
name = "old-claude"
kind = "anthropic"
base_url = "https://api.anthropic.com/"
api_key_env = "ANTHROPIC_KEY"
prefill = false
messages = "translate"

[[providers]]
name = "venice"
kind = "venice"
base_url = "https://api.venice.ai/api/v1"

[[models]]
alias = "mixed"
deployments = ["claude:claude-sonnet-4-5", "venice:qwen3-5-9b"]
"""


async def test_the_kinds_defaults_an_override_and_a_mixed_route(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(CONFIG)
    settings = load_settings({"LLMGW_CONFIG": str(path), "ANTHROPIC_KEY": "sk-ant-test"})
    claude, old, _ = settings.providers
    assert claude.capabilities == Capabilities(reasoning=True, prefill=True, native_messages=True)
    assert old.capabilities == Capabilities(reasoning=True, prefill=False, native_messages=False)
    registry = await build_registry(settings)
    try:
        provider = registry.resolve("claude/claude-sonnet-4-5").deployments[0].provider
        assert isinstance(provider, AnthropicProvider)
        assert (provider.server_address, provider.server_port) == ("api.anthropic.com", 443)
        assert registry.resolve("claude/claude-sonnet-4-5").capabilities.native_messages
        assert not registry.resolve("old-claude/claude-sonnet-4-5").capabilities.native_messages
        assert not registry.resolve("mixed").capabilities.native_messages
    finally:
        await registry.close()


@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        (None, {"x-api-key": FAKE_ANTHROPIC_KEY}),
        ('"x-api-key"', {"x-api-key": FAKE_ANTHROPIC_KEY}),
        ('"bearer"', {"authorization": f"Bearer {FAKE_ANTHROPIC_KEY}"}),
    ],
)
async def test_the_key_is_sent_as_x_api_key_or_as_a_bearer_token(
    tmp_path: Path, auth: str | None, expected: dict[str, str]
) -> None:
    async with FakeAnthropic() as fake:
        path = tmp_path / "llmgw.toml"
        path.write_text(
            f'[[providers]]\nname = "claude"\nkind = "anthropic"\nbase_url = "{fake.base_url}"\n'
            'api_key_env = "ANTHROPIC_KEY"\n' + ("" if auth is None else f"auth = {auth}\n")
        )
        settings = load_settings({"LLMGW_CONFIG": str(path), "ANTHROPIC_KEY": FAKE_ANTHROPIC_KEY})
        registry = await build_registry(settings)
        try:
            body = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "Hi"}]}
            call = UpstreamCall(
                body=orjson.dumps(body),
                deadline=asyncio.get_running_loop().time() + 10,
                model="claude-sonnet-4-5",
            )
            answer = await registry.resolve("claude-sonnet-4-5").chat_completion(call)
        finally:
            await registry.close()
    assert answer.status == 200
    (received,) = fake.calls("/v1/messages")
    sent = {name: received.headers.get(name) for name in ("x-api-key", "authorization")}
    assert sent == {"x-api-key": None, "authorization": None, **expected}


def test_an_unknown_auth_scheme_is_refused_naming_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(CONFIG.replace("prefill = false", 'prefill = false\nauth = "basic"'))
    with pytest.raises(ConfigError) as refused:
        load_settings({"LLMGW_CONFIG": str(path), "ANTHROPIC_KEY": "sk-ant-test"})
    assert 'providers[1].auth: expected "x-api-key" or "bearer", got "basic"' in str(refused.value)
