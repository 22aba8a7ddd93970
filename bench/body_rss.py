"""``python -m bench.body_rss``: what a large request body costs a gateway process in memory.

Starts the fake Venice here and ``python -m llmgw serve`` (one worker) against a throwaway database
on ``--database-url``'s server, warms the gateway with a small request, then for each route sends
one body of ``--mib`` MiB and reads the process's peak resident set (``VmHWM``, reset before each
body through ``/proc/PID/clear_refs``). Prints the peak's growth over the resident set before the
body, and that growth as a multiple of the body's size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import orjson

from bench.services import free_port
from llmgw.storage import api_keys, migrations
from tests.fake_venice import FAKE_VENICE_KEY, FakeVenice


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


def _bodies(size: int) -> dict[str, bytes]:
    text = "x" * size
    return {
        "/v1/messages": orjson.dumps(
            {
                "model": "qwen3-5-9b",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": text}],
            }
        ),
        "/v1/messages (stream)": orjson.dumps(
            {
                "model": "qwen3-5-9b",
                "max_tokens": 64,
                "stream": True,
                "messages": [{"role": "user", "content": text}],
            }
        ),
        "/v1/responses": orjson.dumps({"model": "qwen3-5-9b", "input": text, "store": False}),
    }


async def _post(session: aiohttp.ClientSession, url: str, key: str, body: bytes) -> int:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with session.post(url, data=body, headers=headers) as response:
        await response.read()
        return response.status


async def _wait_healthy(
    session: aiohttp.ClientSession, base: str, gateway: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + 30
    while gateway.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(base + "/healthz") as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the gateway did not start (exit status {gateway.poll()})")


async def _one_route(url: str, key: str, venice: FakeVenice, label: str, size: int) -> str:
    """A fresh gateway (nothing freed earlier to reuse), warmed on the route, then one body."""
    port = free_port()
    env = {
        **os.environ,
        "BIND_ADDR": f"127.0.0.1:{port}",
        "DATABASE_URL": url,
        "VENICE_API_KEY": FAKE_VENICE_KEY,
        "VENICE_BASE_URL": venice.base_url,
        "LOG_LEVEL": "WARNING",
        "OTEL_SDK_DISABLED": "true",
    }
    gateway = subprocess.Popen(  # noqa: ASYNC220 (started once, stopped below)
        [sys.executable, "-m", "llmgw", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        path = base + label.split()[0]
        async with aiohttp.ClientSession() as session:
            await _wait_healthy(session, base, gateway)
            await _post(session, path, key, _bodies(4096)[label])
            body = _bodies(size)[label]
            before = _status_kib(gateway.pid, "VmRSS")
            _reset_peak(gateway.pid)
            status = await _post(session, path, key, body)
            peak = _status_kib(gateway.pid, "VmHWM")
    finally:
        gateway.terminate()
        await asyncio.to_thread(gateway.wait, 30)
    growth = (peak - before) * 1024
    return (
        f"{label:24} {status}  RSS before {before / 1024:6.1f} MiB  peak {peak / 1024:6.1f} MiB"
        f"  growth {growth / 2**20:6.1f} MiB = {growth / len(body):.1f}x the body"
    )


async def measure(database_url: str, mib: float) -> None:
    name = f"llmgw_body_rss_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(database_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    venice = FakeVenice(record_requests=False)
    try:
        url = urlunsplit(urlsplit(database_url)._replace(path="/" + name))
        await asyncio.to_thread(migrations.upgrade, url)
        connection = await asyncpg.connect(url)
        issued = await api_keys.create_key(connection, api_keys.KeySettings(name="rss"))
        await connection.close()
        await venice.start()
        print(f"one body of {mib:g} MiB per route, each to a fresh gateway process")
        for label in _bodies(0):
            print(await _one_route(url, issued.plaintext, venice, label, int(mib * 2**20)))
    finally:
        await venice.close()
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--mib", type=float, default=30.0)
    arguments = parser.parse_args()
    asyncio.run(measure(arguments.database_url, arguments.mib))


if __name__ == "__main__":
    main()
