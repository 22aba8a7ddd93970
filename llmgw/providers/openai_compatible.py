"""An adapter for any OpenAI-compatible HTTP API (OpenAI, vLLM, Ollama, Groq, Venice, ...).

All provider I/O goes through one shared ``aiohttp.ClientSession`` and one retry loop; transport
exceptions are translated to gateway errors in ``_TransportErrors`` and nowhere else.

A complete answer is read incrementally and given up once it passes ``max_response_bytes``, counted
after decompression, so neither a huge body nor a small compression bomb can exhaust memory. A
401/403 is the provider refusing the gateway's own key (the caller's is never forwarded): it
becomes a 502 ``upstream_auth_failed`` naming the provider, and the provider's body (which would
blame the caller's key) is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncGenerator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlsplit

import aiohttp
from aiohttp import hdrs
from aiohttp.typedefs import StrOrURL

from llmgw.config.common import DEFAULT_MAX_CONNECTIONS
from llmgw.errors import UpstreamAuthFailed, UpstreamTimeout, UpstreamUnavailable
from llmgw.providers.base import (
    ChatStream,
    Failure,
    Retries,
    UpstreamCall,
    UpstreamHTTPError,
    UpstreamResponse,
    UpstreamStream,
)
from llmgw.providers.plugin import Capabilities, NoOptions, ProviderPlugin, ProviderSetup, Timeouts
from llmgw.providers.pool import ConnectionPool, Slot

if TYPE_CHECKING:
    from llmgw.accounting.price import Price
    from llmgw.accounting.usage import CostReport

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "EXACT_TIMEOUTS",
    "OPENAI_COMPATIBLE_CAPABILITIES",
    "PLUGIN",
    "OpenAICompatibleProvider",
    "new_client_session",
]

log = logging.getLogger(__name__)

_JSON = "application/json"
DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
_CREDENTIAL_REFUSALS = frozenset({401, 403})
_READ_CHUNK = 64 * 1024
# aiohttp rounds timeouts of 5 s and more up to the next whole second of loop time (uvloop's clock
# is in whole milliseconds, so 5.0 s left is exactly 5.0): a 5 s deadline became 6 s. No rounding.
EXACT_TIMEOUTS = math.inf

# An OpenAI-compatible server may not take reasoning_effort: OpenAI refuses it for non-reasoning
# models, vLLM and LiteLLM for many, with a 400 on every request; so it is sent only when declared.
# Prefill is off: OpenAI and Azure answer a trailing assistant message with a new turn, and vLLM
# and Ollama continue it only for some models or templates (shared/provider-failures.md F3).
OPENAI_COMPATIBLE_CAPABILITIES = Capabilities(reasoning=False, prefill=False)


def new_client_session(max_connections: int = DEFAULT_MAX_CONNECTIONS) -> aiohttp.ClientSession:
    """The one shared session of a provider: pooled keep-alive connections, no cookie jar.

    Its limit is the provider's ``ConnectionPool``'s, whose slots every call holds first, so
    the connector never queues a request itself (where the wait would be silent and unbounded).
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=max_connections,
            ttl_dns_cache=300,
            enable_cleanup_closed=True,
            timeout_ceil_threshold=EXACT_TIMEOUTS,
        ),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


