"""Open files: as many as the system allows, and a clean refusal near the limit instead of resets.

Every stream holds about 2 file descriptors (the caller's connection and the provider's). Under the
common soft limit of 1,024 a process broke at about 500 streams: ``accept`` and the provider's
``connect`` failed with EMFILE, and callers saw resets and 502s, with nothing logged. ``serve``
therefore raises its soft ``RLIMIT_NOFILE`` to the hard limit at start and logs what it got.

Near the limit (``reserve`` descriptors left, for the database pool, the log and the like) a new
request is refused with a 503 ``too_many_open_files`` and ``Retry-After``, in the caller's API
shape, and its connection closed; the first refusal of a run of them is logged at WARNING. The
count is read from ``/proc/self/fd`` at most every ``SAMPLE_SECONDS``; connections accepted and
requests admitted since (each may open a connection to a provider) are added, so a burst is seen
before the next reading.

A burst of new connections faster than the process can answer them may still exhaust the limit in
``accept`` itself, before any request is read (libuv then closes the newest connection); the
raised soft limit is what keeps that far away.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from collections.abc import Callable

from aiohttp import web

from llmgw.errors import ServiceUnavailable

__all__ = [
    "FDS_PER_STREAM",
    "OPEN_FILES",
    "OpenFiles",
    "open_files_refusal",
    "raise_open_file_limit",
]

log = logging.getLogger("llmgw.serve")

FDS_PER_STREAM = 2
SAMPLE_SECONDS = 0.25
RETRY_AFTER_SECONDS = 5
_FD_DIRECTORIES = ("/proc/self/fd", "/dev/fd")
_LIVENESS = "/healthz"


def raise_open_file_limit() -> int:
    """Raise the soft limit to the hard one (as far as it can be raised); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard
    if hard == resource.RLIM_INFINITY:
        # An unlimited hard limit cannot be the soft one; the kernel's own ceiling can.
        wanted = _kernel_ceiling()
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %d (%s)", soft, exc)
    log.info(
        "open files: soft limit %d (hard %s): room for about %d concurrent streams "
        "(%d descriptors each)",
        soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
        soft // FDS_PER_STREAM,
        FDS_PER_STREAM,
    )
    return soft


def _kernel_ceiling() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as ceiling:
            return int(ceiling.read())
    except (OSError, ValueError):
        return 1 << 20


def _count_open() -> int | None:
    for directory in _FD_DIRECTORIES:
        try:
            return len(os.listdir(directory))
        except OSError:
            continue
    return None  # no way to count here: the guard never refuses


class OpenFiles:
    """This process's file descriptors against its limit; connections counted as they come."""

    def __init__(
        self,
        limit: int,
        *,
        reserve: int | None = None,
        count_open: Callable[[], int | None] = _count_open,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.reserve = max(32, limit // 16) if reserve is None else reserve
        self._count_open = count_open
        self._clock = clock
        self._connections = 0
        self._sampled: int | None = None
        self._connections_at_sample = 0
        self._admitted = 0  # requests admitted since the last reading
        self._sampled_at = float("-inf")
        self._refusing = False

    def connection_made(self) -> None:
        self._connections += 1

    def connection_lost(self) -> None:
        self._connections -= 1

    def estimate(self) -> int | None:
        """Descriptors open now, as far as known: the last reading, and one for each connection
        accepted and each request admitted since."""
        now = self._clock()
        if now - self._sampled_at >= SAMPLE_SECONDS:
            self._sampled = self._count_open()
            self._sampled_at, self._connections_at_sample = now, self._connections
            self._admitted = 0
        if self._sampled is None:
            return None
        newer = max(self._connections - self._connections_at_sample, 0)
        return self._sampled + newer + self._admitted

    def admit(self) -> bool:
        """False near the limit: no room left for the request's connection to a provider."""
        estimate = self.estimate()
        near = estimate is not None and estimate + 1 > self.limit - self.reserve
        if not near:
            self._admitted += 1
        if near and not self._refusing:
            log.warning(
                "open files: about %d of %d in use; new requests are refused with 503 "
                "too_many_open_files until some close (raise the hard limit: ulimit -n, "
                "LimitNOFILE=, docker --ulimit nofile=)",
                estimate, self.limit,
            )  # fmt: skip
        elif not near and self._refusing:
            log.info(
                "open files: below the limit again (%s of %d); requests are served",
                estimate, self.limit,
            )  # fmt: skip
        self._refusing = near
        return not near


OPEN_FILES = web.AppKey("open_files", OpenFiles)


def open_files_refusal(app: web.Application, path: str) -> ServiceUnavailable | None:
    """The refusal of a request for ``path`` while the process is near its open files limit
    (``serve`` sets ``OPEN_FILES`` on ``app``; without it, none). ``/healthz`` always passes: a
    process that is busy is alive, and restarting it would end every stream it holds. The
    refusal's connection is closed (gateway_middleware): its descriptor is what is short."""
    guard = app.get(OPEN_FILES)
    if guard is None or path == _LIVENESS or guard.admit():
        return None
    return ServiceUnavailable(
        "The gateway is at its limit of open connections; try again shortly.",
        code="too_many_open_files",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )
