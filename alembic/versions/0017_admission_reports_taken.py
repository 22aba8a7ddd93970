"""Limits: ``llmgw_limits_settle_then_admit`` also returns ``taken``, each admitted counter's
``used + reserved`` once the request is in (by the index of ``p_counters``; empty when refused).
With capacity leases on by default (issue 29) a quiet key is admitted by the store, one request at
a time, and its request window is a counter too (``window:<key>:<seconds>:<start>``, the one busy
keys take slices of): ``taken`` is what its exact ``x-ratelimit-remaining-requests`` is made of.
The function is 0014's otherwise (an output column more: callers that select columns by name keep
working during a rolling upgrade).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_ARGUMENTS = (
    "uuid[], text[], float8[], uuid, integer, integer, uuid, float8, text[], float8[], float8[], "
    "float8[]"
)

_SETTLE_THEN_ADMIT = """
CREATE FUNCTION llmgw_limits_settle_then_admit(
    p_settled uuid[], p_settled_counters text[], p_actuals float8[],
    p_key uuid, p_window_seconds integer, p_window_limit integer,
    p_lease uuid, p_lease_seconds float8,
    p_counters text[], p_caps float8[], p_amounts float8[], p_keep_seconds float8[],
    OUT window_count integer, OUT window_reset float8, OUT refused integer, OUT taken float8[])
LANGUAGE plpgsql AS $$
DECLARE
    now_at timestamptz := clock_timestamp();
    now_epoch float8 := extract(epoch FROM now_at);
    start_at timestamptz;
    admitting boolean := true;
    counter_name text;
    i integer;
    counter_total numeric;
    freed numeric;
    given numeric;
    charged numeric;
BEGIN
    refused := 0;
    taken := '{}';
    PERFORM pg_advisory_xact_lock(hashtextextended(p_lease::text, 0));
    IF EXISTS (SELECT 1 FROM limit_cancelled_leases
               WHERE lease_id = p_lease AND expires_at >= clock_timestamp()) THEN
        refused := -1;
        admitting := false;
    ELSIF p_window_seconds IS NOT NULL THEN
        start_at := to_timestamp(floor(now_epoch / p_window_seconds) * p_window_seconds);
        window_reset := floor(now_epoch / p_window_seconds) * p_window_seconds
            + p_window_seconds - now_epoch;
        INSERT INTO api_key_rate_limit_windows AS w
            (api_key_id, window_start_at, window_seconds, request_count)
        VALUES (p_key, start_at, p_window_seconds, 1)
        ON CONFLICT (api_key_id, window_start_at, window_seconds)
        DO UPDATE SET request_count = w.request_count + 1 WHERE w.request_count < p_window_limit
        RETURNING w.request_count INTO window_count;
        admitting := window_count IS NOT NULL;  -- NULL: the window is full
    END IF;
    FOR counter_name IN
        SELECT name FROM (SELECT DISTINCT unnest(p_counters || p_settled_counters) AS name) AS n
        ORDER BY name COLLATE "C"
    LOOP
        i := array_position(p_counters, counter_name);
        IF i IS NOT NULL AND admitting THEN
            INSERT INTO limit_counters AS c (counter, keep_until)
            VALUES (counter_name, now_at + make_interval(secs => p_keep_seconds[i]))
            ON CONFLICT (counter) DO UPDATE
            SET keep_until = greatest(c.keep_until, excluded.keep_until);
        ELSE
            PERFORM 1 FROM limit_counters WHERE counter = counter_name FOR UPDATE;
            CONTINUE WHEN NOT FOUND;  -- nothing to settle on a counter that is gone
        END IF;
        IF counter_name = ANY(p_settled_counters) THEN
            WITH gone AS (
                DELETE FROM limit_leases AS l
                USING unnest(p_settled, p_settled_counters) AS s(lease_id, counter)
                WHERE s.counter = counter_name AND l.counter = counter_name
                  AND l.lease_id = s.lease_id
                RETURNING l.amount
            )
            SELECT coalesce(sum(amount), 0) INTO given FROM gone;
            SELECT coalesce(sum(actual), 0) INTO charged
            FROM unnest(p_settled_counters, p_actuals) AS s(counter, actual)
            WHERE s.counter = counter_name;
            UPDATE limit_counters
            SET reserved = greatest(0, reserved - given), used = used + charged
            WHERE counter = counter_name;
        END IF;
        CONTINUE WHEN i IS NULL OR NOT admitting;
        WITH gone AS (
            DELETE FROM limit_leases WHERE counter = counter_name AND expires_at < now_at
            RETURNING amount
        )
        SELECT coalesce(sum(amount), 0) INTO freed FROM gone;
        IF freed > 0 THEN
            UPDATE limit_counters SET reserved = greatest(0, reserved - freed)
            WHERE counter = counter_name;
        END IF;
        SELECT used + reserved INTO counter_total FROM limit_counters WHERE counter = counter_name;
        taken[i] := (counter_total + p_amounts[i]::numeric)::float8;
        IF counter_total + p_amounts[i]::numeric > p_caps[i]::numeric THEN
            -- Refused: the counters after it are still locked and settled, not checked.
            refused := i;
            admitting := false;
        END IF;
    END LOOP;
    IF refused > 0 AND p_window_seconds IS NOT NULL THEN
        UPDATE api_key_rate_limit_windows SET request_count = request_count - 1
        WHERE api_key_id = p_key AND window_start_at = start_at
          AND window_seconds = p_window_seconds;
        window_count := window_count - 1;
    END IF;
    IF NOT admitting THEN
        taken := '{}';
        RETURN;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_counters, 1), 0) LOOP
        UPDATE limit_counters SET reserved = reserved + p_amounts[i]::numeric
        WHERE counter = p_counters[i];
        INSERT INTO limit_leases (lease_id, counter, amount, expires_at)
        VALUES (p_lease, p_counters[i], p_amounts[i]::numeric,
                now_at + make_interval(secs => p_lease_seconds));
    END LOOP;
END
$$
"""


def upgrade() -> None:
    op.execute(f"DROP FUNCTION llmgw_limits_settle_then_admit({_ARGUMENTS})")
    op.execute(_SETTLE_THEN_ADMIT)


def downgrade() -> None:
    # 0014's function: this one less the lines that make ``taken``.
    without_taken = "\n".join(
        line for line in _SETTLE_THEN_ADMIT.splitlines() if not line.strip().startswith("taken")
    ).replace(", OUT taken float8[])", ")")
    op.execute(f"DROP FUNCTION llmgw_limits_settle_then_admit({_ARGUMENTS})")
    op.execute(without_taken)