class _TransportErrors:
    """The client's transport failures as the gateway's errors, naming the provider. A class,
    not a generator: one is entered on every call, and a generator's context manager costs three
    times the calls."""

    def __init__(self, provider: str) -> None:
        self._provider = provider

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            return
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            raise UpstreamTimeout(f"{self._provider} could not be connected to in time.") from exc
        if isinstance(exc, TimeoutError):
            raise UpstreamTimeout(f"{self._provider} did not answer in time.") from exc
        if isinstance(exc, aiohttp.ClientError):
            raise UpstreamUnavailable(
                f"{self._provider} could not be reached ({type(exc).__name__})."
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
    """A 200 stream whose first read (``first``) came while the route could still move on.

    A read that waits longer than the stall timeout ends the stream. One timer per stream checks
    it (at most once per stall timeout) rather than a timer per read: a stream makes hundreds of
    reads, and only the waiting counts, not the time the caller takes between reads.
    """

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        retries: int,
        provider: str,
        *,
        first: bytes,
        stall_timeout: float,
        slot: Slot,
    ) -> None:
        self._response = response
        self._slot = slot
        self.retries = retries
        self._provider = provider
        self._first = first
        self._stall_timeout = stall_timeout
        self._waiting_since: float | None = None  # loop time the pending read began
        self._stalled = False
        self._watchdog: asyncio.TimerHandle | None = None
        self.content_type = response.headers.get("Content-Type", "")

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        loop = asyncio.get_running_loop()
        content = self._response.content
        data = self._first
        self._watchdog = loop.call_at(loop.time() + self._stall_timeout, self._watch, loop)
        try:
            while data:
                yield data
                self._waiting_since = loop.time()
                # readany() itself, not iter_any()'s iterator around it: one call less per read.
                data = await content.readany()
                self._waiting_since = None
        except aiohttp.ClientError as exc:
            if self._stalled:
                raise self._stall_error() from exc
            raise UpstreamUnavailable(
                f"{self._provider} broke off the stream before it was complete.",
                code="upstream_stream_interrupted",
            ) from exc
        finally:
            self._watchdog.cancel()
        if self._stalled:
            raise self._stall_error()

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        since = self._waiting_since
        now = loop.time()
        if since is not None and now - since >= self._stall_timeout:
            self._stalled = True
            self._response.close()  # the pending read raises at once
            return
        self._watchdog = loop.call_at(
            (now if since is None else since) + self._stall_timeout, self._watch, loop
        )

    def _stall_error(self) -> UpstreamTimeout:
        return UpstreamTimeout(
            f"{self._provider} stopped sending the stream and timed out; the stream was ended.",
            code="upstream_stream_timeout",
        )

    async def close(self) -> None:
        # close(), not release(): an unfinished stream must not be drained to reuse the connection.
        self._response.close()
        self._slot.release()


