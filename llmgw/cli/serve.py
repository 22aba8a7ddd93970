"""``llmgw serve``: run the gateway until SIGTERM/SIGINT, then drain in-flight requests and exit 0."""

from __future__ import annotations

import argparse
import asyncio
import logging

from aiohttp import web

from llmgw.app import create_app
from llmgw.cli.common import environment_help, prepare_database
from llmgw.config import load_settings
from llmgw.telemetry.logs import configure_logging

__all__ = ["register"]

log = logging.getLogger("llmgw.serve")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the gateway",
        description=(
            "Serve the OpenAI-compatible API (/v1/chat/completions, /v1/models) plus /healthz and "
            "/readyz. Configuration comes from the environment only. With DATABASE_URL unset, an "
            "embedded PostgreSQL is started in LLMGW_DATA_DIR and migrated automatically; with an "
            "external database the schema must already be at head (run 'alembic upgrade head' as a "
            "release step) unless LLMGW_AUTO_MIGRATE=true. SIGTERM or SIGINT stops accepting "
            "connections and lets in-flight requests finish within SHUTDOWN_GRACE_SECONDS."
        ),
        epilog=environment_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.set_defaults(run=_serve)


def _event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def _serve(_args: argparse.Namespace) -> int:
    settings = load_settings(require_venice_key=True)
    configure_logging(settings.log_level)
    database_url = prepare_database(settings)
    app = create_app(settings, database_url=database_url, check_provider_credentials=True)
    upstreams = [f"{spec.name} at {spec.base_url}" for spec in settings.providers] or [
        f"venice at {settings.venice_base_url}"
    ]
    log.info(
        "llmgw listening on http://%s:%d (providers: %s)",
        settings.bind_host,
        settings.bind_port,
        ", ".join(upstreams),
    )
    web.run_app(
        app,
        host=settings.bind_host,
        port=settings.bind_port,
        shutdown_timeout=settings.shutdown_grace_seconds,
        # Also bounds a client that sends its request line and headers too slowly (slow loris).
        keepalive_timeout=min(75.0, settings.request_timeout_seconds),
        handler_cancellation=True,
        access_log=None,
        print=None,
        loop=_event_loop(),
    )
    log.info("llmgw stopped")
    return 0
