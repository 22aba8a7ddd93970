"""``llmgw smoke`` finds the gateway and the key the way the README sets them up."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.cli.smoke import default_base_url
from tests.processes import clean_env, run_llmgw


async def test_smoke_reads_bind_addr_and_llmgw_key(gateway, api_key: str) -> None:
    env = clean_env(BIND_ADDR=f"127.0.0.1:{gateway.server.port}", LLMGW_KEY=api_key)
    result = await asyncio.to_thread(run_llmgw, "smoke", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split()[:2] for line in result.stdout.splitlines()] == [
        ["plain", "status=200"],
        ["streamed", "status=200"],
    ]


@pytest.mark.parametrize(
    ("bind", "url"),
    [
        (("0.0.0.0", 3000), "http://127.0.0.1:3000/v1"),
        (("::", 8080), "http://[::1]:8080/v1"),
        (("10.1.2.3", 3001), "http://10.1.2.3:3001/v1"),
        (("localhost", 80), "http://localhost:80/v1"),
    ],
)
def test_a_wildcard_bind_address_is_asked_on_loopback(bind: tuple[str, int], url: str) -> None:
    assert default_base_url(bind) == url
