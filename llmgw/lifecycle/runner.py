"""One serving process: the app on a listening socket until SIGTERM/SIGINT, SIGHUP reloads.

Its connections answer requests that are not valid HTTP with a JSON error that quotes nothing
(:mod:`llmgw.lifecycle.invalid_http`), where aiohttp's connection hooks are enabled
(:mod:`llmgw.compat.aiohttp`). A client's FIN closes its connection, as in aiohttp: a client
that half-closes (shutdown(SHUT_WR)) after its request gets no answer. Keeping such a connection
open for its answer took aiohttp's private connection internals (the FIN alone cannot tell a
half-close from a client that left), and its public API has no hook for it, so llmgw does not.

On SIGTERM or SIGINT the socket stops accepting, requests in flight get ``SHUTDOWN_GRACE_SECONDS``
to finish, then the app's resources close (the telemetry export within its own bound). A worker
also stops when its supervisor is gone, so a killed supervisor leaves no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import socket
from collections.abc import Callable

from aiohttp import web

from llmgw import app_keys
from llmgw.compat.aiohttp import app_runner
from llmgw.config import Settings
from llmgw.lifecycle.invalid_http import invalid_http_answer
from llmgw.lifecycle.open_files import OPEN_FILES, OpenFiles, raise_open_file_limit
from llmgw.lifecycle.reload import RELOADER

__all__ = ["LISTEN_BACKLOG", "bind", "listen", "run"]

log = logging.getLogger("llmgw.serve")

_PARENT_CHECK_SECONDS = 1.0
# Connections the kernel holds for the process before it accepts them (Linux caps it at
# net.core.somaxconn, 4096 by default). Past it a new connection's SYN is dropped and the caller
# retries after 1, 3, 7 s: under aiohttp's default of 128, streams arriving at 200 a second to a
# busy process waited seconds for their first byte (bench/streams.py).
LISTEN_BACKLOG = 4096


def bind(host: str, port: int, *, shared: bool = False) -> socket.socket:
    """A socket bound to the address (OSError: the port is taken, the address not assignable).

    ``shared``: SO_REUSEPORT, so that every worker binds the address with its own socket and the
    kernel spreads new connections over them (one accept queue each; a worker that is busy or
    restarting is not handed the connections of the others).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR (as aiohttp sets it): a restart binds while old connections are in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def listen(host: str, port: int, *, shared: bool = False) -> socket.socket:
    """A listening socket on the address; see :func:`bind`."""
    sock = bind(host, port, shared=shared)
    sock.listen(LISTEN_BACKLOG)
    return sock


# A request makes a few hundred containers that almost all die with it (by reference counting);
# collecting the youngest generation every 700 of them, the default, cost ~45 µs of a request's
# ~700 µs of CPU, for next to nothing found (bench/RESULTS.md).
_YOUNG_GENERATION_THRESHOLD = 20_000


def _tune_garbage_collection() -> None:
    """Once serving: what startup made lives as long as the process, so the collector no longer
    walks it (``gc.freeze``), and the youngest generation is collected less often."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(_YOUNG_GENERATION_THRESHOLD, middle, oldest)


async def _serve(
    app: web.Application,
    settings: Settings,
    sock: socket.socket,
    *,
    supervisor_pid: int | None,
    on_ready: Callable[[], None],
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    open_files = app[OPEN_FILES] = OpenFiles(raise_open_file_limit())
    runner = app_runner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=settings.shutdown_grace_seconds,
        # Also bounds a client that sends its request line and headers too slowly (slow loris).
        keepalive_timeout=min(75.0, settings.request_timeout_seconds),
        # For each connection's hooks (llmgw.compat.aiohttp):
        invalid_http=functools.partial(invalid_http_answer, refusals=app[app_keys.REFUSALS]),
        connections=open_files,
    )
    await runner.setup()
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        loop.add_signal_handler(signal.SIGHUP, app[RELOADER].reload_soon)
        # The site listens again, with its own backlog: the same one, or it would be 128.
        await web.SockSite(runner, sock, backlog=LISTEN_BACKLOG).start()
        _tune_garbage_collection()
        on_ready()
        if supervisor_pid is None:
            await stop.wait()
        else:
            await _until_stopped_or_orphaned(stop, supervisor_pid)
        log.info(
            "stopping: no new connections; in-flight requests have %gs",
            settings.shutdown_grace_seconds,
        )
    finally:
        # No reload while the app closes; and a SIGHUP must not kill the requests draining.
        loop.add_signal_handler(signal.SIGHUP, log.info, "SIGHUP ignored: stopping")
        await runner.cleanup()


async def _until_stopped_or_orphaned(stop: asyncio.Event, supervisor_pid: int) -> None:
    while not stop.is_set():
        if os.getppid() != supervisor_pid:
            log.warning("the supervisor (pid %d) is gone; stopping", supervisor_pid)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), _PARENT_CHECK_SECONDS)


def _event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def run(
    app: web.Application,
    settings: Settings,
    sock: socket.socket,
    *,
    supervisor_pid: int | None = None,
    on_ready: Callable[[], None] = lambda: None,
) -> None:
    """Serve ``app`` on ``sock`` until told to stop, then drain and close everything."""
    with asyncio.Runner(loop_factory=_event_loop) as async_runner:
        async_runner.run(
            _serve(app, settings, sock, supervisor_pid=supervisor_pid, on_ready=on_ready)
        )
