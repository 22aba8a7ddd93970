"""Run and inspect Alembic migrations programmatically, from a checkout or an installed wheel."""

from __future__ import annotations

from pathlib import Path

import asyncpg
from alembic.config import Config
from alembic.script import ScriptDirectory

from alembic import command

__all__ = [
    "alembic_config",
    "current_revision",
    "downgrade",
    "head_revision",
    "sqlalchemy_url",
    "upgrade",
]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def _script_location() -> Path:
    # An installed wheel carries the migrations as llmgw/_migrations; a checkout keeps them in alembic/.
    installed = _PACKAGE_DIR / "_migrations"
    if (installed / "env.py").is_file():
        return installed
    return _PACKAGE_DIR.parent / "alembic"


def sqlalchemy_url(database_url: str) -> str:
    """SQLAlchemy's spelling of a libpq URL, using the asyncpg driver (the only one we ship)."""
    scheme, sep, rest = database_url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        raise ValueError("DATABASE_URL must start with postgresql://")
    return f"postgresql+asyncpg://{rest}"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_script_location()))
    config.attributes["database_url"] = database_url
    config.attributes["configure_logging"] = False
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_current_head()
    if head is None:
        raise RuntimeError("no migrations found")
    return head


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)


async def current_revision(connection: asyncpg.Connection) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    exists = await connection.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL")
    if not exists:
        return None
    revision: str | None = await connection.fetchval("SELECT version_num FROM alembic_version")
    return revision
