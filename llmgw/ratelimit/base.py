"""What every rate-limit backend answers, and how a decision becomes response headers."""

from __future__ import annotations

import math
from typing import Protocol

import attrs

from llmgw.auth.authenticator import AuthenticatedKey

__all__ = ["RateLimitDecision", "RateLimiter"]


@attrs.frozen(slots=True)
class RateLimitDecision:
    allowed: bool
    limit: int
    remaining: int
    reset_seconds: float

    @property
    def retry_after(self) -> int:
        """Whole seconds until the window ends, at least 1 (the Retry-After header)."""
        return max(1, math.ceil(self.reset_seconds))

    def headers(self) -> dict[str, str]:
        return {
            "x-ratelimit-limit-requests": str(self.limit),
            "x-ratelimit-remaining-requests": str(self.remaining),
            "x-ratelimit-reset-requests": f"{self.retry_after}s",
        }


class RateLimiter(Protocol):
    """Counts one request against the key's current window, atomically across replicas.

    Backends fail closed: when their store is unreachable they raise ServiceUnavailable.
    """

    async def hit(self, key: AuthenticatedKey) -> RateLimitDecision: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...
