"""Child processes of the benchmark: spawning them pinned to a core, waiting for them, stopping them.

Every child writes stdout and stderr to a log file (never a pipe that could fill and stall it) and
is stopped with SIGTERM, then SIGKILL. Children also get SIGTERM from the kernel if the benchmark
dies without cleaning up (PR_SET_PDEATHSIG), so nothing outlives an interrupted run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from bench.procstat import threads

__all__ = [
    "Child",
    "ChildFailed",
    "Pinning",
    "adopt_for_the_run",
    "free_port",
    "redis_answers",
    "redis_commands_processed",
    "redis_info",
    "redis_pid",
    "spawn",
    "wait_for_health",
    "wait_for_listening",
    "wait_for_workers",
]

_LISTENING = re.compile(rb"listening on (http://\S+)")
_PR_SET_PDEATHSIG = 1


class ChildFailed(Exception):
    """A child exited or never became ready; the message ends with its last log lines."""


@attrs.frozen
class Pinning:
    """Which core the proxy under test gets and which core everything else shares."""

    proxy_core: int | None
    rest_core: int | None
    taskset: str | None
    note: str
    nice: int = 0  # applied to the benchmark and every process it measures; 0 leaves it

    @classmethod
    def detect(cls, nice: int = 0) -> Pinning:
        taskset = shutil.which("taskset")
        cores = sorted(os.sched_getaffinity(0))
        if taskset is None:
            return cls(None, None, None, "taskset not found: processes run unpinned", nice)
        if len(cores) < 2:
            return cls(None, None, None, "fewer than 2 usable cores: processes run unpinned", nice)
        note = f"proxy on core {cores[0]}, everything else on {cores[1]}"
        return cls(cores[0], cores[1], taskset, note, nice)

    @property
    def both_cores(self) -> tuple[int, ...] | None:
        """The proxy's and the load side's core, for what must run on both (workers)."""
        if self.proxy_core is None or self.rest_core is None:
            return None
        return (self.proxy_core, self.rest_core)

    def prefix(self, core: int | tuple[int, ...] | None) -> list[str]:
        if self.taskset is None or core is None:
            return []
        cores = (core,) if isinstance(core, int) else core
        return [self.taskset, "-c", ",".join(str(c) for c in cores)]

    def pin_self(self) -> str:
        """Pin (and renice) this process; children, embedded Postgres too, inherit both.

        Returns a note on the priority for the report.
        """
        if self.rest_core is not None:
            os.sched_setaffinity(0, {self.rest_core})
        if not self.nice:
            return "default priority"
        try:
            os.setpriority(os.PRIO_PROCESS, 0, self.nice)
        except PermissionError:
            return f"nice {self.nice} refused (needs root): default priority"
        return f"all measured processes at nice {self.nice}"


@attrs.define
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> ChildFailed:
        return ChildFailed(f"{self.name} {what}; last log lines:\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log_dir: Path,
    pinning: Pinning,
    core: int | tuple[int, ...] | None,
    cwd: Path,
) -> Child:
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*pinning.prefix(core), *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            # preexec_fn is unsafe with threads; the benchmark starts none before spawning.
            preexec_fn=_die_with_parent,
        )
    return Child(name, process, log_path, time.perf_counter())


def wait_for_workers(child: Child, workers: int, timeout: float = 60.0) -> None:
    """Until each of ``serve --workers N``'s workers has logged that it is serving."""
    deadline = time.monotonic() + timeout
    while workers > 1:
        serving = child.log_path.read_bytes().count(b" serving (pid ")
        if serving >= workers:
            return
        if not child.alive():
            raise child.failure("exited")
        if time.monotonic() > deadline:
            raise child.failure(f"had {serving} of {workers} workers serving after {timeout:.0f} s")
        time.sleep(0.1)


def wait_for_listening(child: Child, timeout: float = 30.0) -> str:
    """The URL from the child's ``listening on URL`` line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = _LISTENING.search(child.log_path.read_bytes())
        if match:
            return match.group(1).decode()
        if not child.alive():
            raise child.failure(f"exited with status {child.process.returncode}")
        time.sleep(0.02)
    raise child.failure(f"printed no 'listening on' line within {timeout:.0f}s")


def wait_for_health(child: Child, url: str, timeout: float = 60.0) -> float:
    """Poll ``url`` until it answers 200; returns seconds since the child was spawned."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:  # noqa: S310 - loopback
                if response.status == 200:
                    return time.perf_counter() - child.started_at
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if not child.alive():
            raise child.failure(f"exited with status {child.process.returncode} during startup")
        time.sleep(0.01)
    raise child.failure(f"did not answer {url} within {timeout:.0f}s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def redis_answers(host: str = "127.0.0.1", port: int = 6379) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redis_info(section: str, host: str = "127.0.0.1", port: int = 6379) -> dict[str, str] | None:
    """One section of Redis INFO as a dict; None if Redis does not answer."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.sendall(f"INFO {section}\r\n".encode())
            data = _read_bulk_reply(sock)
    except OSError:
        return None
    fields = (line.partition(":") for line in data.decode(errors="replace").splitlines())
    return {name: value for name, sep, value in fields if sep}


def redis_commands_processed() -> int | None:
    """Redis's server-wide command counter (this query counts as one more command)."""
    info = redis_info("stats")
    value = None if info is None else info.get("total_commands_processed")
    return None if value is None else int(value)


def redis_pid() -> int | None:
    info = redis_info("server")
    value = None if info is None else info.get("process_id")
    return None if value is None else int(value)


def adopt_for_the_run(stack: contextlib.ExitStack, pids: Iterable[int], pinning: Pinning) -> None:
    """Give processes we did not start (a system Postgres or Redis) our core and priority.

    Both are restored when the stack closes. Every thread is moved: ``sched_setaffinity`` and
    ``setpriority`` on a pid only reach its main thread.
    """
    for pid in pids:
        for tid in threads(pid):
            try:
                old_cores = os.sched_getaffinity(tid)
                old_nice = os.getpriority(os.PRIO_PROCESS, tid)
                if pinning.rest_core is not None:
                    os.sched_setaffinity(tid, {pinning.rest_core})
                if pinning.nice:
                    os.setpriority(os.PRIO_PROCESS, tid, pinning.nice)
            except (ProcessLookupError, PermissionError):
                continue
            stack.callback(_restore, tid, old_cores, old_nice)


def _restore(tid: int, cores: set[int], nice: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.sched_setaffinity(tid, cores)
        os.setpriority(os.PRIO_PROCESS, tid, nice)


def _read_bulk_reply(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    header, _, body = data.partition(b"\r\n")
    if not header.startswith(b"$"):
        return body
    size = int(header[1:])
    while len(body) < size:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return body[:size]
