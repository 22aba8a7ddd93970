"""The suite-wide check that no secret ends up in a log line, span, metric, error or response.

Every gateway key minted in this process (through ``llmgw.storage.api_keys.create_key``, which the
fixtures, the tests and the admin API all use) and the fake provider key are registered as secrets.
Hooks then scan, as they happen:

- every log record of the test process (formatted as the gateway's JSON log line);
- every span an in-memory exporter receives, and every metric collection of an in-memory reader;
- every response body read with aiohttp or httpx (the openai SDK), except the admin API's, which
  returns a new key's plaintext exactly once by design;
- the log files of gateway processes the tests start (``scan_text``), where those tests call it.

A key also counts as leaked when only its secret part (everything after the 12-character prefix,
which is not a secret) appears. ``conftest.py`` fails the test during which a leak was seen.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmgw.key_format import PREFIX_LENGTH
from llmgw.storage import api_keys
from llmgw.telemetry.logs import JsonFormatter

__all__ = ["SecretScanner"]

# Response bodies under these paths may carry a freshly minted key (shown once, by design: the
# admin API, and the same API behind the console).
_EXEMPT_RESPONSE_PATHS = ("/admin/", "/console/api/")


def _fragments(secret: str) -> tuple[str, ...]:
    # The whole secret, and for gateway keys also the part after the public prefix.
    tail = secret[PREFIX_LENGTH:]
    return (secret, tail) if secret.startswith("llmg_") and len(tail) >= 8 else (secret,)


class _ScanningHandler(logging.Handler):
    def __init__(self, scanner: SecretScanner) -> None:
        super().__init__(level=logging.DEBUG)
        self._scanner = scanner
        self._formatter = JsonFormatter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self._formatter.format(record)
        except Exception:  # a record that cannot be formatted is not ours to judge here
            line = str(record.msg)
        self._scanner.scan_text(line, f"log record of {record.name}")


class SecretScanner:
    """Registered secrets, the hooks that scan for them, and the leaks found so far."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fragments: dict[str, str] = {}  # fragment -> a safe description of its secret
        self.leaks: list[str] = []
        self.handler = _ScanningHandler(self)
        self._undo: list[Callable[[], None]] = []

    # -- secrets ------------------------------------------------------------------------------

    def register(self, secret: str, description: str | None = None) -> None:
        shown = description or f"secret {secret[:PREFIX_LENGTH]}…"
        with self._lock:
            for fragment in _fragments(secret):
                self._fragments[fragment] = shown

    def scan_text(self, text: str, where: str) -> None:
        if not text:
            return
        with self._lock:
            found = [shown for fragment, shown in self._fragments.items() if fragment in text]
        for shown in found:
            # Never repeat the secret itself in the failure message.
            self.leaks.append(f"{shown} appeared in {where}")

    def scan_bytes(self, data: bytes, where: str) -> None:
        self.scan_text(data.decode("utf-8", "replace"), where)

    def take_leaks(self) -> list[str]:
        leaks, self.leaks = self.leaks, []
        return leaks

    # -- hooks --------------------------------------------------------------------------------

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        original = getattr(owner, name)
        setattr(owner, name, replacement)
        self._undo.append(lambda: setattr(owner, name, original))

    def install(self) -> None:
        scanner = self
        create_key = api_keys.create_key

        @functools.wraps(create_key)
        async def registering_create_key(*args: Any, **kwargs: Any) -> api_keys.IssuedKey:
            issued = await create_key(*args, **kwargs)
            scanner.register(issued.plaintext, f"gateway key {issued.record.prefix}…")
            return issued

        self._patch(api_keys, "create_key", registering_create_key)

        export = InMemorySpanExporter.export

        def scanning_export(exporter: InMemorySpanExporter, spans: Any) -> Any:
            for span in spans:
                scanner.scan_text(span.to_json(indent=None), f"span {span.name!r}")
            return export(exporter, spans)

        self._patch(InMemorySpanExporter, "export", scanning_export)

        receive = InMemoryMetricReader._receive_metrics

        def scanning_receive(reader: InMemoryMetricReader, metrics_data: Any, *a: Any, **k: Any):
            scanner.scan_text(metrics_data.to_json(indent=None), "metrics")
            return receive(reader, metrics_data, *a, **k)

        self._patch(InMemoryMetricReader, "_receive_metrics", scanning_receive)

        aiohttp_read = aiohttp.ClientResponse.read

        async def scanning_aiohttp_read(response: aiohttp.ClientResponse) -> bytes:
            body = await aiohttp_read(response)
            if not response.url.path.startswith(_EXEMPT_RESPONSE_PATHS):
                scanner.scan_bytes(body, f"response to {response.method} {response.url.path}")
            return body

        self._patch(aiohttp.ClientResponse, "read", scanning_aiohttp_read)

        # The openai SDK reads its responses with httpx (or, in some builds, its fork httpx2).
        for module_name in ("httpx", "httpx2"):
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            self._hook_httpx(module.Response)

    def _hook_httpx(self, response_class: Any) -> None:
        scanner = self
        httpx_read, httpx_aread = response_class.read, response_class.aread

        def scan_httpx(response: Any, body: bytes) -> None:
            request = getattr(response, "_request", None)
            path = request.url.path if request is not None else ""
            if not path.startswith(_EXEMPT_RESPONSE_PATHS):
                scanner.scan_bytes(body, f"response to {path or 'an httpx request'}")

        def scanning_httpx_read(response: Any) -> bytes:
            body: bytes = httpx_read(response)
            scan_httpx(response, body)
            return body

        async def scanning_httpx_aread(response: Any) -> bytes:
            body: bytes = await httpx_aread(response)
            scan_httpx(response, body)
            return body

        self._patch(response_class, "read", scanning_httpx_read)
        self._patch(response_class, "aread", scanning_httpx_aread)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    @contextmanager
    def installed(self) -> Iterator[SecretScanner]:
        self.install()
        try:
            yield self
        finally:
            self.uninstall()
