"""Deployment health kept in Postgres: the breakers that are open, so that a replica that starts
skips a deployment found down before it started (llmgw.routing.postgres). The usage ledger names
the deployment that finished each answer, and counts the attempts whose tokens a row bills.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployment_health",
        sa.Column("deployment", sa.Text(), nullable=False),
        sa.Column("open_until", sa.Float(), nullable=True),
        sa.Column("openings", sa.Integer(), nullable=False),
        sa.Column("last_failure_at", sa.Float(), nullable=False),
        sa.Column("changed_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("deployment", name="pk_deployment_health"),
    )
    op.add_column("usage_events", sa.Column("deployment", sa.Text(), nullable=True))
    op.add_column(
        "usage_events",
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("1")),
    )
    op.create_check_constraint("attempts", "usage_events", "attempts >= 1")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_usage_events_attempts"), "usage_events")
    op.drop_column("usage_events", "attempts")
    op.drop_column("usage_events", "deployment")
    op.drop_table("deployment_health")
