"""Limits: counters with leased reservations, the per-key concurrency cap, and the admission
and settlement functions (one statement each on the hot path).

Revision ID: 0005
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import UUID

from alembic import op

revision = "0005"
down_revision = "0006"
branch_labels = None
depends_on = None

_NOTIFY_COLUMNS_0003 = (
    "prefix, key_hash, is_active, revoked_at, subject_id, rate_limit_requests, "
    "rate_limit_window_seconds, expires_at, allowed_models, tokens_per_minute"
)
_NOTIFY_COLUMNS_0005 = _NOTIFY_COLUMNS_0003 + ", max_concurrent_requests"


def _notify_trigger(columns: str) -> None:
    op.execute("DROP TRIGGER api_keys_notify_change ON api_keys")
    op.execute(
        f"""
        CREATE TRIGGER api_keys_notify_change
        AFTER INSERT OR UPDATE OF {columns} OR DELETE ON api_keys
        FOR EACH ROW EXECUTE FUNCTION llmgw_notify_api_key_change()
        """
    )


# A window hit plus every reservation, all or nothing, in one call. Counters are locked in the
# order given (the policy sorts them by name, and settlement locks in the same order), so
# concurrent admissions and settlements never deadlock. A counter's expired leases are given back
# while it is locked, so a killed replica's reservations stop counting when they expire.
_ADMIT = """
CREATE FUNCTION llmgw_limits_admit(
    p_key uuid, p_window_seconds integer, p_window_limit integer,
    p_lease uuid, p_lease_seconds float8,
    p_counters text[], p_caps float8[], p_amounts float8[], p_keep_seconds float8[],
    OUT window_count integer, OUT window_reset float8, OUT refused integer)
LANGUAGE plpgsql AS $$
DECLARE
    now_at timestamptz := clock_timestamp();
    now_epoch float8 := extract(epoch FROM now_at);
    start_at timestamptz;
    taken numeric;
    freed numeric;
    n integer := coalesce(array_length(p_counters, 1), 0);
BEGIN
    refused := 0;
    IF p_window_seconds IS NOT NULL THEN
        start_at := to_timestamp(floor(now_epoch / p_window_seconds) * p_window_seconds);
        window_reset := floor(now_epoch / p_window_seconds) * p_window_seconds
            + p_window_seconds - now_epoch;
        INSERT INTO api_key_rate_limit_windows AS w
            (api_key_id, window_start_at, window_seconds, request_count)
        VALUES (p_key, start_at, p_window_seconds, 1)
        ON CONFLICT (api_key_id, window_start_at, window_seconds)
        DO UPDATE SET request_count = w.request_count + 1 WHERE w.request_count < p_window_limit
        RETURNING w.request_count INTO window_count;
        IF window_count IS NULL THEN
            RETURN;  -- the window is full
        END IF;
    END IF;
    FOR i IN 1 .. n LOOP
        INSERT INTO limit_counters AS c (counter, keep_until)
        VALUES (p_counters[i], now_at + make_interval(secs => p_keep_seconds[i]))
        ON CONFLICT (counter) DO UPDATE SET keep_until = greatest(c.keep_until, excluded.keep_until)
        RETURNING c.used + c.reserved INTO taken;
        WITH gone AS (
            DELETE FROM limit_leases WHERE counter = p_counters[i] AND expires_at < now_at
            RETURNING amount
        )
        SELECT coalesce(sum(amount), 0) INTO freed FROM gone;
        IF freed > 0 THEN
            UPDATE limit_counters SET reserved = greatest(0, reserved - freed)
            WHERE counter = p_counters[i];
            taken := taken - freed;
        END IF;
        IF taken + p_amounts[i]::numeric > p_caps[i]::numeric THEN
            refused := i;
            IF p_window_seconds IS NOT NULL THEN
                UPDATE api_key_rate_limit_windows SET request_count = request_count - 1
                WHERE api_key_id = p_key AND window_start_at = start_at
                  AND window_seconds = p_window_seconds;
                window_count := window_count - 1;
            END IF;
            RETURN;
        END IF;
    END LOOP;
    FOR i IN 1 .. n LOOP
        UPDATE limit_counters SET reserved = reserved + p_amounts[i]::numeric
        WHERE counter = p_counters[i];
        INSERT INTO limit_leases (lease_id, counter, amount, expires_at)
        VALUES (p_lease, p_counters[i], p_amounts[i]::numeric,
                now_at + make_interval(secs => p_lease_seconds));
    END LOOP;
