"""Console: which key replaced a rotated one, and requests the gateway refused, per minute.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import UUID

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "api_keys",
        sa.Column(
            "replaced_by",
            UUID(as_uuid=True),
            sa.ForeignKey(
                "api_keys.id", name="fk_api_keys_replaced_by_api_keys", ondelete="SET NULL"
            ),
            nullable=True,
        ),
    )
    op.create_table(
        "refusals_by_minute",
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("route", sa.Text(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("code", sa.Text(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("minute", "route", "status", "code", name="pk_refusals_by_minute"),
        sa.CheckConstraint("status BETWEEN 400 AND 499", name="status_refusal"),
        sa.CheckConstraint("requests > 0", name="requests_positive"),
    )


def downgrade() -> None:
    op.drop_table("refusals_by_minute")
    op.drop_column("api_keys", "replaced_by")
