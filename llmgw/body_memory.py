"""How large a request body each route accepts, and how many body bytes all requests together
may hold in memory at once.

Each route has its own limit (``BodyLimit``: a Messages body may be 32 MiB, a chat body 1 MiB).
Every body is read whole into memory, so ``BodyMemory`` bounds their sum
(REQUEST_BODY_MEMORY_BYTES): a request whose body does not fit waits briefly, in arrival order,
for others to finish, then is refused with 503 and ``Retry-After``. Larger limits therefore
cannot exhaust the host, whatever arrives at once. A request's share (``BodyAllowance``) is held
until its handler returns, because the body and what is built from it live that long.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping

import attrs

from llmgw.errors import PayloadTooLarge, ServiceUnavailable

__all__ = ["BodyAllowance", "BodyLimit", "BodyLimits", "BodyMemory"]

# Long enough for a burst of other bodies to be read and answered, short enough that a client
# retrying after Retry-After loses little.
WAIT_SECONDS = 2.0
_RETRY_AFTER_SECONDS = 2
# A body of unknown length (chunked) reserves memory in steps as it arrives, not byte by byte.
_STEP = 1 << 20


@attrs.frozen
class BodyLimit:
    """The largest body a route accepts, and the variable that sets it (named in the 413)."""

    bytes: int
    setting: str

    def too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"Request body is larger than the limit of {self.bytes} bytes ({self.setting})."
        )


class BodyMemory:
    """Body bytes held in memory at once, all requests together; waiters are served in order."""

    def __init__(self, capacity: int, *, wait_seconds: float = WAIT_SECONDS) -> None:
        self.capacity = capacity
        self.free = capacity
        self._wait_seconds = wait_seconds
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def acquire(self, size: int) -> None:
        """Reserve ``size`` bytes (at most the capacity: release the same amount), waiting briefly.

        Raises ServiceUnavailable (503) when they do not become free in time.
        """
        if not self._waiters and size <= self.free:
            self.free -= size
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (size, granted)
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self._wait_seconds):
                await asyncio.shield(granted)
        except TimeoutError:
            if not granted.done():
                raise ServiceUnavailable(
                    "The gateway is holding as many request bodies in memory as it may "
                    "(REQUEST_BODY_MEMORY_BYTES); retry shortly.",
                    code="request_bodies_busy",
                    headers={"Retry-After": str(_RETRY_AFTER_SECONDS)},
                ) from None
            # Granted as the wait ran out: keep it.
        except BaseException:
            if granted.done():
                self.release(size)  # cancelled (the client left) just after being granted
            raise
        finally:
            if not granted.done():
                self._waiters.remove(waiter)
                granted.cancel()
                self._grant()  # a large waiter leaving may let smaller ones behind it in

    def release(self, size: int) -> None:
        self.free += size
        if self._waiters:  # (every request releases: most find nobody waiting)
            self._grant()

    def _grant(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.free:
            size, granted = self._waiters.popleft()
            self.free -= size
            granted.set_result(None)


class BodyAllowance:
    """One request's share: its route's limit, the memory its body holds so far, and the body
    once read (a handler may read it more than once)."""

    def __init__(self, limit: BodyLimit, memory: BodyMemory) -> None:
        self.limit = limit
        self._memory = memory
        self.reserved = 0
        self.body: bytes | None = None

    async def hold(self, size: int, *, arriving: bool = False) -> None:
        """The request now holds ``size`` body bytes in all: 413 past the route's limit, else
        memory for them, waited for briefly (503 if it does not come).

        ``arriving``: a body of unknown length, of which more may follow: reserved in steps.
        """
        if size > self.limit.bytes:
            raise self.limit.too_large()
        if size <= self.reserved:
            return
        target = max(size, self.reserved + _STEP) if arriving else size
        # Never more than the limit, nor than there is: a body larger than the whole bound may
        # still be read, alone.
        target = min(self.limit.bytes, target, self._memory.capacity)
        if target > self.reserved:
            await self._memory.acquire(target - self.reserved)
            self.reserved = target

    def release(self) -> None:
        if self.reserved:  # (a request without a body held nothing)
            self._memory.release(self.reserved)
            self.reserved = 0


@attrs.frozen
class BodyLimits:
    """Every route's body limit (``by_path``, else ``default``) and the memory all bodies share."""

    default: BodyLimit
    by_path: Mapping[str, BodyLimit]
    memory: BodyMemory

    def allowance(self, path: str) -> BodyAllowance:
        """A new request's share, released when its handler returns (gateway_middleware)."""
        return BodyAllowance(self.by_path.get(path, self.default), self.memory)
