"""One log line per refused request, folded when a storm repeats it.

A refusal is an error the gateway answers itself: a 401, 403, 413, 429, 503, a 400 of its own, a
request that is not valid HTTP. (A provider's own error answer is in the request's billing
record instead.) Its line names the route, status, error code, the key's 12-character prefix
(never the key) and how long the request took.

Refusals come in storms (a client retrying with a revoked key, a loop hitting its rate limit),
so lines are folded by kind (route, status, code, key prefix): the first of a kind is logged at
once and opens a window of ``window_seconds``; repeats within it are only counted, and when the
window ends one summary line gives their count. The next refusal of that kind is logged at once
again. At most ``max_kinds`` kinds are tracked at a time (key prefixes are the caller's to
choose); beyond that, new kinds are folded into one per route, status and code, prefix ``*``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import attrs

__all__ = ["Refusal", "RefusalLog"]

log = logging.getLogger("llmgw.refusals")

_ANY_KEY = "*"


@attrs.frozen
class Refusal:
    route: str  # the route's template (not the path as sent), "unmatched", or "invalid_http"
    status: int
    code: str
    key_prefix: str | None
    duration_ms: float | None = None  # None: refused before a request existed

    @property
    def level(self) -> int:
        return logging.WARNING if self.status >= 500 else logging.INFO

    def fields(self) -> dict[str, object]:
        return {
            "event": "request.refused",
            "route": self.route,
            "status": self.status,
            "code": self.code,
            "key_prefix": self.key_prefix,
        }


_Kind = tuple[str, int, str, str | None]


@attrs.define
class _Window:
    refusal: Refusal  # the first of its kind, logged at once
    ends_at: float
    repeats: int = 0


class RefusalLog:
    """Logs refusals and folds repeats; ``clock`` is injectable for tests (seconds, monotonic)."""

    def __init__(
        self,
        *,
        window_seconds: float = 60.0,
        max_kinds: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window_seconds = window_seconds
        self._max_kinds = max_kinds
        self._clock = clock
        # Opened in time order and all as long, so the oldest window is always the first.
        self._windows: dict[_Kind, _Window] = {}

    def record(self, refusal: Refusal) -> None:
        now = self._clock()
        self.sweep(now)
        kind: _Kind = (refusal.route, refusal.status, refusal.code, refusal.key_prefix)
        if kind not in self._windows and len(self._windows) >= self._max_kinds:
            kind = (refusal.route, refusal.status, refusal.code, _ANY_KEY)
            refusal = attrs.evolve(refusal, key_prefix=_ANY_KEY)
        window = self._windows.get(kind)
        if window is not None:
            window.repeats += 1
            return
        self._windows[kind] = _Window(refusal, now + self._window_seconds)
        log.log(
            refusal.level,
            "request refused: %s %d %s",
            refusal.route,
            refusal.status,
            refusal.code,
            extra={**refusal.fields(), "duration_ms": refusal.duration_ms},
        )

    def sweep(self, now: float | None = None) -> None:
        """Close the windows that have ended, each with its summary line if it folded repeats."""
        now = self._clock() if now is None else now
        while self._windows:
            kind, window = next(iter(self._windows.items()))
            if window.ends_at > now:
                return
            del self._windows[kind]
            self._summarise(window)

    def close(self) -> None:
        """Every open window's summary now (the process is stopping)."""
        windows, self._windows = self._windows, {}
        for window in windows.values():
            self._summarise(window)

    async def run(self, interval: float = 1.0) -> None:
        """Sweep every ``interval`` seconds, so a summary is at most that late after its window."""
        while True:
            await asyncio.sleep(interval)
            self.sweep()

    def _summarise(self, window: _Window) -> None:
        if window.repeats == 0:
            return
        refusal = window.refusal
        log.log(
            refusal.level,
            "%d more refusals like: %s %d %s",
            window.repeats,
            refusal.route,
            refusal.status,
            refusal.code,
            extra={
                **refusal.fields(),
                "repeats": window.repeats,
                "window_seconds": self._window_seconds,
            },
        )
