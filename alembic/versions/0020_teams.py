"""Teams, single sign-on and roles. Teams: a level of the limit hierarchy above keys (budget, request window, tokens per minute,
concurrency, allowed models), and the identity-provider groups that make people its members or
admins. Keys name their team and the person who made them (``owner``). Console sessions keep the
identity (person and role) of a single sign-on; ``console_oidc_logins`` holds sign-ins under way.

A change to a team is announced on the key channel for each of its keys, as a subject's is, so every
replica drops the cached keys (and the team limits read with them) at once.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, JSONB, UUID

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_NOTIFY_COLUMNS_0005 = (
    "prefix, key_hash, is_active, revoked_at, subject_id, rate_limit_requests, "
    "rate_limit_window_seconds, expires_at, allowed_models, tokens_per_minute, "
    "max_concurrent_requests"
)
_NOTIFY_COLUMNS_0020 = _NOTIFY_COLUMNS_0005 + ", team_id"

_TEAM_NOTIFY = """
CREATE FUNCTION llmgw_notify_team_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    changed uuid := CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END;
BEGIN
    PERFORM pg_notify('llmgw_api_key_changes', prefix) FROM api_keys WHERE team_id = changed;
    RETURN NULL;
END
$$
"""


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
    op.create_table(
        "teams",
        sa.Column(
            "id", UUID(as_uuid=True), server_default=sa.text("gen_random_uuid()"), nullable=False
        ),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("monthly_budget_usd", sa.Numeric(18, 8), nullable=True),
        sa.Column("rate_limit_requests", sa.Integer(), nullable=True),
        sa.Column("rate_limit_window_seconds", sa.Integer(), nullable=True),
        sa.Column("tokens_per_minute", sa.Integer(), nullable=True),
        sa.Column("max_concurrent_requests", sa.Integer(), nullable=True),
        sa.Column(
            "allowed_models",
            ARRAY(sa.Text()),
            server_default=sa.text("'{}'::text[]"),
            nullable=False,
        ),
        sa.Column("oidc_group", sa.Text(), nullable=True),
        sa.Column("oidc_admin_group", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name="pk_teams"),
        sa.UniqueConstraint("name"),
        sa.CheckConstraint("name <> ''", name="name_not_empty"),
        sa.CheckConstraint(
            "monthly_budget_usd IS NULL OR monthly_budget_usd >= 0",
            name="budget_non_negative",
        ),
        sa.CheckConstraint(
            "(rate_limit_requests IS NULL) = (rate_limit_window_seconds IS NULL)",
            name="window_whole",
        ),
        sa.CheckConstraint(
            "array_position(allowed_models, '') IS NULL "
            "AND array_position(allowed_models, NULL) IS NULL",
            name="allowed_models_not_blank",
        ),
    )
    op.add_column("api_keys", sa.Column("team_id", UUID(as_uuid=True), nullable=True))
    op.create_foreign_key(
        "fk_api_keys_team_id_teams", "api_keys", "teams", ["team_id"], ["id"], ondelete="RESTRICT"
    )
    op.create_index("ix_api_keys_team_id", "api_keys", ["team_id"])
    op.add_column("api_keys", sa.Column("owner", sa.Text(), nullable=True))
    _notify_trigger(_NOTIFY_COLUMNS_0020)
    op.add_column("console_sessions", sa.Column("identity", JSONB(), nullable=True))
    op.create_table(
        "console_oidc_logins",
        sa.Column("state_hash", BYTEA(), nullable=False),
        sa.Column("nonce", sa.Text(), nullable=False),
        sa.Column("code_verifier", sa.Text(), nullable=False),
        sa.Column("redirect_uri", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("state_hash", name="pk_console_oidc_logins"),
    )
    op.execute(_TEAM_NOTIFY)
    op.execute(
        """
        CREATE TRIGGER teams_notify_change AFTER UPDATE OR DELETE ON teams
        FOR EACH ROW EXECUTE FUNCTION llmgw_notify_team_change()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER teams_notify_change ON teams")
    op.execute("DROP FUNCTION llmgw_notify_team_change()")
    op.drop_table("console_oidc_logins")
    op.drop_column("console_sessions", "identity")
    _notify_trigger(_NOTIFY_COLUMNS_0005)
    op.drop_column("api_keys", "owner")
    op.drop_index("ix_api_keys_team_id", table_name="api_keys")
    op.drop_constraint("fk_api_keys_team_id_teams", "api_keys", type_="foreignkey")
    op.drop_column("api_keys", "team_id")
    op.drop_table("teams")
