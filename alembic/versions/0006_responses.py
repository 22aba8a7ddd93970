"""Stored responses of the Responses API (store / previous_response_id), and the media operations
(image generation, text to speech, speech to text) in the usage ledger.

Revision ID: 0006
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, UUID

from alembic import op

revision = "0006"
down_revision = "0007"
branch_labels = None
depends_on = None

_OPERATIONS_BEFORE = "operation IN ('chat', 'embeddings')"
_OPERATIONS = (
    "operation IN ('chat', 'embeddings', 'image_generation', 'text_to_speech', 'speech_to_text')"
)


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("api_key_id", UUID(as_uuid=True), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("input_items", JSONB(), nullable=False),
        sa.Column("response", JSONB(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_responses"),
        sa.ForeignKeyConstraint(
            ["api_key_id"],
            ["api_keys.id"],
            name="fk_responses_api_key_id_api_keys",
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("expires_at > created_at", name="expires_after_creation"),
    )
    op.create_index("ix_responses_expires_at", "responses", ["expires_at"])
    op.drop_constraint(op.f("ck_usage_events_operation"), "usage_events", type_="check")
    op.create_check_constraint("operation", "usage_events", _OPERATIONS)


def downgrade() -> None:
    op.execute("DELETE FROM usage_events WHERE operation NOT IN ('chat', 'embeddings')")
    op.drop_constraint(op.f("ck_usage_events_operation"), "usage_events", type_="check")
    op.create_check_constraint("operation", "usage_events", _OPERATIONS_BEFORE)
    op.drop_index("ix_responses_expires_at", table_name="responses")
    op.drop_table("responses")
