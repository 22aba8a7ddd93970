"""One ``llmgw serve`` process as it runs in production, for the issue 23 benchmarks
(``bench.streams``, ``bench.transactions``).

A scratch database, migrated to head and dropped afterwards, on an embedded PostgreSQL started
here (so it shares the load core and the priority of the benchmark, as in ``python -m bench``) or
on a running server (``--admin-url``); the fake Venice (``tests/fake_venice.py``) as its own process; the
gateway on core 0 and everything else (fake, database, load generator) on core 1 when there are
two, as in ``python -m bench``. The gateway may be started under a lowered soft open-files limit
(``prlimit``), to show it raises the limit itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import attrs

from bench.database import Database
from bench.lab import PROVIDER_KEY, REPO_ROOT
from bench.ledger_transactions import _scratch
from bench.services import Child, Pinning, free_port, spawn, wait_for_health, wait_for_listening
from llmgw.storage import migrations

__all__ = ["World", "world"]


@attrs.frozen
class World:
    pinning: Pinning
    tmp: Path
    admin_url: str
    database: str  # the scratch database's name
    database_url: str
    upstream: Child
    upstream_url: str

    def start_gateway(
        self,
        *,
        soft_open_files: int | None = None,
        redis_url: str | None = None,
        slice_requests: int = 0,
    ) -> tuple[Child, str]:
        """``llmgw serve`` on the proxy core (its soft RLIMIT_NOFILE lowered first if asked; its
        limits on ``redis_url`` if given, admitted from capacity leases with ``slice_requests``
        (``LIMIT_SLICE_REQUESTS``) if not 0): the child and its base URL."""
        port = free_port()
        env = {
            "PATH": "/usr/bin:/bin",
            "DATABASE_URL": self.database_url,
            "BIND_ADDR": f"127.0.0.1:{port}",
            "VENICE_API_KEY": PROVIDER_KEY,
            "VENICE_BASE_URL": self.upstream_url,
            "SHUTDOWN_GRACE_SECONDS": "2",
            "OTEL_SDK_DISABLED": "true",  # no sink here: spans and metrics would only queue
            "LIMIT_SLICE_REQUESTS": str(slice_requests),
        }
        if redis_url is not None:
            env.update(RATE_LIMIT_BACKEND="redis", REDIS_URL=redis_url)
        lowered = [] if soft_open_files is None else ["prlimit", f"--nofile={soft_open_files}:"]
        child = spawn(
            "gateway",
            [*lowered, sys.executable, "-m", "llmgw", "serve"],
            env=env,
            log_dir=self.tmp,
            pinning=self.pinning,
            core=self.pinning.proxy_core,
            cwd=REPO_ROOT,
        )
        base = f"http://127.0.0.1:{port}"
        wait_for_health(child, base + "/healthz")
        return child, base

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.database_url)


@contextlib.contextmanager
def world(
    admin_url: str | None, *, chunks: int, chunk_delay: float, nice: int = 0
) -> Iterator[World]:
    """The scratch database (on an embedded server unless ``admin_url``) and the fake Venice
    (``chunks`` events ``chunk_delay`` s apart); ``nice`` (e.g. -10, as root) for this process
    and every child, on a shared machine."""
    pinning = Pinning.detect(nice)
    print(f"{pinning.note}; {pinning.pin_self()}", flush=True)
    name = f"llmgw_bench_{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="llmgw-bench-"))
        os.chmod(tmp, 0o755)  # noqa: S103 (the embedded server runs as its own user under root)
        if admin_url is None:
            embedded = Database.start_embedded(Path(tmp) / "data")
            stack.callback(embedded.stop)
            admin_url = embedded.url
        database_url = urlunsplit(urlsplit(admin_url)._replace(path="/" + name))
        asyncio.run(_scratch(admin_url, name, create=True))
        upstream: Child | None = None
        try:
            migrations.upgrade(database_url)
            upstream = spawn(
                "upstream",
                [
                    sys.executable,
                    "tests/fake_venice.py",
                    "--port",
                    "0",
                    "--chunks",
                    str(chunks),
                    "--chunk-delay",
                    str(chunk_delay),
                ],
                env={"PATH": "/usr/bin:/bin"},
                log_dir=Path(tmp),
                pinning=pinning,
                core=pinning.rest_core,
                cwd=REPO_ROOT,
            )
            yield World(
                pinning, Path(tmp), admin_url, name, database_url, upstream,
                wait_for_listening(upstream),
            )  # fmt: skip
        finally:
            if upstream is not None:
                upstream.stop()
            asyncio.run(_scratch(admin_url, name, create=False))
