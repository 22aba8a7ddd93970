"""The embedded cluster's handle file: entries of processes that are gone are dropped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from llmgw.storage.embedded import HANDLE_FILE, forget_dead_handles


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
