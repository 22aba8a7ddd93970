"""An adapter for any OpenAI-compatible HTTP API (OpenAI, vLLM, Ollama, Groq, Venice, ...).

All provider I/O goes through one shared ``aiohttp.ClientSession`` and one retry loop; transport
exceptions are translated to gateway errors in ``_transport_errors`` and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Iterator, Mapping
from urllib.parse import urlsplit

import aiohttp

from llmgw.errors import UpstreamTimeout, UpstreamUnavailable
from llmgw.providers.base import UpstreamCall, UpstreamHTTPError, UpstreamResponse
from llmgw.providers.retry import RETRYABLE_STATUSES, RetryPolicy

__all__ = ["EXACT_TIMEOUTS", "OpenAICompatibleProvider"]

_JSON = "application/json"
# aiohttp rounds timeouts of 5 s and more up to the next whole second of loop time (uvloop's clock
# is in whole milliseconds, so 5.0 s left is exactly 5.0): a 5 s deadline became 6 s. No rounding.
EXACT_TIMEOUTS = math.inf


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

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._response.content.iter_any():
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
    ) -> None:
        self.name = name
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
            "Content-Type": _JSON,
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
                    async with asyncio.timeout(remaining):
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

    async def _complete(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        response, retries = await self._post_with_retries(path, call, accept=_JSON, streaming=False)
        try:
            with _transport_errors(self.name):
                body = await response.read()
        finally:
            response.release()
        result = _answer(response, body, retries)
        if response.status >= 300:
            raise UpstreamHTTPError(result)
        return result

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        return await self._complete("/chat/completions", call)

    async def embeddings(self, call: UpstreamCall) -> UpstreamResponse:
        return await self._complete("/embeddings", call)

    async def stream_chat_completion(self, call: UpstreamCall) -> _AiohttpChatStream:
        response, retries = await self._post_with_retries(
            "/chat/completions", call, accept="text/event-stream", streaming=True
        )
        if response.status != 200:
            try:
                with _transport_errors(self.name):
                    body = await response.read()
            finally:
                response.release()
            raise UpstreamHTTPError(_answer(response, body, retries))
        return _AiohttpChatStream(response, retries, self.name)

    async def list_models(self, deadline: float) -> UpstreamResponse:
        loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(
            total=max(self._deadline(deadline) - loop.time(), 0.001), ceil_threshold=EXACT_TIMEOUTS
        )
        with _transport_errors(self.name):
            async with self._session.get(
                self._base_url + "/models", headers=dict(self._auth_headers), timeout=timeout
            ) as response:
                body = await response.read()
        result = _answer(response, body, retries=0)
        if response.status >= 300:
            raise UpstreamHTTPError(result)
        return result
