"""Limits: ``llmgw_limits_settle`` locks its counters in byte order (``COLLATE "C"``), the order
every admission locks them in (the policy sorts counter names as Python strings; migration 0014's
``llmgw_limits_settle_then_admit`` says so explicitly). 0005 sorted by the database's default
collation, which agrees with byte order under ``C``/``C.UTF-8`` but not under a language collation
(``en_US.UTF-8`` orders ``tokens:`` and ``tokens-`` by letters first): there an idle replica's flush
and another replica's admission could lock two counters in opposite orders and deadlock.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


_SETTLE = """
CREATE OR REPLACE FUNCTION llmgw_limits_settle(
    p_leases uuid[], p_counters text[], p_actuals float8[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    charge record;
    given numeric;
BEGIN
    FOR charge IN
        SELECT * FROM unnest(p_leases, p_counters, p_actuals) AS t(lease_id, counter, actual)
        ORDER BY counter ORDER_COLLATION
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


def upgrade() -> None:
    op.execute(_SETTLE.replace("ORDER_COLLATION", 'COLLATE "C"'))


def downgrade() -> None:
    op.execute(_SETTLE.replace("ORDER_COLLATION", ""))
