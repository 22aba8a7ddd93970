"""Usage rows say when the response cache answered: ``cache_hit`` (no provider was paid, so
``cost_usd`` is 0) and ``saved_cost_usd``, what the stored answer cost when it was fetched; the hourly rollup counts
both, for the usage report and the console's overview.

Revision ID: 0019
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0019"
# 0016-0018 are being written on other branches; whichever lands last chains after the others.
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "usage_events",
        sa.Column("cache_hit", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.add_column("usage_events", sa.Column("saved_cost_usd", sa.Numeric(30, 18), nullable=True))
    op.add_column(
        "usage_hourly",
        sa.Column("cache_hits", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    )
    op.add_column(
        "usage_hourly",
        sa.Column(
            "saved_cost_usd", sa.Numeric(38, 18), nullable=False, server_default=sa.text("0")
        ),
    )


def downgrade() -> None:
    op.drop_column("usage_hourly", "saved_cost_usd")
    op.drop_column("usage_hourly", "cache_hits")
    op.drop_column("usage_events", "saved_cost_usd")
    op.drop_column("usage_events", "cache_hit")
