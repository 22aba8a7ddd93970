"""Usage ledger: each token kind priced apart gets its count (cache reads, cache writes, the 1-hour
part of the writes, reasoning), so a row's cost can be checked against its counts. Rows from
before have none.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_COUNTS = (
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "cache_creation_1h_input_tokens",
    "reasoning_output_tokens",
)


def upgrade() -> None:
    for name in _COUNTS:
        op.add_column("usage_events", sa.Column(name, sa.Integer(), nullable=True))
        op.create_check_constraint(name, "usage_events", f"{name} IS NULL OR {name} >= 0")


def downgrade() -> None:
    for name in reversed(_COUNTS):
        op.drop_constraint(op.f(f"ck_usage_events_{name}"), "usage_events")
        op.drop_column("usage_events", name)
