"""``llmgw serve``: run the gateway until SIGTERM/SIGINT, then drain in-flight requests and exit 0.

One process by default; with ``--workers N`` (or LLMGW_WORKERS) a supervisor and N workers, each
of which is ``serve --worker-id I`` again (see llmgw.lifecycle.supervisor).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket

import asyncpg
import attrs

from llmgw.app import create_app
from llmgw.cli.common import EXIT_CONFIG, CommandError, environment_help, prepare_database
from llmgw.compat import log_fast_paths
from llmgw.config import ConfigError, Settings, load_settings, parse_workers
from llmgw.config.common import shown_url
from llmgw.lifecycle import runner
from llmgw.lifecycle.supervisor import (
    READY_FD_ARGUMENT,
    WORKER_ID_ARGUMENT,
    supervise,
    tell_ready,
)
from llmgw.storage.database import DATABASE_DOWN_ERRORS
from llmgw.telemetry.logs import configure_logging

__all__ = ["register"]

log = logging.getLogger("llmgw.serve")


def _workers(text: str) -> int:
    try:
        return parse_workers(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 1-256 or auto, not {text!r}") from None


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
            "connections and lets in-flight requests finish within SHUTDOWN_GRACE_SECONDS. SIGHUP "
            "re-reads LLMGW_CONFIG (an invalid file is logged and changes nothing)."
        ),
        epilog=environment_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--workers",
        type=_workers,
        default=None,
        metavar="N",
        help="worker processes accepting on BIND_ADDR under one supervisor: 1-256 or auto "
        "(the cores available); default LLMGW_WORKERS, else 1",
    )
    # How the supervisor starts a worker: its number, and where to say it is serving.
    serve.add_argument(WORKER_ID_ARGUMENT, type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument(READY_FD_ARGUMENT, type=int, default=None, help=argparse.SUPPRESS)
    serve.set_defaults(run=_serve)


def _bind(settings: Settings, *, listening: bool, shared: bool) -> socket.socket:
    bind = runner.listen if listening else runner.bind
    try:
        return bind(settings.bind_host, settings.bind_port, shared=shared)
    except OSError as exc:
        raise CommandError(
            f"cannot listen on {settings.bind_host}:{settings.bind_port} "
            f"({exc.strerror or type(exc).__name__}); check BIND_ADDR",
            EXIT_CONFIG,
        ) from None


def _upstreams(settings: Settings) -> str:
    return ", ".join(
        f"{spec.name} at {shown_url(spec.base_url)}" for spec in settings.routed_providers
    )


def _serve(args: argparse.Namespace) -> int:
    # Until the server handles SIGHUP (a reload), one must not kill a process that is starting.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    settings = load_settings(require_venice_key=True)
    if args.worker_id is not None:
        return _serve_worker(settings, args.worker_id, args.ready_fd)
    if args.workers is not None:
        settings = attrs.evolve(settings, workers=args.workers)
    configure_logging(settings.log_level, secrets=settings.secrets())
    single = settings.workers == 1
    # Bound before anything else, so a taken port is the first and only error.
    sock = _bind(settings, listening=single, shared=not single)
    database_url = prepare_database(settings)
    where = f"http://{settings.bind_host}:{settings.bind_port}"
    if single:
        app = create_app(settings, database_url=database_url, check_provider_credentials=True)
        log_fast_paths()  # after the configuration is known good: a refusal stays one line
        log.info("llmgw listening on %s (providers: %s)", where, _upstreams(settings))
        runner.run(app, settings, sock)
        log.info("llmgw stopped")
        return 0
    log.info(
        "llmgw listening on %s with %d workers (providers: %s)",
        where,
        settings.workers,
        _upstreams(settings),
    )
    # The workers attach to the database prepared here (the embedded cluster is started once).
    with sock:  # holds the port while workers restart
        status = supervise(
            settings.workers,
            {**os.environ, "DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"},
            settings.shutdown_grace_seconds,
        )
    log.info("llmgw stopped")
    return status


def _ready(number: int, ready_fd: int | None) -> None:
    log.info("worker %d serving (pid %d)", number, os.getpid())
    if ready_fd is not None:
        tell_ready(ready_fd)


def _serve_worker(settings: Settings, number: int, ready_fd: int | None) -> int:
    configure_logging(settings.log_level, worker=number, secrets=settings.secrets())
    if settings.database_url is None:
        raise ConfigError("DATABASE_URL", None, "the URL the supervisor passes to its workers")
    sock = _bind(settings, listening=True, shared=True)
    app = create_app(settings, database_url=settings.database_url, check_provider_credentials=True)
    log_fast_paths()
    try:
        runner.run(
            app,
            settings,
            sock,
            supervisor_pid=os.getppid(),
            on_ready=lambda: _ready(number, ready_fd),
        )
    except (*DATABASE_DOWN_ERRORS, asyncpg.PostgresError) as exc:
        # The supervisor reached the database a moment ago; say why this worker could not.
        raise CommandError(
            f"worker {number} could not start: {type(exc).__name__}: {exc}"
        ) from None
    return 0
