"""Run Alembic migrations programmatically, from a checkout or an installed wheel (CLI only).

Every upgrade, whoever starts it (``llmgw db upgrade``, ``alembic upgrade head``, ``serve`` with
LLMGW_AUTO_MIGRATE=true), runs under one PostgreSQL advisory lock (alembic/env.py takes it with
:func:`migration_lock`): replicas or a Helm hook starting together would otherwise all read the
same old revision and race to create the same objects, and all but one fail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import attrs
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection

from alembic import command
from llmgw.storage.revisions import script_location

__all__ = [
    "LOCK_WAIT_SECONDS",
    "MIGRATION_LOCK_KEY",
    "MigrationLockTimeout",
    "Upgraded",
    "alembic_config",
    "downgrade",
    "head_revision",
    "migration_lock",
    "sqlalchemy_url",
    "upgrade",
]

# The advisory lock every llmgw migration holds. Advisory keys are one space per database shared
# with whatever else uses it, so this is a fixed arbitrary number (the first 8 bytes of
# sha256(b"llmgw migrations"), as a signed bigint) rather than a small one another tool might use.
MIGRATION_LOCK_KEY = -0x547E_CDA3_470B_E802

# How long a migration waits for another one's lock before it gives up: far longer than any of
# llmgw's migrations takes, short enough that a stuck one is reported rather than waited on forever.
LOCK_WAIT_SECONDS = 600

# config.attributes keys alembic/env.py fills in for the caller (an attributes dict is how Alembic
# lets a caller and env.py talk).
WAITED = "llmgw.lock_waited"
BEFORE = "llmgw.revision_before"
AFTER = "llmgw.revision_after"
ON_WAIT = "llmgw.on_lock_wait"

_log = logging.getLogger("alembic.env")


@attrs.frozen
class Upgraded:
    """What an upgrade found and left: ``before`` is read under the lock, so a run that waited for
    another sees that one's result."""

    before: str | None
    after: str | None
    waited: bool


class MigrationLockTimeout(RuntimeError):
    """Another migration held the lock past LOCK_WAIT_SECONDS."""


def sqlalchemy_url(database_url: str) -> str:
    """SQLAlchemy's spelling of a libpq URL, using the asyncpg driver (the only one we ship)."""
    scheme, sep, rest = database_url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        raise ValueError("DATABASE_URL must start with postgresql://")
    return f"postgresql+asyncpg://{rest}"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    config.attributes["database_url"] = database_url
    config.attributes["configure_logging"] = False
    return config


def head_revision() -> str:
    """Alembic's own answer (revisions.head_revision reads the files without Alembic)."""
    head = ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_current_head()
    if head is None:
        raise RuntimeError("no migrations found")
    return head


def _default_on_wait() -> None:
    _log.info("Another migration holds llmgw's migration lock; waiting for it")


@contextmanager
def migration_lock(connection: Connection, config: Config) -> Iterator[None]:
    """Hold llmgw's advisory lock on ``connection`` (a session lock: it outlives the transactions
    Alembic opens and closes inside); records in ``config.attributes`` whether it had to wait."""
    key = {"key": MIGRATION_LOCK_KEY}
    waited = not connection.execute(text("SELECT pg_try_advisory_lock(:key)"), key).scalar()
    if waited:
        on_wait: Callable[[], None] = config.attributes.get(ON_WAIT, _default_on_wait)
        on_wait()
        # SET LOCAL ends with this transaction: the migrations themselves run without the bound.
        connection.execute(text(f"SET LOCAL lock_timeout = '{LOCK_WAIT_SECONDS}s'"))
        try:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), key)
        except Exception as exc:
            if getattr(getattr(exc, "orig", None), "sqlstate", None) == "55P03":
                raise MigrationLockTimeout(
                    f"another migration held the migration lock for over {LOCK_WAIT_SECONDS} s"
                ) from None
            raise
    connection.commit()
    config.attributes[WAITED] = waited
    try:
        yield
    finally:
        if connection.in_transaction():
            connection.rollback()
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), key)
        connection.commit()


def upgrade(
    database_url: str, revision: str = "head", on_wait: Callable[[], None] | None = None
) -> Upgraded:
    """Upgrade under the migration lock; ``on_wait`` is called if another migration holds it."""
    config = alembic_config(database_url)
    if on_wait is not None:
        config.attributes[ON_WAIT] = on_wait
    command.upgrade(config, revision)
    return Upgraded(
        before=config.attributes.get(BEFORE),
        after=config.attributes.get(AFTER),
        waited=bool(config.attributes.get(WAITED, False)),
    )


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)
