"""``python -m bench.body_rss``: what a large request body costs a gateway process in memory.

Starts the fake Venice here and ``python -m llmgw serve`` (one worker) against a throwaway database
on ``--database-url``'s server, warms the gateway with a small request, then for each route sends
one body of ``--mib`` MiB and reads the process's peak resident set (``VmHWM``, reset before each
body through ``/proc/PID/clear_refs``). Prints the peak's growth over the resident set before the
body, and that growth as a multiple of the body's size. Then ``--burst`` such bodies at once,
each answered a second later, to a gateway with ``--bound-mib`` of REQUEST_BODY_MEMORY_BYTES: how
many were answered and refused, and the peak's growth as a multiple of the bound.
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
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import orjson

from bench.services import free_port
from llmgw.storage import api_keys, migrations
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour, FakeVenice


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


@contextlib.asynccontextmanager
async def _gateway(url: str, venice: FakeVenice, **environ: str) -> AsyncIterator[tuple[str, int]]:
    """A fresh gateway process (nothing freed earlier to reuse): its URL and pid."""
    port = free_port()
    env = {
        **os.environ,
        "BIND_ADDR": f"127.0.0.1:{port}",
        "DATABASE_URL": url,
        "VENICE_API_KEY": FAKE_VENICE_KEY,
        "VENICE_BASE_URL": venice.base_url,
        "LOG_LEVEL": "WARNING",
        "OTEL_SDK_DISABLED": "true",
        **environ,
    }
    gateway = subprocess.Popen(  # noqa: ASYNC220 (started once, stopped below)
        [sys.executable, "-m", "llmgw", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:
            await _wait_healthy(session, base, gateway)
        yield base, gateway.pid
    finally:
        gateway.terminate()
        await asyncio.to_thread(gateway.wait, 30)


def _growth(pid: int, before_kib: int) -> tuple[float, int]:
    """Peak RSS (MiB) since the reset, and its growth over ``before_kib`` (bytes)."""
    peak = _status_kib(pid, "VmHWM")
    return peak / 1024, (peak - before_kib) * 1024


async def _one_body(url: str, key: str, venice: FakeVenice, label: str, size: int) -> str:
    """One body to a fresh gateway warmed on the route."""
    async with _gateway(url, venice) as (base, pid), aiohttp.ClientSession() as session:
        path = base + label.split()[0]
        await _post(session, path, key, _bodies(4096)[label])
        body = _bodies(size)[label]
        before = _status_kib(pid, "VmRSS")
        _reset_peak(pid)
        status = await _post(session, path, key, body)
        peak, growth = _growth(pid, before)
    return (
        f"{label:24} {status}  RSS before {before / 1024:6.1f} MiB  peak {peak:6.1f} MiB"
        f"  growth {growth / 2**20:6.1f} MiB = {growth / len(body):.1f}x the body"
    )


async def _burst(url: str, key: str, venice: FakeVenice, size: int, count: int, bound: int) -> str:
    """``count`` bodies at once on /v1/messages, each answered a second later, against a gateway
    whose REQUEST_BODY_MEMORY_BYTES is ``bound``."""
    environ = {"REQUEST_BODY_MEMORY_BYTES": str(bound)}
    async with _gateway(url, venice, **environ) as (base, pid), aiohttp.ClientSession() as session:
        path = base + "/v1/messages"
        await _post(session, path, key, _bodies(4096)["/v1/messages"])
        body = _bodies(size)["/v1/messages"]
        before = _status_kib(pid, "VmRSS")
        _reset_peak(pid)
        venice.default_behaviour = Behaviour(delay_before_headers=1.0)
        try:
            statuses = await asyncio.gather(
                *(_post(session, path, key, body) for _ in range(count))
            )
        finally:
            venice.default_behaviour = Behaviour()
        peak, growth = _growth(pid, before)
    counted = ", ".join(f"{statuses.count(s)} x {s}" for s in sorted(set(statuses)))
    return (
        f"{count} bodies of {size / 2**20:g} MiB at once, bound {bound / 2**20:g} MiB: {counted}; "
        f"peak {peak:.1f} MiB, growth {growth / 2**20:.1f} MiB = {growth / bound:.1f}x the bound"
    )


async def measure(database_url: str, mib: float, burst: int, bound_mib: float) -> None:
    name = f"llmgw_body_rss_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(database_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    venice = FakeVenice(record_requests=False)
    try:
        url = urlunsplit(urlsplit(database_url)._replace(path="/" + name))
        await asyncio.to_thread(migrations.upgrade, url)
        connection = await asyncpg.connect(url)
        issued = await api_keys.create_key(
            connection, api_keys.KeySettings(name="rss", rate_limit_requests=10_000)
        )
        await connection.close()
        await venice.start()
        size = int(mib * 2**20)
        print(f"one body of {mib:g} MiB per route, each to a fresh gateway process")
        for label in _bodies(0):
            print(await _one_body(url, issued.plaintext, venice, label, size))
        if burst:
            bound = int(bound_mib * 2**20)
            print(await _burst(url, issued.plaintext, venice, size, burst, bound))
    finally:
        await venice.close()
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--mib", type=float, default=30.0, help="each body's size")
    parser.add_argument("--burst", type=int, default=16, help="bodies sent at once (0: none)")
    parser.add_argument("--bound-mib", type=float, default=64.0, help="the burst's memory bound")
    arguments = parser.parse_args()
    asyncio.run(
        measure(arguments.database_url, arguments.mib, arguments.burst, arguments.bound_mib)
    )


if __name__ == "__main__":
    main()