END
$$
"""

# Settle many leases: each counter is locked first (the admission's order), its lease removed and
# the reservation given back, and the actual amount charged (even if the lease had expired).
_SETTLE = """
CREATE FUNCTION llmgw_limits_settle(p_leases uuid[], p_counters text[], p_actuals float8[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    charge record;
    given numeric;
BEGIN
    FOR charge IN
        SELECT * FROM unnest(p_leases, p_counters, p_actuals) AS t(lease_id, counter, actual)
        ORDER BY counter
    LOOP
        PERFORM 1 FROM limit_counters WHERE counter = charge.counter FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        given := NULL;
        DELETE FROM limit_leases WHERE lease_id = charge.lease_id AND counter = charge.counter
        RETURNING amount INTO given;
        UPDATE limit_counters
        SET reserved = greatest(0, reserved - coalesce(given, 0)),
            used = used + charge.actual::numeric
        WHERE counter = charge.counter;
    END LOOP;
END
$$
"""

# Keys' cached rows carry their subject's budget, so a budget change must reach every replica's
# cache as promptly as a key change: announce the prefix of each of the subject's keys.
_SUBJECT_NOTIFY = """
CREATE FUNCTION llmgw_notify_subject_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    changed uuid := CASE WHEN TG_OP = 'DELETE' THEN OLD.subject_id ELSE NEW.subject_id END;
BEGIN
    PERFORM pg_notify('llmgw_api_key_changes', prefix) FROM api_keys WHERE subject_id = changed;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    # True when cost_usd is the price table's (the provider reported none, or usage was estimated).
    op.add_column(
        "usage_events",
        sa.Column("cost_computed", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.add_column("api_keys", sa.Column("max_concurrent_requests", sa.Integer(), nullable=True))
    op.create_check_constraint(
        "max_concurrent_requests_positive",
        "api_keys",
        "max_concurrent_requests IS NULL OR max_concurrent_requests > 0",
    )
    _notify_trigger(_NOTIFY_COLUMNS_0005)
    op.create_table(
        "limit_counters",
        sa.Column("counter", sa.Text(), nullable=False),
        sa.Column("used", sa.Numeric(30, 12), nullable=False, server_default=sa.text("0")),
        sa.Column("reserved", sa.Numeric(30, 12), nullable=False, server_default=sa.text("0")),
        sa.Column("keep_until", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("used >= 0", name="used_non_negative"),
        sa.CheckConstraint("reserved >= 0", name="reserved_non_negative"),
        sa.PrimaryKeyConstraint("counter", name="pk_limit_counters"),
        sa.CheckConstraint("counter <> ''", name="counter_not_empty"),
    )
    op.create_table(
        "limit_leases",
        sa.Column("lease_id", UUID(as_uuid=True), nullable=False),
        sa.Column(
            "counter",
            sa.Text(),
            sa.ForeignKey(
                "limit_counters.counter",
                ondelete="CASCADE",
                name="fk_limit_leases_counter_limit_counters",
            ),
            nullable=False,
        ),
        sa.Column("amount", sa.Numeric(30, 12), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("lease_id", "counter", name="pk_limit_leases"),
        sa.CheckConstraint("amount >= 0", name="amount_non_negative"),
    )
    op.create_index("ix_limit_leases_counter", "limit_leases", ["counter", "expires_at"])
    # This month's spend so far, so budgets keep counting across the upgrade.
    op.execute(
        """
        INSERT INTO limit_counters (counter, used, keep_until)
        SELECT 'budget:' || subject_id || ':' || to_char(month, 'YYYY-MM'), spend_usd,
               month + interval '1 month' + interval '1 day'
        FROM subject_monthly_spend
        WHERE month = date_trunc('month', now() AT TIME ZONE 'UTC')::date
        """
    )
    op.execute(_ADMIT)
    op.execute(_SETTLE)
    op.execute(_SUBJECT_NOTIFY)
    op.execute(
        """
        CREATE TRIGGER subjects_notify_change AFTER INSERT OR UPDATE OR DELETE ON subjects
        FOR EACH ROW EXECUTE FUNCTION llmgw_notify_subject_change()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER subjects_notify_change ON subjects")
    op.execute("DROP FUNCTION llmgw_notify_subject_change()")
    op.execute("DROP FUNCTION llmgw_limits_settle(uuid[], text[], float8[])")
    op.execute(
        "DROP FUNCTION llmgw_limits_admit(uuid, integer, integer, uuid, float8, text[], "
        "float8[], float8[], float8[])"
    )
    op.drop_table("limit_leases")
    op.drop_table("limit_counters")
    _notify_trigger(_NOTIFY_COLUMNS_0003)
    op.drop_constraint("max_concurrent_requests_positive", "api_keys", type_="check")
    op.drop_column("api_keys", "max_concurrent_requests")
    op.drop_column("usage_events", "cost_computed")
