"""The policy checks a request passes before it reaches a provider, and what it costs afterwards.

- model allowlist: 403 ``model_not_allowed``;
- the subject's monthly budget in USD: 429 ``budget_exceeded`` until the first of next month (UTC);
- the key's tokens per minute: 429 ``tokens_per_minute_exceeded`` until the next minute.

Budget and token totals come from the usage ledger's running totals through AllowanceCache, so a
burst of concurrent requests can overshoot by what is in flight when the limit is crossed plus what
other replicas spent in the last second (documented in the README).
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, date, datetime, timedelta

import asyncpg

from llmgw.accounting.usage import UsageRecord
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.errors import ModelNotAllowed, RateLimited
from llmgw.policy.allowance import AllowanceCache
from llmgw.storage.database import database_errors
from llmgw.storage.usage import minute_start, month_start

__all__ = ["PolicyGuard"]

_BUDGET = """
SELECT s.monthly_budget_usd::float8 AS cap, coalesce(m.spend_usd, 0)::float8 AS spent
FROM subjects s
LEFT JOIN subject_monthly_spend m ON m.subject_id = s.subject_id AND m.month = $2
WHERE s.subject_id = $1
"""
_TOKENS = "SELECT tokens FROM api_key_token_windows WHERE api_key_id = $1 AND window_start_at = $2"
_NO_CAP = math.inf


def _next_month(month: date) -> date:
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1)


class PolicyGuard:
    def __init__(self, pool: asyncpg.Pool, *, ttl: float = 1.0) -> None:
        self._pool = pool
        # Remaining budget is cap - spent; a subject with no cap reads as infinite remaining.
        self._budget_left: AllowanceCache[tuple[uuid.UUID, date]] = AllowanceCache(
            self._fetch_budget_left, ttl=ttl
        )
        self._tokens_used: AllowanceCache[tuple[uuid.UUID, datetime]] = AllowanceCache(
            self._fetch_tokens_used, ttl=ttl
        )

    async def admit(self, key: AuthenticatedKey, model: str) -> None:
        """Raise the policy error this request breaks, if any."""
        if not key.allows_model(model):
            raise ModelNotAllowed(
                f"This key may not use model {model!r}; allowed: {', '.join(sorted(key.allowed_models))}.",
                param="model",
            )
        if key.subject_id is None and key.tokens_per_minute is None:
            return  # most keys: nothing counted, so no clock read on the hot path
        now = datetime.now(UTC)
        if key.subject_id is not None:
            month = month_start(now)
            if await self._budget_left.current((key.subject_id, month)) <= 0:
                reset = _next_month(month)
                raise RateLimited(
                    f"The monthly budget of subject {key.subject_id} is spent; it resets on "
                    f"{reset.isoformat()} (UTC).",
                    code="budget_exceeded",
                    headers={"Retry-After": str(_seconds_until(reset, now))},
                )
        if key.tokens_per_minute is not None:
            window = minute_start(now)
            if await self._tokens_used.current((key.id, window)) >= key.tokens_per_minute:
                wait = max(1, 60 - now.second)
                raise RateLimited(
                    f"This key used its {key.tokens_per_minute} tokens per minute; retry in {wait}s.",
                    code="tokens_per_minute_exceeded",
                    headers={"Retry-After": str(wait)},
                )

    def account(self, record: UsageRecord) -> None:
        """Charge a finished request to the local view at once (the ledger persists it)."""
        if record.subject_id is not None and record.cost_usd:
            self._budget_left.add(
                (record.subject_id, month_start(record.occurred_at)), -record.cost_usd
            )
        used = (record.input_tokens or 0) + (record.output_tokens or 0)
        if used:
            self._tokens_used.add((record.api_key_id, minute_start(record.occurred_at)), used)

    async def _fetch_budget_left(self, subject_and_month: tuple[uuid.UUID, date]) -> float:
        with database_errors():
            row = await self._pool.fetchrow(_BUDGET, *subject_and_month)
        if row is None or row["cap"] is None:
            return _NO_CAP
        left: float = row["cap"] - row["spent"]
        return left

    async def _fetch_tokens_used(self, key_and_window: tuple[uuid.UUID, datetime]) -> float:
        with database_errors():
            tokens = await self._pool.fetchval(_TOKENS, *key_and_window)
        return float(tokens or 0)


def _seconds_until(day: date, now: datetime) -> int:
    moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return max(1, math.ceil((moment - now).total_seconds()))
