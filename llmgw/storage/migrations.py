"""Run Alembic migrations programmatically, from a checkout or an installed wheel (CLI only)."""

from __future__ import annotations

from alembic.config import Config
from alembic.script import ScriptDirectory

from alembic import command
from llmgw.storage.revisions import script_location

__all__ = ["alembic_config", "downgrade", "head_revision", "sqlalchemy_url", "upgrade"]


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


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)
