"""CPU time and memory of processes, read straight from /proc.

/proc is exact (kernel tick accounting summed over all threads), costs a file read, and works for
processes of other users (the embedded Postgres runs as its own user); psutil would read the same
files. Everything returns None or skips a process that has gone away in the meantime.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import attrs

__all__ = [
    "CpuSnapshot",
    "Memory",
    "SystemCpu",
    "cpu_us",
    "descendants",
    "memory",
    "parent_pid",
    "threads",
]

_PROC = Path("/proc")
_US_PER_TICK = 1_000_000 / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may itself contain spaces)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()


def cpu_us(pid: int) -> int | None:
    """User plus system CPU time of the process (all its threads), in microseconds."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    # After the name: state(0) ppid(1) ... utime(11) stime(12), per proc(5).
    return round((int(fields[11]) + int(fields[12])) * _US_PER_TICK)


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (Postgres backends are children of the postmaster)."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            ppid = parent_pid(int(entry.name))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    pending = [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


@attrs.frozen
class Memory:
    rss_kib: int
    peak_rss_kib: int

    @property
    def rss_mib(self) -> float:
        return self.rss_kib / 1024

    @property
    def peak_rss_mib(self) -> float:
        return self.peak_rss_kib / 1024


def memory(pid: int) -> Memory | None:
    """Current (VmRSS) and peak (VmHWM) resident set size."""
    try:
        text = (_PROC / str(pid) / "status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0])
    if len(values) < 2:
        return None  # a zombie has no memory lines
    return Memory(rss_kib=values["VmRSS"], peak_rss_kib=values["VmHWM"])


@attrs.frozen
class CpuSnapshot:
    """CPU time per pid at one moment, to be subtracted from a later snapshot."""

    per_pid: dict[int, int]

    @classmethod
    def take(cls, pids: Iterable[int]) -> CpuSnapshot:
        times = {pid: cpu_us(pid) for pid in pids}
        return cls({pid: value for pid, value in times.items() if value is not None})

    def since(self, earlier: CpuSnapshot) -> int:
        """CPU microseconds spent in between; processes started in between count in full."""
        return sum(value - earlier.per_pid.get(pid, 0) for pid, value in self.per_pid.items())


@attrs.frozen
class SystemCpu:
    """Busy CPU time of every core (/proc/stat), to see how much of it was not the benchmark's."""

    busy_us: dict[int, int]

    @classmethod
    def take(cls) -> SystemCpu:
        busy: dict[int, int] = {}
        for line in (_PROC / "stat").read_text().splitlines():
            name, *values = line.split()
            if name.startswith("cpu") and name != "cpu":
                # user nice system idle iowait irq softirq steal...: idle and iowait are not busy.
                ticks = [int(value) for value in values[:8]]
                busy[int(name[3:])] = round((sum(ticks[:3]) + ticks[5] + ticks[6]) * _US_PER_TICK)
        return cls(busy)

    def since(self, earlier: SystemCpu) -> int:
        return sum(value - earlier.busy_us.get(core, 0) for core, value in self.busy_us.items())


def threads(pid: int) -> list[int]:
    try:
        return [int(entry.name) for entry in (_PROC / str(pid) / "task").iterdir()]
    except (FileNotFoundError, ProcessLookupError):
        return []
