"""An OTLP/HTTP endpoint that accepts and discards, so llmgw exports telemetry as in production.

Run standalone: ``python bench/otlp_sink.py --port 0``; it prints ``listening on URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Sequence

from aiohttp import web


async def discard(request: web.Request) -> web.Response:
    # Reading the body keeps the connection reusable; an empty 200 is a full OTLP success.
    await request.read()
    return web.Response(status=200)


async def serve(port: int) -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", discard)
    app.router.add_post("/v1/metrics", discard)
    app.router.add_post("/v1/logs", discard)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"listening on http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="OTLP/HTTP sink that discards everything.")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