class OpenAICompatibleProvider:
    cost_report: CostReport | None = None
    publishes_prices = False

    def __init__(
        self,
        *,
        name: str,
        base_url: str,
        api_key: str | None,
        session: aiohttp.ClientSession,
        retry: Retries,
        timeouts: Timeouts,
        headers: Mapping[str, str] | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        capabilities: Capabilities = OPENAI_COMPATIBLE_CAPABILITIES,
        connections: ConnectionPool | None = None,
    ) -> None:
        self.name = name
        self._transport_errors = _TransportErrors(name)
        # Every call holds a slot for as long as its connection (see providers.pool).
        self.connections = connections or ConnectionPool(name, DEFAULT_MAX_CONNECTIONS)
        self.capabilities = capabilities
        self._max_response_bytes = max_response_bytes
        self._has_key = bool(api_key)
        self._base_url = base_url.rstrip("/")
        parts = urlsplit(self._base_url)
        self.server_address = parts.hostname or ""
        self.server_port = parts.port or (443 if parts.scheme == "https" else 80)
        self._session = session
        self._retry = retry
        self._timeouts = timeouts
        self._auth_headers: Mapping[str, str] = {
            **(headers or {}),
            **(self._credentials(api_key) if api_key else {}),
        }

    def _credentials(self, api_key: str) -> Mapping[str, str]:
        """The headers carrying the gateway's key (an adapter whose API wants another one overrides)."""
        return {"Authorization": f"Bearer {api_key}"}

    def _url(self, path: str, model: str | None) -> str:
        """Where an operation (``/chat/completions``) for ``model`` is sent: the API's path under
        ``base_url`` (an adapter whose API puts the model in the URL overrides)."""
        return self._base_url + path

    @classmethod
    def from_setup(cls, setup: ProviderSetup[Any], **kind_options: Any) -> Self:
        """The provider of a ``[[providers]]`` entry: the factory of its kind's plugin (a kind with
        keys of its own passes them on as ``kind_options``, its class's extra arguments)."""
        return cls(
            name=setup.name,
            base_url=setup.base_url,
            api_key=setup.api_key,
            session=new_client_session(setup.max_connections),
            retry=setup.retry,
            timeouts=setup.timeouts,
            headers=setup.headers,
            max_response_bytes=setup.max_response_bytes,
            capabilities=setup.capabilities,
            connections=ConnectionPool(setup.name, setup.max_connections),
            **kind_options,
        )

    async def close(self) -> None:
        await self._session.close()

    async def published_prices(self, deadline: float) -> Mapping[str, Price]:
        return {}  # an OpenAI-compatible listing has no prices (publishes_prices is False)

    def _headers(self, call: UpstreamCall, accept: str) -> dict[str, str]:
        # Built afresh: nothing the client sent (its Authorization above all) is forwarded.
        return {
            **self._auth_headers,
            "Content-Type": call.content_type,
            "Accept": accept,
            **call.trace_headers,
        }

    async def _post(
        self, path: str, call: UpstreamCall, *, accept: str, streaming: bool
    ) -> tuple[aiohttp.ClientResponse, int, bytes]:
        """POST until there is an answer to relay, retrying as ``Retries.decide`` says.

        Returns the success left unread (but for a stream's first read, returned with it) and
        the retries it took. Raises the last failure: an error answer as UpstreamHTTPError with
        its decision, silence as UpstreamTimeout, a broken connection as UpstreamUnavailable.
        """
        loop = asyncio.get_running_loop()
        url = self._url(path, call.model)
        headers = self._headers(call, accept)
        answer_by = call.deadline if call.answer_by is None else min(call.deadline, call.answer_by)
        retries = 0
        while True:
            error: UpstreamTimeout | UpstreamUnavailable | UpstreamHTTPError
            try:
                response, first = await self._attempt(url, call, headers, answer_by, streaming)
                if response.status == 401 and self._renews_refused_credentials:
                    response.release()
                    response, first = await self._attempt(
                        url, call, headers, answer_by, streaming, renew=True
                    )
            except UpstreamTimeout as exc:
                failure, error = Failure(silent=True), exc
            except UpstreamUnavailable as exc:
                if isinstance(exc, UpstreamAuthFailed):
                    raise
                failure, error = Failure(), exc
            else:
                if response.status == 200 or (not streaming and response.status < 300):
                    return response, retries, first
                with self._transport_errors:
                    # An error answer's body is bounded by the request's deadline, stream or not.
                    async with asyncio.timeout_at(call.deadline):
                        answer = await self._read_answer(response, retries)
                failure = Failure(response.status, response.headers, answer.body)
                error = UpstreamHTTPError(answer)
            decision = self._retry.decide(
                failure,
                retries=retries,
                remaining=answer_by - loop.time(),
                now=time.time(),
                max_retries=call.max_retries,
            )
            if decision.action != "retry":
                if isinstance(error, UpstreamHTTPError):
                    error.decision = decision
                raise error
            log.info(
                "provider %s: %s, retry %d in %.2f s",
                self.name,
                decision.reason,
                retries + 1,
                decision.wait,
            )
            await asyncio.sleep(decision.wait)
            retries += 1

    async def _authorize(
        self, url: StrOrURL, call: UpstreamCall, headers: Mapping[str, str], *, renew: bool
    ) -> tuple[StrOrURL, Mapping[str, str]]:
        """The URL and headers one attempt sends. Here as built (the key is in the headers); a
        cloud's adapter signs each attempt or adds a token, a new one when ``renew`` (the one
        sent was refused with a 401, see ``_renews_refused_credentials``)."""
        return url, headers

    # Whether a 401 is answered by new credentials and the attempt made once more (a token
    # refused before its expiry), rather than reported as the gateway's credentials refused.
    _renews_refused_credentials = False

    async def _attempt(
        self,
        url: StrOrURL,
        call: UpstreamCall,
        headers: Mapping[str, str],
        answer_by: float,
        streaming: bool,
        *,
        renew: bool = False,
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        """One POST, authorized (``renew``: with new credentials): connected within the connect
        timeout, the answer's head (and a stream's first read) within the first-token timeout, a
        whole JSON answer within the attempt's."""
        url, headers = await self._authorize(url, call, headers, renew=renew)
        loop = asyncio.get_running_loop()
        now = loop.time()
        timeouts = self._timeouts
        end = min(call.deadline, now + timeouts.attempt)
        first_byte_by = min(end, answer_by, now + timeouts.first_token)
        timeout = aiohttp.ClientTimeout(
            # A stream's body may outlive the attempt: each read is bounded by the stall timeout.
            total=None if streaming else max(end - now, 0.001),
            sock_connect=timeouts.connect,
            ceil_threshold=EXACT_TIMEOUTS,
        )
        with self._transport_errors:
            async with asyncio.timeout_at(first_byte_by):
                response = await self._session.post(
                    url, data=call.body, headers=headers, timeout=timeout
                )
            if not streaming or response.status != 200:
                return response, b""
            try:
                async with asyncio.timeout_at(first_byte_by):
                    return response, await response.content.readany()
            except BaseException:
                response.close()
                raise

    async def _read_answer(
        self, response: aiohttp.ClientResponse, retries: int
    ) -> UpstreamResponse:
        """Read and release ``response``, whatever its status (the gateway's key refused raises)."""
        try:
            self._check_credentials_accepted(response.status)
            with self._transport_errors:
                body = await _read_bounded(response, self._max_response_bytes, self.name)
        finally:
            response.release()  # a connection with an unread remainder is closed, not reused
        answer = _answer(response, body, retries)
        return answer if answer.status < 300 else self._openai_error(answer, response.headers)

    def _openai_error(
        self, answer: UpstreamResponse, headers: Mapping[str, str]
    ) -> UpstreamResponse:
        """An error answer in OpenAI's shape, which the routing reads and a chat caller gets:
        here as sent; an adapter for another API translates its own."""
        return answer

    def _check_credentials_accepted(self, status: int) -> None:
        if status not in _CREDENTIAL_REFUSALS:
            return
        # Only the gateway's own credentials reach the provider, so this is never the caller's
        # fault; a keyless provider (a local Ollama) that wants one is the same configuration gap.
        whose = "refused the gateway's API key" if self._has_key else "requires an API key"
        log.warning("provider %s %s (HTTP %d); check its configured key", self.name, whose, status)
        raise UpstreamAuthFailed.gateway_credentials(self.name, f"{whose} (HTTP {status})")

    async def _complete(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        slot = await self.connections.acquire(call.deadline)
        try:
            response, retries, _ = await self._post(path, call, accept=_JSON, streaming=False)
            return await self._read_answer(response, retries)
        finally:
            slot.release()

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        return await self._complete("/chat/completions", call)

    async def embeddings(self, call: UpstreamCall) -> UpstreamResponse:
        return await self._complete("/embeddings", call)

    async def forward(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        return await self._complete(path, call)

    async def stream_chat_completion(self, call: UpstreamCall) -> ChatStream:
        return await self.forward_stream("/chat/completions", call, accept="text/event-stream")

    async def forward_stream(self, path: str, call: UpstreamCall, *, accept: str) -> UpstreamStream:
        slot = await self.connections.acquire(call.deadline)
        try:
            response, retries, first = await self._post(path, call, accept=accept, streaming=True)
        except BaseException:
            slot.release()
            raise
        return _AiohttpChatStream(  # the slot is released by its close
            response, retries, self.name, first=first, stall_timeout=self._timeouts.stall, slot=slot
        )

    async def list_models(self, deadline: float) -> UpstreamResponse:
        loop = asyncio.get_running_loop()
        end = min(deadline, loop.time() + self._timeouts.attempt)
        timeout = aiohttp.ClientTimeout(
            total=max(end - loop.time(), 0.001),
            sock_connect=self._timeouts.connect,
            ceil_threshold=EXACT_TIMEOUTS,
        )
        slot = await self.connections.acquire(end)
        try:
            with self._transport_errors:
                response = await self._session.get(
                    self._url("/models", None), headers=dict(self._auth_headers), timeout=timeout
                )
            answer = await self._read_answer(response, retries=0)
        finally:
            slot.release()
        if answer.status >= 300:
            raise UpstreamHTTPError(answer)
        return answer


PLUGIN: ProviderPlugin[NoOptions] = ProviderPlugin(
    factory=OpenAICompatibleProvider.from_setup,
    capabilities=OPENAI_COMPATIBLE_CAPABILITIES,
    summary="any OpenAI-compatible API: OpenAI, Gemini's OpenAI endpoint, vLLM, Ollama, Groq",
)
