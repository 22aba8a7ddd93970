"""SQLAlchemy Core metadata for every table; Alembic migrations must match it (a test checks)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import BYTEA, UUID

__all__ = ["API_KEY_CHANGES_CHANNEL", "api_key_rate_limit_windows", "api_keys", "metadata"]

# Postgres NOTIFY channel on which every change to api_keys is announced (auth cache invalidation).
API_KEY_CHANGES_CHANNEL = "llmgw_api_key_changes"

metadata = sa.MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "ix": "ix_%(table_name)s_%(column_0_name)s",
    }
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column(
        "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
    ),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("subject_id", UUID(as_uuid=True), nullable=True),
    sa.Column("prefix", sa.String(12), nullable=False),
    sa.Column("key_hash", BYTEA(), nullable=False),
    sa.Column("rate_limit_requests", sa.Integer(), nullable=False, server_default=sa.text("60")),
    sa.Column(
        "rate_limit_window_seconds", sa.Integer(), nullable=False, server_default=sa.text("60")
    ),
    sa.Column("is_active", sa.Boolean(), nullable=False, server_default=sa.text("true")),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
    ),
    sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    sa.UniqueConstraint("prefix"),
    sa.UniqueConstraint("key_hash"),
    sa.CheckConstraint("char_length(prefix) = 12", name="prefix_length"),
    sa.CheckConstraint("octet_length(key_hash) = 32", name="key_hash_length"),
    sa.CheckConstraint("rate_limit_requests > 0", name="rate_limit_requests_positive"),
    sa.CheckConstraint("rate_limit_window_seconds > 0", name="rate_limit_window_positive"),
    sa.CheckConstraint("revoked_at IS NULL OR NOT is_active", name="revoked_only_when_inactive"),
)

api_key_rate_limit_windows = sa.Table(
    "api_key_rate_limit_windows",
    metadata,
    sa.Column(
        "api_key_id",
        UUID(as_uuid=True),
        sa.ForeignKey("api_keys.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("window_start_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("window_seconds", sa.Integer(), nullable=False),
    sa.Column("request_count", sa.Integer(), nullable=False, server_default=sa.text("0")),
    sa.PrimaryKeyConstraint("api_key_id", "window_start_at", "window_seconds"),
    sa.CheckConstraint("request_count >= 0", name="request_count_non_negative"),
    sa.CheckConstraint("window_seconds > 0", name="window_seconds_positive"),
)
