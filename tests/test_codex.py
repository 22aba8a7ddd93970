"""The real Codex CLI (``codex exec``, npm ``@openai/codex``) with the documented configuration, against
the gateway in front of a chat-only provider (the fake Venice, which refuses any tool but a chat
function): it gets its answer, and the namespaced tool it is asked to call is the one it runs."""

from __future__ import annotations

import os
import re
from pathlib import Path

import orjson
import pytest

from llmgw.telemetry import semconv as sc
from tests.agent_clis import CODEX, agent_cli, run_agent_cli
from tests.conftest import Gateway, eventually

# Codex itself (node) against a gateway: pytest -m slow.
pytestmark = pytest.mark.slow

README = Path(__file__).parent.parent / "README.md"
MODEL = "qwen3-5-9b"
# Keeps Codex itself off the network (update checks, analytics, the plugin marketplace): with
# these, a run looks up no host name at all (checked under strace with 0.171.0).
OFFLINE_TOP = "check_for_update_on_startup = false\n"
OFFLINE_TABLES = "\n[analytics]\nenabled = false\n\n[features]\nplugins = false\n"


def documented_codex_config(base_url: str) -> str:
    """The README's ``~/.codex/config.toml``, pointed at this gateway and the fake's model."""
    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), flags=re.DOTALL)
    (config,) = [block for block in blocks if "[model_providers.llmgw]" in block]
    assert 'base_url = "http://localhost:3000/v1"' in config
    assert re.search(r'^model = ".*"$', config, flags=re.MULTILINE)
    config = config.replace("http://localhost:3000/v1", base_url)
    return re.sub(r'^model = ".*"$', f'model = "{MODEL}"', config, flags=re.MULTILINE)


async def run_codex(gateway: Gateway, key: str, prompt: str, workdir: Path) -> str:
    """``codex exec prompt`` with its own HOME and CODEX_HOME; the last message it printed."""
    home = workdir / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        OFFLINE_TOP + documented_codex_config(gateway.base_url) + OFFLINE_TABLES
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(HOME=str(home), CODEX_HOME=str(codex_home), LLMGW_KEY=key)
    last_message = workdir / "last-message.txt"
    await run_agent_cli(
        agent_cli(CODEX),
        "exec",
        "--strict-config",  # the offline keys above must be ones this Codex knows
        "--skip-git-repo-check",
        "--output-last-message",
        str(last_message),
        prompt,
        env=env,
        cwd=workdir,
    )
    return last_message.read_text().strip()


async def test_codex_exec_gets_its_answer_and_runs_a_namespaced_tool(
    gateway: Gateway, api_key: str, tmp_path: Path
) -> None:
    # The model calls one of the sub-agent functions Codex offers in its multi_agent_v1 namespace
    # (on an agent id that does not exist), then answers once it has the result.
    gateway.fake.tool_call = ("multi_agent_v1__close_agent", '{"target":"no-such-agent"}')
    answer = await run_codex(gateway, api_key, "Close the agent no-such-agent.", tmp_path)
    assert answer == gateway.fake.reply

    sent = [r.json for r in gateway.fake.received if r.path == "/api/v1/chat/completions"]
    assert len(sent) == 2  # the turn that called the tool, then the one with its result
    offered = [tool["function"]["name"] for tool in sent[0]["tools"]]
    assert "multi_agent_v1__close_agent" in offered and "exec_command" in offered
    assert all(tool["type"] == "function" for tool in sent[0]["tools"])
    # Codex found the tool by its name and namespace and ran it: its own refusal of a tool it
    # does not know is "unsupported call: <name>".
    result = sent[1]["messages"][-1]
    assert result["role"] == "tool"
    assert "no-such-agent" in result["content"]
    assert not result["content"].startswith("unsupported call")
    called = sent[1]["messages"][-2]["tool_calls"][0]["function"]
    assert orjson.loads(called["arguments"]) == {"target": "no-such-agent"}
    assert called["name"] == "multi_agent_v1__close_agent"

    # Its hosted web_search was left out, and said so on every request's span.
    spans = gateway.telemetry.finished_spans
    await eventually(lambda: sum(s.name == "POST /v1/responses" for s in spans()) == 2)
    for span in spans():
        if span.name == "POST /v1/responses":
            assert "web_search" in span.attributes[sc.LLMGW_OMITTED_TOOLS]
            assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 200
