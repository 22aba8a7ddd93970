"""Operational routes: /healthz (liveness), /readyz (database, schema and rate-limit store),
/metrics (Prometheus)."""

from __future__ import annotations

from aiohttp import web

from llmgw import app_keys
from llmgw.errors import NotFound, ServiceUnavailable
from llmgw.storage.database import DATABASE_DOWN_ERRORS
from llmgw.storage.revisions import current_revision, head_revision, known_revisions

__all__ = ["healthz", "metrics", "readyz"]

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
    # A revision this code does not know is a newer release's: migrations only add, so a replica
    # of the previous release keeps serving while a rolling upgrade replaces it.
    newer = revision is not None and revision not in known_revisions()
    if revision != head and not newer:
        raise ServiceUnavailable(
            f"Not ready: the database schema is at {revision or 'nothing'}, not {head}; "
            "run 'alembic upgrade head'.",
            code="schema_not_at_head",
        )
    try:
        # Requests fail closed without it (503), so a replica that cannot reach it is not ready.
        await request.app[app_keys.LIMITS].store.ping()
    except ServiceUnavailable:
        raise ServiceUnavailable(
            "Not ready: the rate-limit store does not answer.", code="rate_limit_store_unavailable"
        ) from None
    return web.Response(body=b'{"status":"ready"}', content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text format of the same metrics OTLP exports (enabled by LLMGW_PROMETHEUS)."""
    registry = request.app[app_keys.TELEMETRY].providers.prometheus_registry
    if registry is None:
        raise NotFound("Metrics are not served here; set LLMGW_PROMETHEUS=true to enable /metrics.")
    # Imported here: prometheus_client costs memory that only LLMGW_PROMETHEUS=true needs.
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )
