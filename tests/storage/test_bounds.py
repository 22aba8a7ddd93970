"""The bounds input is checked against are the schema's own."""

from __future__ import annotations

import sqlalchemy as sa

from llmgw.storage import bounds, schema


def test_the_budget_bounds_are_the_columns_precision_and_scale() -> None:
    kind = schema.subjects.c.monthly_budget_usd.type
    assert isinstance(kind, sa.Numeric)
    assert (kind.precision, kind.scale) == bounds.BUDGET_NUMERIC


def test_the_integer_bounds_are_the_columns_type() -> None:
    for column in ("rate_limit_requests", "rate_limit_window_seconds", "tokens_per_minute"):
        kind = schema.api_keys.c[column].type
        assert type(kind) is sa.Integer  # int4: up to bounds.INT4_MAX
    assert bounds.INT4_MAX == 2**31 - 1


def test_a_budget_below_the_smallest_stored_amount_is_refused() -> None:
    assert bounds.budget_problem(0.0) is None
    assert bounds.budget_problem(float(bounds.BUDGET_MIN_USD)) is None
    assert bounds.budget_problem(float(bounds.BUDGET_MIN_USD) / 2) is not None
    assert bounds.budget_problem(float(bounds.BUDGET_MAX_USD)) is not None
