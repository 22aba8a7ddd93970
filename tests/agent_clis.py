"""The agent CLIs teams run against llmgw (Claude Code, Codex), installed from npm for the tests.

Each CLI is installed once per machine, at a pinned version, into a cache directory shared by test
runs (``LLMGW_TEST_NPM_DIR``, default ``~/.cache/llmgw-tests/npm``); ``CLAUDE_CODE_BIN`` or
``CODEX_BIN`` name an installed binary instead. A test using one is skipped only when npm cannot
install it (no npm, or no registry): then the skip says why.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest

__all__ = ["CLAUDE_CODE", "CODEX", "AgentCli", "agent_cli", "run_agent_cli"]


@attrs.frozen
class AgentCli:
    package: str
    version: str  # the version these tests were last checked against
    binary: str  # its name in node_modules/.bin
    override: str  # the environment variable naming an installed binary instead


CLAUDE_CODE = AgentCli("@anthropic-ai/claude-code", "2.1.197", "claude", "CLAUDE_CODE_BIN")
CODEX = AgentCli("@openai/codex", "0.171.0", "codex", "CODEX_BIN")


def _install_dir() -> Path:
    configured = os.environ.get("LLMGW_TEST_NPM_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "llmgw-tests" / "npm"


def agent_cli(cli: AgentCli) -> Path:
    """The CLI's binary, installing it first if needed; skips the test when npm cannot."""
    if configured := os.environ.get(cli.override):
        return Path(configured)
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"{cli.package} needs npm, which is not installed")
    prefix = _install_dir() / f"{cli.binary}-{cli.version}"
    binary = prefix / "node_modules" / ".bin" / cli.binary
    prefix.mkdir(parents=True, exist_ok=True)
    # Parallel test runs (and helpers' worktrees) share the cache: one installs, the others wait.
    with (prefix / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            result = subprocess.run(
                [
                    npm,
                    "install",
                    "--prefix",
                    str(prefix),
                    "--no-audit",
                    "--no-fund",
                    "--no-save",
                    f"{cli.package}@{cli.version}",
                ],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if result.returncode != 0 or not binary.exists():
                pytest.skip(
                    f"npm could not install {cli.package}@{cli.version}: "
                    f"{(result.stderr or result.stdout).strip()[-500:]}"
                )
    return binary


async def run_agent_cli(
    binary: Path,
    *args: str,
    env: Mapping[str, str],
    cwd: Path,
    stdin: bytes | None = None,
    timeout: float = 120,
) -> str:
    """Run a CLI to its end within ``timeout`` seconds, ``stdin`` piped to it (none by default);
    its stdout. A failure (or a hang, killed) fails the test with what it printed."""
    process = await asyncio.create_subprocess_exec(
        str(binary),
        *args,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(stdin), timeout=timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, (stdout.decode(), stderr.decode())
    return stdout.decode()
