"""A request that is not valid HTTP gets a short JSON error quoting nothing it sent (a real
``serve`` process: the test server of the other tests is aiohttp's own)."""

from __future__ import annotations

import asyncio

import asyncpg
import orjson
import pytest

from llmgw.compat.aiohttp import CONNECTION_HOOKS
from llmgw.storage import api_keys
from tests.conftest import GatewayProcess, StartGateways, eventually, gateway_env
from tests.fake_venice import FakeVenice

pytestmark = pytest.mark.skipif(
    not CONNECTION_HOOKS.enabled(),
    reason="aiohttp's own answer where its connection hooks are off: tests/compat/test_aiohttp.py",
)


async def exchange(
    gateway: GatewayProcess, request: bytes
) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """Send ``request`` raw; the status line, headers and body of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)  # the gateway closes
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *fields = head.split(b"\r\n")
    headers = {
        name.lower(): value.strip() for name, _, value in (f.partition(b":") for f in fields)
    }
    return status, headers, body


@pytest.fixture
def gateway(
    gateway_processes: StartGateways, database_url: str, fake_venice: FakeVenice
) -> GatewayProcess:
    (gateway,) = gateway_processes(gateway_env(database_url, fake_venice.base_url))
    return gateway


@pytest.mark.parametrize(
    "shape",
    ["an oversized Authorization header", "a NUL in the request line", "two Content-Lengths"],
)
async def test_no_header_value_is_echoed_only_a_short_json_error(
    gateway: GatewayProcess, db: asyncpg.Connection, shape: str
) -> None:
    key = (await api_keys.create_key(db, api_keys.KeySettings(name="echo"))).plaintext
    requests = {
        "an oversized Authorization header": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {key}".encode()
        + b"x" * 9000
        + b"\r\n\r\n",
        "a NUL in the request line": b"GET /v1/models\x00"
        + key.encode()
        + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        "two Content-Lengths": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {key}\r\n".encode()
        + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    }
    status, headers, body = await exchange(gateway, requests[shape])
    assert status.startswith(b"HTTP/1.") and status.endswith(b" 400 Bad Request")
    assert headers[b"content-type"] == b"application/json"
    assert len(body) < 300
    error = orjson.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_http"
    assert key[12:].encode() not in body and b"Bearer" not in body and b"xxxxxxxx" not in body
    # The refusal is logged like every other; the key appears nowhere in the log (the fixture
    # scans it at teardown too).
    await eventually(lambda: '"route":"invalid_http"' in gateway.log_text(), within=5)
    [line] = [r for r in gateway.records() if r.get("route") == "invalid_http"]
    assert (line["status"], line["code"], line["key_prefix"]) == (400, "invalid_http", None)
    assert key[12:] not in gateway.log_text()
