"""A team's spend this month is the sum over the keys it has now (docs/teams.md, "Budget"), so a
key that joins a team mid-month brings its spend this month with it, and one that leaves takes its
spend away. The limit store's team budget counter holds what keys spent while in the team; the
difference a move makes is kept on the team (``carried_spend_usd``, for ``carried_month``) and
taken off the budget the counter is admitted against.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "teams",
        sa.Column(
            "carried_spend_usd",
            sa.Numeric(30, 18),
            nullable=False,
            server_default=sa.text("0"),
        ),
    )
    op.add_column("teams", sa.Column("carried_month", sa.Date(), nullable=True))


def downgrade() -> None:
    op.drop_column("teams", "carried_month")
    op.drop_column("teams", "carried_spend_usd")
