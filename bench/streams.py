"""``python -m bench.streams``: many concurrent slow streams through one ``serve`` process (issue 23,
benchmark b).

``--streams`` streams (default 2,000) start evenly over ``--ramp`` seconds; each is the fake Venice's
``--chunks`` events ``--chunk-delay`` s apart, so with the defaults (20 chunks, 1 s apart, a 10 s
ramp) all of them are open at once for about 10 s. The gateway starts under a soft open-files
limit of ``--soft-open-files`` (default 1,024, the common default) and raises it itself.

Measured: each stream's status, whether it ended with ``data: [DONE]`` and as many bytes as the
others (same length: same events), its first byte (request sent to the first body byte), the
largest gap between two reads of its body; the gateway's peak RSS (VmHWM), most file descriptors
and open streams at once (sampled every 0.1 s), and its CPU over the run; the load side's own CPU
(this process: each stream is one connection read by a small HTTP/1.1 protocol, about 1 ms of CPU
a stream less than aiohttp's client, on the core it shares with the fake and the database).
Targets (issue 23): every stream served, first byte p99 <= 100 ms, RSS <= 256 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import attrs
import orjson
import uvloop

from bench.lab import PROVIDER_KEY
from bench.load import chat_body, percentiles
from bench.one_process import world
from bench.procstat import SystemCpu, cpu_us, memory
from bench.soak import mint_key

_DONE = b"data: [DONE]\n\n"
# The caller asks for the usage chunk, as agent clients do: then every event the provider sends is
# relayed as it comes (otherwise the gateway drops that chunk and the last gap is two of the
# provider's).
_BODY = orjson.dumps(
    {**orjson.loads(chat_body(stream=True)), "stream_options": {"include_usage": True}}
)
_SAMPLE_SECONDS = 0.1


@attrs.define
class Stream:
    status: int = 0
    error: str = ""
    first_byte_ms: float | None = None
    largest_gap_ms: float = 0.0
    size: int = 0
    complete: bool = False


@attrs.define
class Peaks:
    fds: int = 0
    open_streams: int = 0


class _Broken(Exception):
    """The answer was not HTTP/1.1 as this client reads it."""


class _Exchange(asyncio.Protocol):
    """One request on a connection of its own, its answer read as it arrives (a status line,
    headers, then a chunked or a Content-Length body).

    Instead of aiohttp's client: the load side shares a core with the fake provider (and the
    database), and its per-request work (the session's cookie jar, header multidicts, a stream
    reader per response) would be measured as the gateway's first bytes.
    """

    def __init__(self, request: bytes, stream: Stream, sent: float) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._request = request
        self._stream = stream
        self._sent = self._last = sent
        self._head = b""
        self._in_body = False
        self._chunked = False
        self._length: int | None = None
        self._pending = b""  # chunked bytes not decoded yet
        self.body = bytearray()
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        # uvloop's TCP transport writes, but is no subclass of asyncio's Transport.
        cast(asyncio.WriteTransport, transport).write(self._request)

    def data_received(self, data: bytes) -> None:
        try:
            if not self._in_body:
                self._head += data
                end = self._head.find(b"\r\n\r\n")
                if end < 0:
                    return
                data = self._head[end + 4 :]
                self._headers(self._head[:end])
                if not data:
                    return
            now = time.perf_counter()
            if self._stream.first_byte_ms is None:
                self._stream.first_byte_ms = (now - self._sent) * 1000
            else:
                gap = (now - self._last) * 1000
                self._stream.largest_gap_ms = max(self._stream.largest_gap_ms, gap)
            self._last = now
            self._feed(data)
        except (_Broken, ValueError, IndexError) as exc:
            self._end(_Broken(f"unreadable answer: {exc}"))

    def _headers(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self._stream.status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        self._chunked = headers.get(b"transfer-encoding") == b"chunked"
        if b"content-length" in headers:
            self._length = int(headers[b"content-length"])
        elif not self._chunked:
            raise _Broken("neither chunked nor a Content-Length")
        self._in_body = True
        if self._length == 0:
            self._end(None)

    def _feed(self, data: bytes) -> None:
        if not self._chunked:
            self.body += data
            if self._length is not None and len(self.body) >= self._length:
                self._end(None)
            return
        pending = self._pending + data
        while True:
            line_end = pending.find(b"\r\n")
            if line_end < 0:
                break
            size = int(pending[:line_end].split(b";")[0], 16)
            chunk_end = line_end + 2 + size
            if len(pending) < chunk_end + 2:
                break
            if size == 0:
                self._end(None)
                break
            self.body += pending[line_end + 2 : chunk_end]
            pending = pending[chunk_end + 2 :]
        self._pending = pending

    def _end(self, error: Exception | None) -> None:
        if self.done.done():
            return
        if error is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(error)
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(ConnectionResetError("closed before the end of the answer"))


def _request(url: str, key: str) -> tuple[str, int, bytes]:
    """Host, port and the bytes of the request every stream sends."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(_BODY)}\r\n\r\n"
    )
    return parts.hostname, parts.port, head.encode() + _BODY


async def _one(
    target: tuple[str, int, bytes], start_at: float, timeout: float, open_now: list[int]
) -> Stream:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(start_at - loop.time(), 0.0))
    host, port, request = target
    stream = Stream()
    body = b""
    sent = time.perf_counter()
    open_now[0] += 1
    try:
        transport, exchange = await asyncio.wait_for(
            loop.create_connection(lambda: _Exchange(request, stream, sent), host, port), timeout
        )
        try:
            await asyncio.wait_for(exchange.done, timeout)
        finally:
            transport.close()
            body = bytes(exchange.body)
    except (OSError, TimeoutError, _Broken) as exc:
        stream.error = f"{type(exc).__name__}: {exc}"[:100]
    finally:
        open_now[0] -= 1
    stream.size = len(body)
    stream.complete = stream.status == 200 and body.endswith(_DONE) and b'"error"' not in body
    return stream


async def _sample(pid: int, peaks: Peaks, open_now: list[int]) -> None:
    while True:
        try:
            peaks.fds = max(peaks.fds, len(os.listdir(f"/proc/{pid}/fd")))
        except FileNotFoundError:
            return
        peaks.open_streams = max(peaks.open_streams, open_now[0])
        await asyncio.sleep(_SAMPLE_SECONDS)


async def _drive(
    url: str, key: str, pid: int, count: int, ramp: float, timeout: float
) -> tuple[list[Stream], Peaks, float, int, int]:
    """The streams, the peaks, the wall time, the gateway's CPU µs over it and this process's
    (the load side's)."""
    peaks, open_now = Peaks(), [0]
    sampler = asyncio.create_task(_sample(pid, peaks, open_now))
    target = _request(url, key)
    cpu_before, started = cpu_us(pid) or 0, time.perf_counter()
    load_before = time.process_time()
    begin = asyncio.get_running_loop().time()
    streams = await asyncio.gather(
        *(_one(target, begin + ramp * i / count, timeout, open_now) for i in range(count))
    )
    wall, cpu = time.perf_counter() - started, (cpu_us(pid) or 0) - cpu_before
    load_cpu = round((time.process_time() - load_before) * 1e6)
    sampler.cancel()
    return list(streams), peaks, wall, cpu, load_cpu


def _listen_overflows() -> int:
    """Connections this machine dropped because a listening socket's queue was full (every
    socket's: TcpExt ListenOverflows)."""
    lines = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines()]
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names[0] == "TcpExt:" and "ListenOverflows" in names:
            return int(values[names.index("ListenOverflows")])
    return 0


