"""Announce every change to api_keys on a NOTIFY channel, so replicas drop cached keys at once.

A trigger (not application code) sends it, so a key revoked with plain SQL is announced too.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION llmgw_notify_api_key_change() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                PERFORM pg_notify('llmgw_api_key_changes', OLD.prefix);
                RETURN OLD;
            END IF;
            PERFORM pg_notify('llmgw_api_key_changes', NEW.prefix);
            IF TG_OP = 'UPDATE' AND OLD.prefix <> NEW.prefix THEN
                PERFORM pg_notify('llmgw_api_key_changes', OLD.prefix);
            END IF;
            RETURN NEW;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER api_keys_notify_change
        AFTER INSERT OR UPDATE OF prefix, key_hash, is_active, revoked_at, subject_id,
            rate_limit_requests, rate_limit_window_seconds OR DELETE ON api_keys
        FOR EACH ROW EXECUTE FUNCTION llmgw_notify_api_key_change()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER api_keys_notify_change ON api_keys")
    op.execute("DROP FUNCTION llmgw_notify_api_key_change()")
