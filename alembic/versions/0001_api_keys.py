"""API keys and fixed rate-limit windows.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import BYTEA, UUID

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column(
            "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("subject_id", UUID(as_uuid=True), nullable=True),
        sa.Column("prefix", sa.String(12), nullable=False),
        sa.Column("key_hash", BYTEA(), nullable=False),
        sa.Column(
            "rate_limit_requests", sa.Integer(), nullable=False, server_default=sa.text("60")
        ),
        sa.Column(
            "rate_limit_window_seconds", sa.Integer(), nullable=False, server_default=sa.text("60")
        ),
        sa.Column("is_active", sa.Boolean(), nullable=False, server_default=sa.text("true")),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.UniqueConstraint("prefix", name="uq_api_keys_prefix"),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
        sa.CheckConstraint("char_length(prefix) = 12", name="prefix_length"),
        sa.CheckConstraint("octet_length(key_hash) = 32", name="key_hash_length"),
        sa.CheckConstraint("rate_limit_requests > 0", name="rate_limit_requests_positive"),
        sa.CheckConstraint("rate_limit_window_seconds > 0", name="rate_limit_window_positive"),
        sa.CheckConstraint(
            "revoked_at IS NULL OR NOT is_active", name="revoked_only_when_inactive"
        ),
    )
    op.create_table(
        "api_key_rate_limit_windows",
        sa.Column("api_key_id", UUID(as_uuid=True), nullable=False),
        sa.Column("window_start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_seconds", sa.Integer(), nullable=False),
        sa.Column("request_count", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.PrimaryKeyConstraint(
            "api_key_id", "window_start_at", "window_seconds", name="pk_api_key_rate_limit_windows"
        ),
        sa.ForeignKeyConstraint(
            ["api_key_id"],
            ["api_keys.id"],
            name="fk_api_key_rate_limit_windows_api_key_id_api_keys",
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("request_count >= 0", name="request_count_non_negative"),
        sa.CheckConstraint("window_seconds > 0", name="window_seconds_positive"),
    )


def downgrade() -> None:
    op.drop_table("api_key_rate_limit_windows")
    op.drop_table("api_keys")
