"""The example plugin (examples/llmgw-echo-provider), pip-installed from its directory as an
operator would, is a provider kind: ``llmgw providers`` lists it and ``llmgw serve`` routes chat
to it, plain and streamed, through the OpenAI SDK; what it does not serve is a clean error."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import openai
import pytest

from llmgw.storage import api_keys
from tests.artifact.install import outside_env
from tests.conftest import gateway_env
from tests.processes import NO_VENICE_URL, REPO_ROOT, run_llmgw

EXAMPLE = REPO_ROOT / "examples" / "llmgw-echo-provider"

CONFIG = """
[[providers]]
name = "parrot"
kind = "echo"
base_url = "http://echo.invalid"
prefix = "parrot: "

[[models]]
alias = "talk"
deployments = ["parrot:any"]
"""


def install_example(work: Path) -> Path:
    """``pip install --target`` from a copy of the example's directory (a build leaves files
    beside the sources); its dependency, llmgw, is this one. Returns the site-packages."""
    source, site = work / "llmgw-echo-provider", work / "site-packages"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, source],
        check=True,
        env=outside_env(),
        cwd=work,
    )
    return site


@pytest.mark.slow
async def test_the_example_plugin_is_listed_and_serves_chat(
    tmp_path: Path, database_url: str, db: asyncpg.Connection, gateway_processes: Any
) -> None:
    site = install_example(tmp_path)
    config = tmp_path / "llmgw.toml"
    config.write_text(CONFIG)
    env = gateway_env(database_url, NO_VENICE_URL, LLMGW_CONFIG=str(config), PYTHONPATH=str(site))

    listing = run_llmgw("providers", env=env)
    assert listing.returncode == 0, listing.stderr
    (echo,) = [line.split() for line in listing.stdout.splitlines() if line.startswith("echo ")]
    assert echo[1:4] == ["llmgw-echo-provider", "0.1.0", "reasoning"]

    (gateway,) = gateway_processes(env)
    key = (await api_keys.create_key(db, api_keys.KeySettings(name="plugin"))).plaintext
    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    messages: Any = [{"role": "user", "content": "hello from a plugin"}]

    answer = await client.chat.completions.create(model="talk", messages=messages)
    assert answer.choices[0].message.content == "parrot: hello from a plugin"
    assert answer.usage is not None and answer.usage.completion_tokens == 5

    stream = await client.chat.completions.create(
        model="parrot/any", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    pieces = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    assert text == "parrot: hello from a plugin"
    assert pieces[-1].usage is not None and pieces[-1].usage.prompt_tokens == 4

    with pytest.raises(openai.NotFoundError) as refused:
        await client.embeddings.create(model="talk", input="x")
    assert "parrot (kind echo) does not serve embeddings" in str(refused.value)
    await client.close()
