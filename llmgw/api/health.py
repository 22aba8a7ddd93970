"""GET /healthz (liveness: the process answers) and GET /readyz (the database answers, schema at head)."""

from __future__ import annotations

from aiohttp import web

from llmgw import app_keys
from llmgw.errors import ServiceUnavailable
from llmgw.storage.database import DATABASE_DOWN_ERRORS
from llmgw.storage.migrations import current_revision, head_revision

__all__ = ["healthz", "readyz"]

_OK = b'{"status":"ok"}'


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(body=_OK, content_type="application/json")


async def readyz(request: web.Request) -> web.Response:
    pool = request.app[app_keys.POOL]
    try:
        async with pool.acquire(timeout=2.0) as connection:
            revision = await current_revision(connection)
    except DATABASE_DOWN_ERRORS:
        raise ServiceUnavailable("Not ready: the database does not answer.") from None
    head = head_revision()
    if revision != head:
        raise ServiceUnavailable(
            f"Not ready: the database schema is at {revision or 'nothing'}, not {head}; "
            "run 'alembic upgrade head'.",
            code="schema_not_at_head",
        )
    return web.Response(body=b'{"status":"ready"}', content_type="application/json")
