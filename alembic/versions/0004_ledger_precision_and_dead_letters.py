"""Usage ledger: costs to 18 decimal places, usage source and flags per row, dead letters.

Changing the scale of cost_usd, cost_diem and spend_usd rewrites usage_events and
subject_monthly_spend (an exclusive lock for the rewrite's duration): prune the ledger first or run
the upgrade when traffic is low.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_COSTS = (("usage_events", "cost_usd"), ("usage_events", "cost_diem"))
_SPEND = ("subject_monthly_spend", "spend_usd")


def _retype(precision: int, scale: int) -> None:
    for table, column in (*_COSTS, _SPEND):
        op.alter_column(
            table,
            column,
            type_=sa.Numeric(precision, scale),
            postgresql_using=f"round({column}, {scale})",
        )


def upgrade() -> None:
    _retype(30, 18)
    # A status the provider made up (999) is dropped from the row, which is flagged instead.
    op.alter_column("usage_events", "status", nullable=True)
    op.add_column(
        "usage_events",
        sa.Column("usage_source", sa.Text(), nullable=False, server_default=sa.text("'reported'")),
    )
    op.create_check_constraint(
        "usage_source", "usage_events", "usage_source IN ('reported', 'estimated')"
    )
    op.add_column(
        "usage_events",
        sa.Column(
            "flags", ARRAY(sa.Text()), nullable=False, server_default=sa.text("'{}'::text[]")
        ),
    )
    op.create_check_constraint(
        "flags_not_blank",
        "usage_events",
        "array_position(flags, '') IS NULL AND array_position(flags, NULL) IS NULL",
    )
    op.create_table(
        "usage_dead_letters",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column(
            "set_aside_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("request_id", sa.Text(), nullable=True),
        sa.Column("record", sa.Text(), nullable=False),
        sa.Column("error_type", sa.Text(), nullable=False),
        sa.Column("error_message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_usage_dead_letters"),
        sa.CheckConstraint("error_type <> ''", name="error_type_not_empty"),
        sa.CheckConstraint("record <> ''", name="record_not_empty"),
    )


def downgrade() -> None:
    op.drop_table("usage_dead_letters")
    op.drop_constraint(op.f("ck_usage_events_flags_not_blank"), "usage_events")
    op.drop_column("usage_events", "flags")
    op.drop_constraint(op.f("ck_usage_events_usage_source"), "usage_events")
    op.drop_column("usage_events", "usage_source")
    # 0003 needs a status on every row: 502, as the gateway would have answered a made-up one.
    op.execute("UPDATE usage_events SET status = 502 WHERE status IS NULL")
    op.alter_column("usage_events", "status", nullable=False)
    _retype(18, 8)
