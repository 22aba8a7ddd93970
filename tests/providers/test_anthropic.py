"""The anthropic kind's configuration: its default capabilities, a per-provider override, and a route
that mixes kinds is no native Messages route. (Its traffic: tests/test_anthropic_upstream.py.)"""

from __future__ import annotations

from pathlib import Path

from llmgw.config import load_settings
from llmgw.providers.anthropic import AnthropicProvider
from llmgw.providers.plugin import Capabilities
from llmgw.providers.registry import build_registry

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
    registry = build_registry(settings)
    try:
        provider = registry.resolve("claude/claude-sonnet-4-5").deployments[0].provider
        assert isinstance(provider, AnthropicProvider)
        assert (provider.server_address, provider.server_port) == ("api.anthropic.com", 443)
        assert registry.resolve("claude/claude-sonnet-4-5").capabilities.native_messages
        assert not registry.resolve("old-claude/claude-sonnet-4-5").capabilities.native_messages
        assert not registry.resolve("mixed").capabilities.native_messages
    finally:
        await registry.close()
