"""Limits: cancelled admissions. An admission whose caller gave up waiting (a stalled database,
a timeout) is cancelled by its lease id: what it reserved is given back, and if the statement
still runs later it is refused, so a stall never leaves a lease behind.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import UUID

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# An admission and a cancellation of the same lease take the same transaction-scoped advisory
# lock first, so one sees the other's commit whichever reaches the database first: a cancel
# that arrives first is seen by the admission (refused = -1, nothing counted), one that arrives
# second finds the lease and gives it back. The admission itself is 0005's function, unchanged.
_ADMIT_UNLESS_CANCELLED = """
CREATE FUNCTION llmgw_limits_admit_unless_cancelled(
    p_key uuid, p_window_seconds integer, p_window_limit integer,
    p_lease uuid, p_lease_seconds float8,
    p_counters text[], p_caps float8[], p_amounts float8[], p_keep_seconds float8[],
    OUT window_count integer, OUT window_reset float8, OUT refused integer)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_lease::text, 0));
    IF EXISTS (SELECT 1 FROM limit_cancelled_leases
               WHERE lease_id = p_lease AND expires_at >= clock_timestamp()) THEN
        refused := -1;
        RETURN;
    END IF;
    SELECT a.window_count, a.window_reset, a.refused INTO window_count, window_reset, refused
    FROM llmgw_limits_admit(p_key, p_window_seconds, p_window_limit, p_lease, p_lease_seconds,
                            p_counters, p_caps, p_amounts, p_keep_seconds) AS a;
END
$$
"""

# Advisory locks in one order (their keys'), then the landed leases settled at nothing through
# llmgw_limits_settle, which locks counters in the admissions' order: no deadlock either way.
_CANCEL = """
CREATE FUNCTION llmgw_limits_cancel(p_leases uuid[], p_seconds float8)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    ids uuid[];
    names text[];
BEGIN
    PERFORM pg_advisory_xact_lock(k)
    FROM (SELECT DISTINCT hashtextextended(l::text, 0) AS k FROM unnest(p_leases) AS l) AS keys
    ORDER BY k;
    INSERT INTO limit_cancelled_leases AS c (lease_id, expires_at)
    SELECT DISTINCT l, clock_timestamp() + make_interval(secs => p_seconds)
    FROM unnest(p_leases) AS l
    ON CONFLICT (lease_id) DO UPDATE SET expires_at = greatest(c.expires_at, excluded.expires_at);
    SELECT array_agg(lease_id), array_agg(counter) INTO ids, names
    FROM limit_leases WHERE lease_id = ANY(p_leases);
    IF ids IS NOT NULL THEN
        PERFORM llmgw_limits_settle(ids, names, array_fill(0::float8, ARRAY[cardinality(ids)]));
    END IF;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "limit_cancelled_leases",
        sa.Column("lease_id", UUID(as_uuid=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("lease_id", name="pk_limit_cancelled_leases"),
    )
    op.execute(_ADMIT_UNLESS_CANCELLED)
    op.execute(_CANCEL)


def downgrade() -> None:
    op.execute("DROP FUNCTION llmgw_limits_cancel(uuid[], float8)")
    op.execute(
        "DROP FUNCTION llmgw_limits_admit_unless_cancelled(uuid, integer, integer, uuid, float8, "
        "text[], float8[], float8[], float8[])"
    )
    op.drop_table("limit_cancelled_leases")
