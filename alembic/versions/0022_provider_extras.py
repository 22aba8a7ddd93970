"""Provider-reported extras (issue 29, item 7): the figures a provider reports beyond the core ones
(Venice's ``venice.cost.usd`` and ``venice.cost.diem``) are kept by name in a JSON object,
``provider_extras``, instead of a column per provider fact. ``usage_events.cost_diem`` and
``usage_hourly.cost_diem`` become ``{"venice.cost.diem": value}`` there (a rollup's zero sum
becomes ``{}``), and the downgrade puts them back.

``llmgw_extras_add(a, b)`` sums two such objects name by name (the hourly rollup's upsert) and the
aggregate ``llmgw_extras_sum`` sums a group's (the usage API and report).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_ADD = """
CREATE FUNCTION llmgw_extras_add(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT CASE
    WHEN b = '{}' THEN a
    WHEN a = '{}' THEN b
    ELSE (
        SELECT jsonb_object_agg(key, total) FROM (
            SELECT key, sum(value::numeric) AS total
            FROM (SELECT * FROM jsonb_each_text(a) UNION ALL SELECT * FROM jsonb_each_text(b)) e
            GROUP BY key
        ) summed
    )
END
$$
"""
_SUM = """
CREATE AGGREGATE llmgw_extras_sum(jsonb) (
    SFUNC = llmgw_extras_add, STYPE = jsonb, INITCOND = '{}', PARALLEL = SAFE
)
"""


def _extras_column() -> sa.Column[object]:
    return sa.Column(
        "provider_extras", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")
    )


def upgrade() -> None:
    op.execute(_ADD)
    op.execute(_SUM)
    op.add_column("usage_events", _extras_column())
    op.create_check_constraint(
        "provider_extras", "usage_events", "jsonb_typeof(provider_extras) = 'object'"
    )
    op.execute(
        "UPDATE usage_events SET provider_extras = jsonb_build_object('venice.cost.diem', cost_diem) "
        "WHERE cost_diem IS NOT NULL"
    )
    op.drop_column("usage_events", "cost_diem")  # and its check constraint
    op.add_column("usage_hourly", _extras_column())
    op.execute(
        "UPDATE usage_hourly SET provider_extras = jsonb_build_object('venice.cost.diem', cost_diem) "
        "WHERE cost_diem <> 0"
    )
    op.drop_column("usage_hourly", "cost_diem")


def downgrade() -> None:
    op.add_column("usage_events", sa.Column("cost_diem", sa.Numeric(30, 18), nullable=True))
    op.create_check_constraint("cost_diem", "usage_events", "cost_diem IS NULL OR cost_diem >= 0")
    op.execute(
        "UPDATE usage_events SET cost_diem = (provider_extras ->> 'venice.cost.diem')::numeric "
        "WHERE provider_extras ? 'venice.cost.diem'"
    )
    op.drop_column("usage_events", "provider_extras")  # and its check constraint
    op.add_column(
        "usage_hourly",
        sa.Column("cost_diem", sa.Numeric(38, 18), nullable=False, server_default=sa.text("0")),
    )
    op.execute(
        "UPDATE usage_hourly SET cost_diem = (provider_extras ->> 'venice.cost.diem')::numeric "
        "WHERE provider_extras ? 'venice.cost.diem'"
    )
    op.alter_column("usage_hourly", "cost_diem", server_default=None)
    op.drop_column("usage_hourly", "provider_extras")
    op.execute("DROP AGGREGATE llmgw_extras_sum(jsonb)")
    op.execute("DROP FUNCTION llmgw_extras_add(jsonb, jsonb)")
