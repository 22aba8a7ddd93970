"""A true ledger (issue 29, item 5): each usage row keeps the model its answer's last bytes came
from (``response_model``), a continued stream's starting deployment (``started_deployment``), and
every upstream attempt with its deployment and how it ended (``attempt_log``, a JSON array; see
``llmgw.accounting.attempts``). Older rows: NULL, NULL and an empty array.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage_events", sa.Column("response_model", sa.Text(), nullable=True))
    op.add_column("usage_events", sa.Column("started_deployment", sa.Text(), nullable=True))
    op.add_column(
        "usage_events",
        sa.Column("attempt_log", JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")),
    )


def downgrade() -> None:
    op.drop_column("usage_events", "attempt_log")
    op.drop_column("usage_events", "started_deployment")
    op.drop_column("usage_events", "response_model")
