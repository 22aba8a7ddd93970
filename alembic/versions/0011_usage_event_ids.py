"""Usage ledger: an event id per row, unique, so a record written twice (the spool of a killed
process replayed at the next start) is stored once. Rows from before have none.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import UUID

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage_events", sa.Column("event_id", UUID(as_uuid=True), nullable=True))
    op.create_unique_constraint("uq_usage_events_event_id", "usage_events", ["event_id"])


def downgrade() -> None:
    op.drop_constraint("uq_usage_events_event_id", "usage_events", type_="unique")
    op.drop_column("usage_events", "event_id")
