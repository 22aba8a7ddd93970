"""What the schema can store, in one place; admin and CLI input is checked against it.

A value outside these bounds would make asyncpg or PostgreSQL fail mid-request (a 500); checked up
front it is a 400 naming the field. The column types are restated here rather than read from
``schema.py``, which would import SQLAlchemy into every gateway process; ``tests/storage/
test_bounds.py`` fails when the two disagree.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from decimal import Decimal

__all__ = [
    "BUDGET_MAX_USD",
    "BUDGET_MIN_USD",
    "BUDGET_NUMERIC",
    "INT4_MAX",
    "LATEST_TIME",
    "MAX_GRACE_SECONDS",
    "MAX_OFFSET",
    "MAX_RETENTION_DAYS",
    "budget_problem",
    "time_problem",
]

INT4_MAX = 2**31 - 1  # every sa.Integer column: limits, windows, tokens per minute
MAX_OFFSET = 2**63 - 1 - 1000  # OFFSET is a bigint; a page's limit is added to it
# Postgres keeps timestamps to the year 294276, Python's datetime only to 9999; a day's margin
# keeps any zone's offset from overflowing on the way to UTC.
EARLIEST_TIME = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(9999, 12, 30, tzinfo=UTC)
MAX_GRACE_SECONDS = 100 * 365 * 86_400  # now() + grace must stay a storable time
MAX_RETENTION_DAYS = 100 * 366


# subjects.monthly_budget_usd is NUMERIC(precision, scale).
BUDGET_NUMERIC = (18, 8)
BUDGET_MIN_USD = Decimal(10) ** -BUDGET_NUMERIC[1]  # the smallest amount above zero
BUDGET_MAX_USD = Decimal(10) ** (BUDGET_NUMERIC[0] - BUDGET_NUMERIC[1])  # the first too large


def budget_problem(amount: float) -> str | None:
    """Why ``amount`` cannot be stored as a budget exactly enough, or None."""
    if not math.isfinite(amount) or amount < 0:
        return "must be a number >= 0"
    if amount >= BUDGET_MAX_USD:
        return f"must be below {BUDGET_MAX_USD:f}"
    if 0 < amount < BUDGET_MIN_USD:
        # Stored, it would round to 0: a budget that refuses everything, not the one asked for.
        return f"must be 0 or at least {BUDGET_MIN_USD:f} (the smallest amount stored)"
    return None


def time_problem(moment: datetime) -> str | None:
    try:
        utc = moment.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not EARLIEST_TIME <= utc <= LATEST_TIME:
        return f"must be between {EARLIEST_TIME:%Y-%m-%d} and {LATEST_TIME:%Y-%m-%d}"
    return None
