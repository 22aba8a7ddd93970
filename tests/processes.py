"""Helpers to run llmgw and the fake upstream as real processes on loopback ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from llmgw.compat import PUBLIC_APIS_ONLY_VARIABLE
from llmgw.config import ENVIRONMENT_VARIABLES

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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


def wait_for_http(
    url: str, *, timeout: float = 30.0, process: subprocess.Popen[str] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"process exited with {process.returncode}: {process.stderr.read() if process.stderr else ''}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 (loopback only)
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


def start_gateway(env: dict[str, str], port: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "serve"],
        env={**env, "BIND_ADDR": f"127.0.0.1:{port}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_http(f"http://127.0.0.1:{port}/healthz", process=process)
    return process


def stop(process: subprocess.Popen[str], *, timeout: float = 30.0) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode
