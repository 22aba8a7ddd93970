"""An adapter for any OpenAI-compatible HTTP API (OpenAI, vLLM, Ollama, Groq, Venice, ...).

All provider I/O goes through one shared ``aiohttp.ClientSession`` and one retry loop; transport
exceptions are translated to gateway errors in ``_transport_errors`` and nowhere else.

A complete answer is read incrementally and given up once it passes ``max_response_bytes``, counted
after decompression, so neither a huge body nor a small compression bomb can exhaust memory. A
401/403 is the provider refusing the gateway's own key (the caller's is never forwarded): it
becomes a 502 ``upstream_auth_failed`` naming the provider, and the provider's body (which would
blame the caller's key) is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncGenerator, Iterator, Mapping
from urllib.parse import urlsplit

import aiohttp
from aiohttp import hdrs

from llmgw.errors import UpstreamAuthFailed, UpstreamTimeout, UpstreamUnavailable
from llmgw.provider_config import DEFAULT_CAPABILITIES, Capabilities
from llmgw.providers.base import UpstreamCall, UpstreamHTTPError, UpstreamResponse
from llmgw.providers.retry import RETRYABLE_STATUSES, RetryPolicy

__all__ = ["DEFAULT_MAX_RESPONSE_BYTES", "EXACT_TIMEOUTS", "OpenAICompatibleProvider"]

log = logging.getLogger(__name__)

_JSON = "application/json"
DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
_CREDENTIAL_REFUSALS = frozenset({401, 403})
_READ_CHUNK = 64 * 1024
# aiohttp rounds timeouts of 5 s and more up to the next whole second of loop time (uvloop's clock
# is in whole milliseconds, so 5.0 s left is exactly 5.0): a 5 s deadline became 6 s. No rounding.
EXACT_TIMEOUTS = math.inf
_UNBOUNDED = contextlib.nullcontext()


@contextlib.contextmanager
def _transport_errors(provider: str) -> Iterator[None]:
    try:
        yield
    except TimeoutError as exc:
        raise UpstreamTimeout(f"{provider} did not answer in time.") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamUnavailable(
            f"{provider} could not be reached ({type(exc).__name__})."
        ) from exc


async def _read_bounded(response: aiohttp.ClientResponse, limit: int, provider: str) -> bytes:
    """The (decompressed) body, or a 502 as soon as it grows past ``limit`` bytes."""
    declared = response.content_length
    if (
        declared is not None
        and declared <= limit
        and not response.headers.get(hdrs.CONTENT_ENCODING)
    ):
        # The usual answer: its length is declared and nothing is decompressed, so the body read
        # is exactly the bytes declared (aiohttp reads no further).
        return await response.read()
    chunks: list[bytes] = []
    size = 0
    if declared is None or declared <= limit:
        async for chunk in response.content.iter_chunked(_READ_CHUNK):
            size += len(chunk)
            if size > limit:
                break
            chunks.append(chunk)
        else:
            return b"".join(chunks)
    raise UpstreamUnavailable(
        f"{provider} answered with more than {limit} bytes (UPSTREAM_MAX_RESPONSE_BYTES).",
        code="upstream_response_too_large",
    )


def _answer(response: aiohttp.ClientResponse, body: bytes, retries: int) -> UpstreamResponse:
    return UpstreamResponse(
        status=response.status,
        body=body,
        content_type=response.headers.get("Content-Type", _JSON),
        retries=retries,
        retry_after=response.headers.get("Retry-After"),
    )


class _AiohttpChatStream:
    def __init__(self, response: aiohttp.ClientResponse, retries: int, provider: str) -> None:
        self._response = response
        self.retries = retries
        self._provider = provider
        self.content_type = response.headers.get("Content-Type", "")

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        content = self._response.content
        try:
            # readany() itself, not iter_any()'s iterator around it: one call less per read.
            while data := await content.readany():
                yield data
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{self._provider} stopped sending the stream and timed out; the stream was ended.",
                code="upstream_stream_timeout",
            ) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailable(
                f"{self._provider} broke off the stream before it was complete.",
                code="upstream_stream_interrupted",
            ) from exc

    async def close(self) -> None:
        # close(), not release(): an unfinished stream must not be drained to reuse the connection.
        self._response.close()


class OpenAICompatibleProvider:
    reports_cost = False

    def __init__(
        self,
        *,
        name: str,
        base_url: str,
        api_key: str | None,
        session: aiohttp.ClientSession,
        retry: RetryPolicy,
        idle_timeout: float,
        call_timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        speaks_responses: bool = False,
        capabilities: Capabilities = DEFAULT_CAPABILITIES["openai-compatible"],
    ) -> None:
        self.name = name
        self.speaks_responses = speaks_responses
        self.capabilities = capabilities
        self._max_response_bytes = max_response_bytes
        self._has_key = bool(api_key)
        self._base_url = base_url.rstrip("/")
        parts = urlsplit(self._base_url)
        self.server_address = parts.hostname or ""
        self.server_port = parts.port or (443 if parts.scheme == "https" else 80)
        self._session = session
        self._retry = retry
        self._idle_timeout = idle_timeout
        # A provider's own bound on a call, within the request's deadline (a fallback's chance).
        self._call_timeout = call_timeout
        self._auth_headers: Mapping[str, str] = {
            **(headers or {}),
            **({"Authorization": f"Bearer {api_key}"} if api_key else {}),
        }

    async def close(self) -> None:
        await self._session.close()

    def _deadline(self, deadline: float) -> float:
        if self._call_timeout is None:
            return deadline
        return min(deadline, asyncio.get_running_loop().time() + self._call_timeout)

    def _headers(self, call: UpstreamCall, accept: str) -> dict[str, str]:
        # Built afresh: nothing the client sent (its Authorization above all) is forwarded.
        return {
            **self._auth_headers,
            "Content-Type": call.content_type,
            "Accept": accept,
            **call.trace_headers,
        }

    async def _post_with_retries(
        self, path: str, call: UpstreamCall, *, accept: str, streaming: bool
    ) -> tuple[aiohttp.ClientResponse, int]:
        """POST until a non-retryable answer or the retries run out; the response is left unread."""
        loop = asyncio.get_running_loop()
        url = self._base_url + path
        headers = self._headers(call, accept)
        deadline = self._deadline(call.deadline)
        retries = 0
        while True:
            remaining = max(deadline - loop.time(), 0.001)
            # A stream's body may outlive the deadline (each read is bounded by the idle timeout);
            # its connect and answer head may not, whichever attempt it is.
            timeout = aiohttp.ClientTimeout(
                total=None if streaming else remaining,
                sock_read=self._idle_timeout if streaming else None,
                ceil_threshold=EXACT_TIMEOUTS,
            )
            try:
                with _transport_errors(self.name):
                    # Without a stream, the ClientTimeout's total bounds it all, head and body.
                    async with asyncio.timeout(remaining) if streaming else _UNBOUNDED:
                        response = await self._session.post(
                            url, data=call.body, headers=headers, timeout=timeout
                        )
            except (UpstreamUnavailable, UpstreamTimeout):
                wait = self._retry.delay(retries, deadline - loop.time(), headers={})
                if wait is None:
                    raise
            else:
                if response.status not in RETRYABLE_STATUSES:
                    return response, retries
                wait = self._retry.delay(
                    retries,
                    deadline - loop.time(),
                    status=response.status,
                    headers=response.headers,
                )
                if wait is None:
                    return response, retries
                response.release()
            await asyncio.sleep(wait)
            retries += 1

    async def _read_answer(
        self, response: aiohttp.ClientResponse, retries: int
    ) -> UpstreamResponse:
        """Read and release ``response``; raise for anything but a success."""
        try:
            self._check_credentials_accepted(response.status)
            with _transport_errors(self.name):
                body = await _read_bounded(response, self._max_response_bytes, self.name)
        finally:
            response.release()  # a connection with an unread remainder is closed, not reused
        result = _answer(response, body, retries)
        if response.status >= 300:
            raise UpstreamHTTPError(result)
        return result

    def _check_credentials_accepted(self, status: int) -> None:
        if status not in _CREDENTIAL_REFUSALS:
            return
        # Only the gateway's own credentials reach the provider, so this is never the caller's
        # fault; a keyless provider (a local Ollama) that wants one is the same configuration gap.
        whose = "refused the gateway's API key" if self._has_key else "requires an API key"
        log.warning("provider %s %s (HTTP %d); check its configured key", self.name, whose, status)
        raise UpstreamAuthFailed(
            f"The provider {self.name} {whose} (HTTP {status}). This is the gateway's "
            "configuration, not your key; tell the gateway's operator."
        )

    async def _complete(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        response, retries = await self._post_with_retries(path, call, accept=_JSON, streaming=False)
        return await self._read_answer(response, retries)

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        return await self._complete("/chat/completions", call)

    async def embeddings(self, call: UpstreamCall) -> UpstreamResponse:
        return await self._complete("/embeddings", call)

    async def forward(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        return await self._complete(path, call)

    async def stream_chat_completion(self, call: UpstreamCall) -> _AiohttpChatStream:
        return await self.forward_stream("/chat/completions", call, accept="text/event-stream")

    async def forward_stream(
        self, path: str, call: UpstreamCall, *, accept: str
    ) -> _AiohttpChatStream:
        response, retries = await self._post_with_retries(path, call, accept=accept, streaming=True)
        if response.status != 200:
            raise UpstreamHTTPError(await self._read_answer(response, retries))
        return _AiohttpChatStream(response, retries, self.name)

    async def list_models(self, deadline: float) -> UpstreamResponse:
        loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(
            total=max(self._deadline(deadline) - loop.time(), 0.001), ceil_threshold=EXACT_TIMEOUTS
        )
        with _transport_errors(self.name):
            response = await self._session.get(
                self._base_url + "/models", headers=dict(self._auth_headers), timeout=timeout
            )
        return await self._read_answer(response, retries=0)
