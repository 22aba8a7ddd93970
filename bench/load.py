"""Closed-loop load: a fixed number of chat requests at a fixed concurrency over one shared pool.

Each of ``concurrency`` workers sends its next request as soon as the previous one is answered.
Latency is measured from sending the request to the end of the body; for streams, time to first
byte is measured to the first body chunk. A request is an error when it fails at the transport
level, answers with a status other than 200, or (for streams) ends without ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

import aiohttp
import attrs
import orjson

__all__ = ["LoadResult", "LoadSpec", "Percentiles", "chat_body", "percentiles", "run_load"]

MODEL = "qwen3-5-9b"
_DONE = b"data: [DONE]"
_MAX_ERROR_SAMPLES = 5


def chat_body(stream: bool, model: str = MODEL) -> bytes:
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
    }
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


@attrs.frozen
class LoadSpec:
    url: str  # full URL of the chat completions endpoint
    token: str | None
    stream: bool
    concurrency: int
    requests: int
    warmup: int = 0
    timeout_seconds: float = 30.0
    model: str = MODEL  # a model alias routes through the gateway's routing policy


@attrs.frozen
class Percentiles:
    p50: float
    p90: float
    p99: float
    mean: float
    max: float


def percentiles(samples: Sequence[float]) -> Percentiles | None:
    """Nearest-rank percentiles; None for no samples."""
    if not samples:
        return None
    ordered = sorted(samples)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return Percentiles(
        p50=rank(0.50),
        p90=rank(0.90),
        p99=rank(0.99),
        mean=sum(ordered) / len(ordered),
        max=ordered[-1],
    )


@attrs.frozen
class LoadResult:
    requests: int
    errors: int
    wall_seconds: float
    latency_ms: Percentiles | None
    ttfb_ms: Percentiles | None
    error_samples: tuple[str, ...]

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.wall_seconds if self.wall_seconds > 0 else 0.0


@attrs.define
class _Samples:
    latency_ms: list[float] = attrs.Factory(list)
    ttfb_ms: list[float] = attrs.Factory(list)
    errors: int = 0
    error_samples: list[str] = attrs.Factory(list)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < _MAX_ERROR_SAMPLES:
            self.error_samples.append(what)


@attrs.frozen
class _Request:
    url: str
    body: bytes
    headers: dict[str, str]
    stream: bool


async def _one(session: aiohttp.ClientSession, request: _Request, samples: _Samples) -> None:
    start = time.perf_counter()
    first: float | None = None
    try:
        async with session.post(request.url, data=request.body, headers=request.headers) as resp:
            if request.stream:
                tail = b""
                async for chunk in resp.content.iter_any():
                    if first is None:
                        first = time.perf_counter()
                    # Only the end matters for the [DONE] check; keep a short window across chunks.
                    tail = (tail + chunk)[-32:]
                complete = _DONE in tail
            else:
                tail = await resp.read()
                complete = True
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        samples.error(f"{type(exc).__name__}: {exc}"[:200])
        return
    end = time.perf_counter()
    if status != 200:
        samples.error(f"HTTP {status}: {tail[:160].decode(errors='replace')}")
    elif not complete:
        samples.error("stream ended without [DONE]")
    else:
        samples.latency_ms.append((end - start) * 1000)
        if first is not None:
            samples.ttfb_ms.append((first - start) * 1000)


async def _worker(
    session: aiohttp.ClientSession, request: _Request, tickets: Iterator[int], samples: _Samples
) -> None:
    # Workers share one iterator, so together they send exactly as many requests as it yields.
    for _ in tickets:
        await _one(session, request, samples)


async def _drive(
    session: aiohttp.ClientSession, request: _Request, count: int, concurrency: int
) -> tuple[_Samples, float]:
    samples = _Samples()
    tickets = iter(range(count))
    start = time.perf_counter()
    await asyncio.gather(
        *(_worker(session, request, tickets, samples) for _ in range(min(concurrency, count)))
    )
    return samples, time.perf_counter() - start


async def run_load(spec: LoadSpec, mark: Callable[[], Awaitable[None]] | None = None) -> LoadResult:
    """Warm up (connections, caches), then send ``spec.requests`` and summarise them.

    ``mark`` is awaited right before and right after the measured requests, still inside the
    session, so the caller's readings cover exactly those requests.
    """
    headers = {"Content-Type": "application/json"}
    if spec.token is not None:
        headers["Authorization"] = f"Bearer {spec.token}"
    request = _Request(spec.url, chat_body(spec.stream, spec.model), headers, spec.stream)
    connector = aiohttp.TCPConnector(limit=spec.concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_seconds)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:
        if spec.warmup:
            await _drive(session, request, spec.warmup, spec.concurrency)
        if mark is not None:
            await mark()
        samples, wall = await _drive(session, request, spec.requests, spec.concurrency)
        if mark is not None:
            await mark()
    return LoadResult(
        requests=spec.requests,
        errors=samples.errors,
        wall_seconds=wall,
        latency_ms=percentiles(samples.latency_ms),
        ttfb_ms=percentiles(samples.ttfb_ms) if spec.stream else None,
        error_samples=tuple(samples.error_samples),
    )