def _report(args: argparse.Namespace, streams: Sequence[Stream], peaks: Peaks, wall: float,
            cpu: int, peak_rss_mib: float) -> None:  # fmt: skip
    sizes = {s.size for s in streams if s.complete}
    complete = sum(s.complete for s in streams) if len(sizes) == 1 else 0
    first = percentiles([s.first_byte_ms for s in streams if s.first_byte_ms is not None])
    gaps = percentiles([s.largest_gap_ms for s in streams if s.complete])
    errors: dict[str, int] = {}
    for s in streams:
        if not s.complete:
            what = s.error or f"status {s.status}"
            errors[what] = errors.get(what, 0) + 1
    print(f"{args.streams} streams of {args.chunks} chunks {args.chunk_delay:g} s apart, "
          f"started over {args.ramp:g} s; the gateway started under a soft limit of "
          f"{args.soft_open_files} open files, LIMIT_SLICE_REQUESTS={args.slice_requests}")  # fmt: skip
    print(f"- served completely: {complete} of {len(streams)} (one length: {len(sizes) == 1})"
          + (f"; failed: {errors}" if errors else ""))  # fmt: skip
    late = sum(s.first_byte_ms is not None and s.first_byte_ms > 1000 for s in streams)
    if first is not None:
        print(
            f"- first byte: p50 {first.p50:.1f} ms, p90 {first.p90:.1f} ms, p99 {first.p99:.1f} "
            f"ms, max {first.max:.1f} ms; {late} after more than 1 s"
        )
    if gaps is not None:
        print(f"- largest gap between chunks (per stream): p50 {gaps.p50:.0f} ms, "
              f"p99 {gaps.p99:.0f} ms, max {gaps.max:.0f} ms (the upstream's: "
              f"{args.chunk_delay * 1000:.0f} ms)")  # fmt: skip
    print(f"- open at once: {peaks.open_streams} streams; its fds at most {peaks.fds}; "
          f"peak RSS {peak_rss_mib:.1f} MiB; CPU {cpu / 1e6:.2f} s in {wall:.1f} s "
          f"({cpu / 1e4 / wall:.0f}% of a core, {cpu / len(streams):.0f} µs a stream)")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.streams")
    parser.add_argument("--admin-url", help="a running PostgreSQL (default: an embedded one)")
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--ramp", type=float, default=10.0, help="seconds to start them all")
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--chunk-delay", type=float, default=1.0)
    parser.add_argument("--soft-open-files", type=int, default=1024)
    parser.add_argument(
        "--direct", action="store_true", help="the same streams straight to the fake, no gateway"
    )
    parser.add_argument("--redis-url", help="the gateway's limits on this Redis")
    parser.add_argument(
        "--slice-requests",
        type=int,
        default=0,
        help="the gateway's LIMIT_SLICE_REQUESTS (capacity leases; 0: one statement a request)",
    )
    parser.add_argument("--nice", type=int, default=0, help="e.g. -10 on a shared machine")
    args = parser.parse_args(argv)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds every client
    with world(
        args.admin_url, chunks=args.chunks, chunk_delay=args.chunk_delay, nice=args.nice
    ) as lab:
        if args.direct:
            target, url, key = lab.upstream, lab.upstream_url + "/chat/completions", PROVIDER_KEY
        else:
            target, base = lab.start_gateway(
                soft_open_files=args.soft_open_files,
                redis_url=args.redis_url,
                slice_requests=args.slice_requests,
            )
            url, key = base + "/v1/chat/completions", asyncio.run(mint_key(lab.database_url))
        # A stream that has not ended a minute after its last chunk was due is not served.
        timeout = args.chunks * args.chunk_delay + 60.0
        try:
            busy_before, overflows = SystemCpu.take(), _listen_overflows()
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                streams, peaks, wall, cpu, load_cpu = runner.run(
                    _drive(url, key, target.pid, args.streams, args.ramp, timeout)
                )
            busy = SystemCpu.take().since(busy_before) / (wall * 1e6 * len(busy_before.busy_us))
            used = memory(target.pid)
        finally:
            target.stop()
        lines = target.log_path.read_text(errors="replace").splitlines()
    notable = collections.Counter(
        orjson.loads(line).get("message", "")[:120]
        for line in lines
        if line.startswith("{")
        and ('"open files:' in line or '"level":"warn' in line or '"level":"error' in line)
    )
    print(f"{'the fake Venice, directly' if args.direct else 'the gateway'}'s log:")
    for message, count in notable.most_common(8):
        print(f"  {count} x {message}")
    print(f"the machine was {busy:.0%} busy (every process, this benchmark's included); "
          f"load average {os.getloadavg()[0]:.1f}; listen queue overflows (any socket): "
          f"{_listen_overflows() - overflows}")  # fmt: skip
    _report(args, streams, peaks, wall, cpu, used.peak_rss_mib if used else 0.0)
    print(f"- the load side (this process): CPU {load_cpu / 1e6:.2f} s, "
          f"{load_cpu / len(streams):.0f} µs a stream")  # fmt: skip


if __name__ == "__main__":
    main()
