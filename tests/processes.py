"""The tests' helpers: llmgw and the fake upstreams as real processes on loopback ports, waiting
for what a process does, and a clock a test sets."""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Self

import aiohttp
import attrs
from aiohttp import web

from llmgw.compat import PUBLIC_APIS_ONLY_VARIABLE
from llmgw.config import ENVIRONMENT_VARIABLES

REPO_ROOT = Path(__file__).resolve().parents[1]


# The kernel hands the ports of its ephemeral range to binds on port 0 (every fake upstream a test
# serves, any other process on the machine) and to outgoing connections: a listening port taken
# from that range and left for a moment (a replica restarted on its port) may be given to one of
# them meanwhile, and the restart fails with "Address already in use" (issue 29). Services listen
# on ports outside it, as compose's replicas do (3000): so do the tests' gateways.
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LINUX_EPHEMERAL = (32768, 60999)  # the default, also outside macOS's 49152-65535 from below
_LOWEST_SERVICE_PORT = 10_000


def _service_ports() -> range:
    """The ports outside the kernel's ephemeral range (the larger side of it)."""
    try:
        low, high = (int(bound) for bound in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = _LINUX_EPHEMERAL
    return max(range(_LOWEST_SERVICE_PORT, low), range(high + 1, 65536), key=len)


def free_port() -> int:
    """A loopback port nothing is bound to now, outside the kernel's ephemeral range: nothing
    the kernel numbers itself takes it, so a process may leave it and bind it again."""
    ports = _service_ports()
    for _ in range(1000):
        port = random.choice(ports)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free loopback port in {ports.start}-{ports.stop - 1}")


# Where a test's gateway finds "Venice" unless the test says: a closed loopback port. serve lists
# every provider's models at start, and a test must never reach out past this machine.
NO_VENICE_URL = "http://127.0.0.1:9/api/v1"


# The gateway's own settings: a test's process must not inherit any of them from the shell that
# runs the suite (a developer's BIND_ADDR, LOG_LEVEL, REDIS_URL, ...).
_GATEWAY_SETTINGS = frozenset(var.name for var in ENVIRONMENT_VARIABLES) | {"DATABASE_URL"}
# ... except the suite's own mode: run with only public APIs, its gateways run so too.
_SUITE_MODE = frozenset({PUBLIC_APIS_ONLY_VARIABLE})


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the gateway's settings, plus ``extra``.

    ``BIND_ADDR`` is a free loopback port unless ``extra`` names one: never the default
    0.0.0.0:3000, where a gateway may be running on the machine that runs the tests.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if k in _SUITE_MODE
        or (k not in _GATEWAY_SETTINGS and not k.startswith(("LLMGW_", "OTEL_", "VENICE_")))
    }
    env["VENICE_BASE_URL"] = NO_VENICE_URL
    env["BIND_ADDR"] = f"127.0.0.1:{free_port()}"
    env.update(extra)
    return env


def run_llmgw(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m llmgw ARGS`` to completion, output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def serve_here(app: web.Application, **options: Any) -> tuple[web.AppRunner, int]:
    """``app`` served in this process on a free loopback port (``options`` as ``AppRunner``
    takes them): its runner, to clean up, and the port."""
    runner = web.AppRunner(app, **options)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


class ServedHere:
    """A fake API served in this process on a free loopback port while its ``async with`` lasts;
    a subclass says what it serves (``app``)."""

    port = 0
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self._runner, self.port = await serve_here(
            self.app(), access_log=None, shutdown_timeout=0.5
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@attrs.define
class LoopbackProcess:
    """A process serving HTTP on a loopback port."""

    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Clock:
    """A clock the test sets: calling it returns ``now``, which only the test moves."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# Waiting: only for what another process or task does on its own time (a line in a log, a row
# written, a port listening); what the code under test times itself takes a Clock instead.


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    within: float = 2.5,
    what: str = "the condition",
    every: float = 0.02,
) -> float:
    """Poll ``condition`` (plain or async) until it holds; the seconds that took. Fails past
    ``within`` seconds."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await _holds(condition):
        assert loop.time() - started < within, f"not within {within}s: {what}"
        await asyncio.sleep(every)
    return loop.time() - started


async def _holds(condition: Callable[[], bool | Awaitable[bool]]) -> bool:
    held = condition()
    return await held if inspect.isawaitable(held) else held


def wait_until(
    condition: Callable[[], bool], *, within: float = 30.0, what: str = "the condition"
) -> None:
    """:func:`eventually` outside the event loop (blocking), for starting processes."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {within}s: {what}")
        time.sleep(0.05)


def answers_http(url: str) -> bool:
    """Whether ``url`` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 (loopback only)
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def listening(port: int) -> bool:
    """Whether something accepts connections on the loopback ``port`` now."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


async def post_chat(
    session: aiohttp.ClientSession,
    base_url: str,
    key: str,
    *,
    stream: bool = False,
    request_id: str | None = None,
    timeout: float = 15.0,
) -> tuple[int, bytes, str]:
    """A chat completion ("hi" to qwen3-5-9b) through the gateway at ``base_url``: its status, its
    body, and its request id (``request_id``, or a new one)."""
    request_id = request_id or uuid.uuid4().hex
    async with session.post(
        f"{base_url}/v1/chat/completions",
        json={
            "model": "qwen3-5-9b",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
        },
        headers={"Authorization": f"Bearer {key}", "X-Request-Id": request_id},
        timeout=aiohttp.ClientTimeout(total=timeout),
    ) as response:
        return response.status, await response.read(), request_id


def running(process: subprocess.Popen[str] | subprocess.Popen[bytes], name: str) -> bool:
    """True while ``process`` runs; RuntimeError (with its stderr, if piped) once it exited."""
    if process.poll() is None:
        return True
    stderr = process.stderr.read() if process.stderr else ""
    raise RuntimeError(f"{name} exited with {process.returncode}: {stderr!r}")


def wait_for_http(
    url: str, *, timeout: float = 30.0, process: subprocess.Popen[str] | None = None
) -> None:
    wait_until(
        lambda: (process is None or running(process, "the process")) and answers_http(url),
        within=timeout,
        what=f"{url} answers",
    )


def serve(env: dict[str, str], port: int, **popen: Any) -> subprocess.Popen[Any]:
    """``python -m llmgw serve`` on the loopback ``port``, not waited for; ``popen`` as
    ``subprocess.Popen`` takes it."""
    command = [sys.executable, "-m", "llmgw", "serve"]
    return subprocess.Popen(command, env={**env, "BIND_ADDR": f"127.0.0.1:{port}"}, **popen)


def start_gateway(env: dict[str, str], port: int) -> subprocess.Popen[str]:
    """A gateway serving on ``port``, its output in pipes (read them only after it stopped)."""
    process = serve(env, port, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_http(f"http://127.0.0.1:{port}/healthz", process=process)
    return process


def stop(process: subprocess.Popen[Any], *, timeout: float = 30.0) -> int:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``; its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode
