"""Console sessions bound to the admin token they were signed in with.

Each session keeps a fingerprint of LLMGW_ADMIN_TOKEN (an HMAC keyed by the session's own token);
a session whose fingerprint is not the current token's is refused, so changing the admin token
signs every console out. Sessions from before this revision have none (NULL) and are refused:
their browsers sign in again. The column is nullable so that replicas of the previous release,
still serving while this runs, can go on signing consoles in (sessions the new release refuses).

Revision ID: 0008
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import BYTEA

from alembic import op

revision = "0008"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("console_sessions", sa.Column("admin_token_fingerprint", BYTEA(), nullable=True))
    op.create_check_constraint(
        "admin_token_fingerprint_length",
        "console_sessions",
        "octet_length(admin_token_fingerprint) = 32",
    )


def downgrade() -> None:
    op.drop_constraint("admin_token_fingerprint_length", "console_sessions", type_="check")
    op.drop_column("console_sessions", "admin_token_fingerprint")
