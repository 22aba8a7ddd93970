"""Limits: ``llmgw_limits_use`` moves part of a live lease's reservation to ``used`` and keeps the
lease with the rest, so that when the lease expires only the rest is given back. Capacity leases
report what a replica admitted from its request-window slice every tick: a replica SIGKILLed
holding a slice gives back its unused part when the lease expires (``LIMIT_SLICE_SECONDS``), not
when the window ends (issue 34). Counters are locked in byte order, as every limit statement does.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


_USE = """
CREATE FUNCTION llmgw_limits_use(p_leases uuid[], p_counters text[], p_actuals float8[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    charge record;
    moved numeric;  -- NULL: the lease is gone (settled or expired); its use is charged all the same
BEGIN
    FOR charge IN
        SELECT * FROM unnest(p_leases, p_counters, p_actuals) AS t(lease_id, counter, actual)
        ORDER BY counter COLLATE "C"
    LOOP
        PERFORM 1 FROM limit_counters WHERE counter = charge.counter FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        moved := NULL;
        SELECT least(amount, charge.actual::numeric) INTO moved FROM limit_leases
        WHERE lease_id = charge.lease_id AND counter = charge.counter FOR UPDATE;
        UPDATE limit_leases SET amount = amount - moved
        WHERE lease_id = charge.lease_id AND counter = charge.counter;
        UPDATE limit_counters
        SET reserved = greatest(0, reserved - coalesce(moved, 0)),
            used = used + charge.actual::numeric
        WHERE counter = charge.counter;
    END LOOP;
END
$$
"""


def upgrade() -> None:
    op.execute(_USE)


def downgrade() -> None:
    op.execute("DROP FUNCTION llmgw_limits_use(uuid[], text[], float8[])")
