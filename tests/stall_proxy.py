"""A TCP proxy that can stall: while paused, what clients send is held back (the server sees
nothing, as in a network stall); on resume it is delivered, even for clients that gave up and
hung up meanwhile, as a stalled network delivers what was already on its way."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

__all__ = ["StallProxy"]


class _Link:
    def __init__(self, server: asyncio.StreamWriter) -> None:
        self.server = server
        self.held = bytearray()
        self.client_gone = False
        self.answered = asyncio.Event()  # the server sent something (or hung up) since resume


class StallProxy:
    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._paused = False
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def before(cls, url: str) -> tuple[StallProxy, str]:
        """A started proxy in front of the server ``url`` names, and ``url`` reaching it through
        the proxy (its path and query kept)."""
        target = urlsplit(url)
        proxy = cls(target.hostname or "127.0.0.1", target.port or 6379)
        port = await proxy.start()
        return proxy, target._replace(netloc=f"127.0.0.1:{port}").geturl()

    async def start(self, port: int = 0) -> int:
        """Listen on ``port`` of 127.0.0.1 (0: a free one); returns it."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in self._links:
            link.server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def pause(self) -> None:
        self._paused = True

    async def resume(self, *, within: float = 10.0) -> None:
        """Deliver what was held; return once the server answered each held request."""
        self._paused = False
        waiting = [link for link in self._links if link.held]
        for link in waiting:
            link.answered.clear()
            link.server.write(bytes(link.held))
            link.held.clear()
            if link.client_gone:
                link.server.write_eof()
        async with asyncio.timeout(within):
            await asyncio.gather(*(link.answered.wait() for link in waiting))

    async def _serve(
        self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter
    ) -> None:
        server_reader, server = await asyncio.open_connection(*self._target)
        link = _Link(server)
        self._links.add(link)
        down = asyncio.create_task(self._down(server_reader, client, link))
        self._tasks.add(down)
        try:
            while data := await client_reader.read(65536):
                if self._paused or link.held:
                    link.held += data
                else:
                    server.write(data)
        except ConnectionError:
            pass
        link.client_gone = True
        if not link.held:
            with contextlib.suppress(OSError):
                server.write_eof()

    async def _down(
        self, server_reader: asyncio.StreamReader, client: asyncio.StreamWriter, link: _Link
    ) -> None:
        try:
            while data := await server_reader.read(65536):
                link.answered.set()
                if not client.is_closing():
                    client.write(data)
        except ConnectionError:
            pass
        link.answered.set()
        client.close()
        link.server.close()
        self._links.discard(link)
