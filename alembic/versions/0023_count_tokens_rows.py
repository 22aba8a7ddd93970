"""A Messages request's token count (``POST /v1/messages/count_tokens``) reaches a provider, so it
has its ledger row like every such request (issue 34, item 3): operation ``count_tokens``, billed
nothing.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

_OPERATIONS_BEFORE = (
    "operation IN ('chat', 'embeddings', 'image_generation', 'text_to_speech', 'speech_to_text')"
)
_OPERATIONS = (
    "operation IN ('chat', 'embeddings', 'image_generation', 'text_to_speech', 'speech_to_text', "
    "'count_tokens')"
)


def upgrade() -> None:
    op.drop_constraint(op.f("ck_usage_events_operation"), "usage_events", type_="check")
    op.create_check_constraint("operation", "usage_events", _OPERATIONS)


def downgrade() -> None:
    op.execute("DELETE FROM usage_events WHERE operation = 'count_tokens'")
    op.drop_constraint(op.f("ck_usage_events_operation"), "usage_events", type_="check")
    op.create_check_constraint("operation", "usage_events", _OPERATIONS_BEFORE)
