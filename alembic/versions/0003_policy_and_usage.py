"""Key policy (expiry, model allowlist, tokens per minute), subjects' budgets, usage ledger, audit.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_NOTIFY_COLUMNS_0002 = (
    "prefix, key_hash, is_active, revoked_at, subject_id, "
    "rate_limit_requests, rate_limit_window_seconds"
)
_NOTIFY_COLUMNS_0003 = _NOTIFY_COLUMNS_0002 + ", expires_at, allowed_models, tokens_per_minute"


def _notify_trigger(columns: str) -> None:
    op.execute("DROP TRIGGER api_keys_notify_change ON api_keys")
    op.execute(
        f"""
        CREATE TRIGGER api_keys_notify_change
        AFTER INSERT OR UPDATE OF {columns} OR DELETE ON api_keys
        FOR EACH ROW EXECUTE FUNCTION llmgw_notify_api_key_change()
        """
    )


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "api_keys",
        sa.Column(
            "allowed_models",
            ARRAY(sa.Text()),
            nullable=False,
            server_default=sa.text("'{}'::text[]"),
        ),
    )
    op.add_column("api_keys", sa.Column("tokens_per_minute", sa.Integer(), nullable=True))
    op.create_check_constraint(
        "tokens_per_minute_positive",
        "api_keys",
        "tokens_per_minute IS NULL OR tokens_per_minute > 0",
    )
    op.create_check_constraint(
        "allowed_models_not_blank",
        "api_keys",
        "array_position(allowed_models, '') IS NULL AND array_position(allowed_models, NULL) IS NULL",
    )
    _notify_trigger(_NOTIFY_COLUMNS_0003)

    op.create_table(
        "subjects",
        sa.Column("subject_id", UUID(as_uuid=True), nullable=False),
        sa.Column("monthly_budget_usd", sa.Numeric(18, 8), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.PrimaryKeyConstraint("subject_id", name="pk_subjects"),
        sa.CheckConstraint(
            "monthly_budget_usd IS NULL OR monthly_budget_usd >= 0",
            name="budget_non_negative",
        ),
    )
    op.create_table(
        "subject_monthly_spend",
        sa.Column("subject_id", UUID(as_uuid=True), nullable=False),
        sa.Column("month", sa.Date(), nullable=False),
        sa.Column("spend_usd", sa.Numeric(18, 8), nullable=False, server_default=sa.text("0")),
        sa.PrimaryKeyConstraint("subject_id", "month", name="pk_subject_monthly_spend"),
        sa.CheckConstraint("spend_usd >= 0", name="spend_non_negative"),
        sa.CheckConstraint("extract(day FROM month) = 1", name="month_is_first_day"),
    )
    op.create_table(
        "api_key_token_windows",
        sa.Column("api_key_id", UUID(as_uuid=True), nullable=False),
        sa.Column("window_start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.PrimaryKeyConstraint("api_key_id", "window_start_at", name="pk_api_key_token_windows"),
        sa.ForeignKeyConstraint(
            ["api_key_id"],
            ["api_keys.id"],
            name="fk_api_key_token_windows_api_key_id_api_keys",
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("tokens >= 0", name="tokens_non_negative"),
    )
    op.create_table(
        "usage_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column(
            "occurred_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("api_key_id", UUID(as_uuid=True), nullable=False),
        sa.Column("subject_id", UUID(as_uuid=True), nullable=True),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("response_id", sa.Text(), nullable=True),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("error_type", sa.Text(), nullable=True),
        sa.Column("input_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("cost_usd", sa.Numeric(18, 8), nullable=True),
        sa.Column("cost_diem", sa.Numeric(18, 8), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("time_to_first_chunk_ms", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_usage_events"),
        sa.CheckConstraint("status BETWEEN 100 AND 599", name="status_http"),
        sa.CheckConstraint("input_tokens IS NULL OR input_tokens >= 0", name="input_tokens"),
        sa.CheckConstraint("output_tokens IS NULL OR output_tokens >= 0", name="output_tokens"),
        sa.CheckConstraint("cost_usd IS NULL OR cost_usd >= 0", name="cost_usd"),
        sa.CheckConstraint("cost_diem IS NULL OR cost_diem >= 0", name="cost_diem"),
        sa.CheckConstraint("duration_ms >= 0", name="duration"),
        sa.CheckConstraint(
            "time_to_first_chunk_ms IS NULL OR time_to_first_chunk_ms >= 0",
            name="time_to_first_chunk",
        ),
        sa.CheckConstraint("operation IN ('chat', 'embeddings')", name="operation"),
    )
    op.create_index("ix_usage_events_occurred_at", "usage_events", ["occurred_at"])
    op.create_index("ix_usage_events_api_key_id", "usage_events", ["api_key_id", "occurred_at"])
    op.create_index("ix_usage_events_subject_id", "usage_events", ["subject_id", "occurred_at"])
    op.create_table(
        "admin_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column(
            "occurred_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=True),
        sa.Column("before", JSONB(), nullable=True),
        sa.Column("after", JSONB(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_admin_audit"),
        sa.CheckConstraint("actor <> ''", name="actor_not_empty"),
        sa.CheckConstraint("action <> ''", name="action_not_empty"),
    )


def downgrade() -> None:
    op.drop_table("admin_audit")
    op.drop_index("ix_usage_events_subject_id", table_name="usage_events")
    op.drop_index("ix_usage_events_api_key_id", table_name="usage_events")
    op.drop_index("ix_usage_events_occurred_at", table_name="usage_events")
    op.drop_table("usage_events")
    op.drop_table("api_key_token_windows")
    op.drop_table("subject_monthly_spend")
    op.drop_table("subjects")
    _notify_trigger(_NOTIFY_COLUMNS_0002)
    op.drop_constraint(op.f("ck_api_keys_allowed_models_not_blank"), "api_keys")
    op.drop_constraint(op.f("ck_api_keys_tokens_per_minute_positive"), "api_keys")
    op.drop_column("api_keys", "tokens_per_minute")
    op.drop_column("api_keys", "allowed_models")
    op.drop_column("api_keys", "expires_at")
