"""Deployment health kept in Postgres: the breakers that are open, so that a replica that starts
skips a deployment found down before it started (llmgw.routing.postgres).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0012"
down_revision = "0011"
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


def downgrade() -> None:
    op.drop_table("deployment_health")
