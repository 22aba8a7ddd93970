"""Which schema revision the code expects and the database has, without importing Alembic.

Alembic and SQLAlchemy cost a serving process about 44 MiB of memory, so ``serve`` reads the head
revision straight from the migration files (a test checks it agrees with Alembic) and leaves running
migrations to ``llmgw db upgrade``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import asyncpg

__all__ = ["current_revision", "head_revision", "known_revisions", "script_location"]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_REVISION = re.compile(r'^revision\s*=\s*"(?P<id>[^"]+)"', re.MULTILINE)
_DOWN_REVISION = re.compile(r'^down_revision\s*=\s*(?:"(?P<id>[^"]+)"|None)', re.MULTILINE)


def script_location() -> Path:
    """Migrations ship in a wheel as llmgw/_migrations; a checkout keeps them in alembic/."""
    installed = _PACKAGE_DIR / "_migrations"
    if (installed / "env.py").is_file():
        return installed
    return _PACKAGE_DIR.parent / "alembic"


@functools.cache
def _revision_graph() -> tuple[frozenset[str], frozenset[str]]:
    """Every revision this code ships, and every revision that has a child."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (script_location() / "versions").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        revision, parent = _REVISION.search(text), _DOWN_REVISION.search(text)
        if revision is None or parent is None:
            continue
        revisions.add(revision["id"])
        if parent["id"] is not None:
            parents.add(parent["id"])
    return frozenset(revisions), frozenset(parents)


def known_revisions() -> frozenset[str]:
    return _revision_graph()[0]


def head_revision() -> str:
    revisions, parents = _revision_graph()
    heads = sorted(revisions - parents)
    if len(heads) != 1:
        raise RuntimeError(f"expected one head revision, found {heads}")
    return heads[0]


async def current_revision(connection: asyncpg.Connection) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    exists = await connection.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL")
    if not exists:
        return None
    revision: str | None = await connection.fetchval("SELECT version_num FROM alembic_version")
    return revision
