"""Per-key fixed-window request limits whose state is shared by every replica."""

from llmgw.ratelimit.base import RateLimitDecision, RateLimiter

__all__ = ["RateLimitDecision", "RateLimiter"]
