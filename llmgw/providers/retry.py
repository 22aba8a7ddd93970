"""When to retry an upstream call and how long to wait: exponential backoff with full jitter.

The provider's own hint wins: ``Retry-After`` (seconds or an HTTP date) or a rate-limit reset header
(epoch seconds, epoch milliseconds, or a duration). No wait is allowed to outlive the call's deadline.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

import attrs

__all__ = ["RETRYABLE_STATUSES", "RetryPolicy", "hinted_delay"]

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_RESET_HEADERS = ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens")
_EPOCH_MS_THRESHOLD = 1e12
_EPOCH_S_THRESHOLD = 1e9


def _parse_delay(value: str, now: float) -> float | None:
    text = value.strip().lower().removesuffix("s")
    try:
        number = float(text)
    except ValueError:
        try:
            return parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError, IndexError):
            return None
    if number >= _EPOCH_MS_THRESHOLD:
        return number / 1000.0 - now
    if number >= _EPOCH_S_THRESHOLD:
        return number - now
    return number


def hinted_delay(
    headers: Mapping[str, str], *, status: int, now: float | None = None
) -> float | None:
    """Seconds the upstream asked us to wait, if it said; never negative.

    Reset headers ride on every Venice answer, but they only explain a rate-limit refusal (429).
    """
    wall = time.time() if now is None else now
    names = ("retry-after", *_RESET_HEADERS) if status == 429 else ("retry-after",)
    for name in names:
        value = headers.get(name)
        if value:
            delay = _parse_delay(value, wall)
            if delay is not None:
                return max(0.0, delay)
    return None


@attrs.frozen
class RetryPolicy:
    max_retries: int = 2
    base_delay: float = 0.2
    max_delay: float = 8.0

    def backoff(self, retry_number: int) -> float:
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**retry_number))

    def delay(
        self, retry_number: int, remaining: float, *, status: int = 0, headers: Mapping[str, str]
    ) -> float | None:
        """Seconds to wait before retry ``retry_number`` (0-based), or None to stop retrying.

        ``status`` 0 stands for a transport failure (no answer at all).
        """
        if retry_number >= self.max_retries:
            return None
        hinted = hinted_delay(headers, status=status)
        wait = hinted if hinted is not None else self.backoff(retry_number)
        # A retry must still have time to be answered before the deadline.
        if wait >= remaining:
            return None
        return wait
