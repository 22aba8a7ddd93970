"""Alembic environment: runs migrations over asyncpg against DATABASE_URL (or the embedded database)."""

from __future__ import annotations

import asyncio
import logging.config

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from alembic import context
from llmgw.storage.migrations import AFTER, BEFORE, migration_lock, sqlalchemy_url
from llmgw.storage.schema import metadata

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)


def _database_url() -> str:
    given = config.attributes.get("database_url")
    if isinstance(given, str):
        return sqlalchemy_url(given)
    from llmgw.config import load_settings
    from llmgw.storage.embedded import resolve_database_url

    return sqlalchemy_url(resolve_database_url(load_settings()))


def _run(connection: Connection) -> None:
    # Under llmgw's advisory lock: concurrent upgrades run one after another, and each reads the
    # revision only once it holds the lock (see llmgw.storage.migrations).
    with migration_lock(connection, config):
        context.configure(connection=connection, target_metadata=metadata, compare_type=True)
        migration = context.get_context()
        config.attributes[BEFORE] = migration.get_current_revision()
        with context.begin_transaction():
            context.run_migrations()
        config.attributes[AFTER] = migration.get_current_revision()


async def _run_online() -> None:
    engine = create_async_engine(_database_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_database_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_online())
