"""Console: hourly usage rollups (backfilled from the ledger) and console sign-in sessions.

Revision ID: 0007
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, UUID

from alembic import op

revision = "0007"
down_revision = "0004"
branch_labels = None
depends_on = None

# The bucket bounds of llmgw.storage.rollup.LATENCY_BUCKETS_MS when this revision was written.
_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000, 600000)


def upgrade() -> None:
    op.create_table(
        "usage_hourly",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("api_key_id", UUID(as_uuid=True), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("subject_id", UUID(as_uuid=True), nullable=True),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Numeric(38, 18), nullable=False),
        sa.Column("cost_diem", sa.Numeric(38, 18), nullable=False),
        sa.Column("duration_ms_sum", sa.Float(), nullable=False),
        sa.Column("latency_buckets", ARRAY(sa.BigInteger()), nullable=False),
        sa.PrimaryKeyConstraint("hour", "api_key_id", "model", name="pk_usage_hourly"),
        sa.CheckConstraint("requests > 0", name="requests_positive"),
        sa.CheckConstraint("errors >= 0 AND errors <= requests", name="errors_within_requests"),
        sa.CheckConstraint(
            "date_trunc('hour', hour AT TIME ZONE 'UTC') = hour AT TIME ZONE 'UTC'",
            name="hour_is_whole",
        ),
    )
    op.create_index("ix_usage_hourly_subject_id", "usage_hourly", ["subject_id", "hour"])
    op.create_index("ix_usage_hourly_api_key_id", "usage_hourly", ["api_key_id", "hour"])
    buckets = ", ".join(
        f"count(*) FILTER (WHERE bucket = {index})" for index in range(len(_BOUNDS_MS) + 1)
    )
    # width_bucket counts values equal to a bound into the next bucket; the rollup puts them in
    # the bucket the bound closes, hence the search on -duration over the negated, reversed bounds.
    op.execute(  # only the constant bounds above are interpolated
        f"""
        INSERT INTO usage_hourly
        SELECT date_trunc('hour', occurred_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
               api_key_id, model, (array_agg(subject_id))[1], count(*),
               count(*) FILTER (WHERE status >= 400),
               coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0),
               coalesce(sum(cost_usd), 0), coalesce(sum(cost_diem), 0), sum(duration_ms),
               ARRAY[{buckets}]::bigint[]
        FROM (
            SELECT *, {len(_BOUNDS_MS)} - width_bucket(
                -duration_ms, ARRAY[{", ".join(f"-{b}" for b in reversed(_BOUNDS_MS))}]::float8[]
            ) AS bucket
            FROM usage_events
        ) e
        GROUP BY 1, api_key_id, model
        """  # noqa: S608
    )
    op.create_table(
        "console_sessions",
        sa.Column("token_hash", BYTEA(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("token_hash", name="pk_console_sessions"),
        sa.CheckConstraint("octet_length(token_hash) = 32", name="token_hash_length"),
        sa.CheckConstraint("expires_at > created_at", name="expires_after_creation"),
    )


def downgrade() -> None:
    op.drop_table("console_sessions")
    op.drop_index("ix_usage_hourly_api_key_id", table_name="usage_hourly")
    op.drop_index("ix_usage_hourly_subject_id", table_name="usage_hourly")
    op.drop_table("usage_hourly")
