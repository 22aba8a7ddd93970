"""The floor: the least an aiohttp pass-through proxy can do, to price llmgw's extra work against.

No auth, limits, validation or telemetry; one shared ClientSession; streams relayed chunk by chunk.
Run standalone: ``python bench/floor_proxy.py --port 0 --upstream http://127.0.0.1:P/api/v1``.

With ``--cache``, the least a response cache's hit can cost: answers are kept in a dict by the
request body in canonical form (parsed and re-encoded with sorted keys, as any exact cache must)
and a repeat is answered with the kept bytes (a stream with its kept chunks), with no upstream call.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Callable, Sequence

import aiohttp
import orjson
from aiohttp import web

# The fake upstream's provider key; the floor must present it just as llmgw does.
PROVIDER_KEY = "venice-fake-provider-key-7f3a9c"

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)
# --cache: by canonical request body, the answer's content type and its body (or its chunks).
KEPT = web.AppKey("kept", dict[bytes, tuple[str, bytes | list[bytes]]])


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    kept = request.app.get(KEPT)
    key = b""
    if kept is not None:
        key = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
        found = kept.get(key)
        if found is not None:
            return await _replay(request, *found)
    headers = {"Authorization": f"Bearer {PROVIDER_KEY}", "Content-Type": "application/json"}
    session = request.app[SESSION]
    async with session.post(request.app[UPSTREAM], data=body, headers=headers) as upstream:
        content_type = upstream.headers.get("Content-Type", "application/json")
        if not content_type.startswith("text/event-stream"):
            payload = await upstream.read()
            if kept is not None and upstream.status == 200:
                kept[key] = (content_type, payload)
            return web.Response(
                status=upstream.status, body=payload, headers={"Content-Type": content_type}
            )
        response = web.StreamResponse(
            status=upstream.status, headers={"Content-Type": content_type}
        )
        await response.prepare(request)
        chunks = []
        async for chunk in upstream.content.iter_any():
            chunks.append(chunk)
            await response.write(chunk)
        await response.write_eof()
        if kept is not None and upstream.status == 200:
            kept[key] = (content_type, chunks)
        return response


async def _replay(
    request: web.Request, content_type: str, answer: bytes | list[bytes]
) -> web.StreamResponse:
    if isinstance(answer, bytes):
        return web.Response(body=answer, headers={"Content-Type": content_type})
    response = web.StreamResponse(headers={"Content-Type": content_type})
    await response.prepare(request)
    for chunk in answer:
        await response.write(chunk)
    await response.write_eof()
    return response


async def serve(port: int, upstream: str, *, cache: bool = False) -> None:
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/") + "/chat/completions"
    if cache:
        app[KEPT] = {}
    # Same connection pool size as llmgw's provider session, so neither is starved of sockets.
    app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512))
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
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
        await app[SESSION].close()


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    # llmgw serves on uvloop when installed; the floor must use the same loop to be comparable.
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Minimal aiohttp pass-through proxy (the floor).")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--upstream", required=True, help="upstream base URL, e.g. .../api/v1")
    parser.add_argument("--cache", action="store_true", help="answer repeats from memory")
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(serve(args.port, args.upstream, cache=args.cache))


if __name__ == "__main__":
    main()
