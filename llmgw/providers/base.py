"""The contract every provider adapter implements, and the values that cross it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import attrs

__all__ = ["ChatStream", "Provider", "UpstreamCall", "UpstreamHTTPError", "UpstreamResponse"]


@attrs.frozen(slots=True)
class UpstreamCall:
    """One upstream operation: the JSON body to send and the limits it runs under."""

    body: bytes
    deadline: float  # event-loop time by which the whole call, retries included, must be answered
    trace_headers: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen(slots=True)
class UpstreamResponse:
    """A complete upstream answer (any status): forwarded to the client byte for byte."""

    status: int
    body: bytes
    content_type: str
    retries: int = 0


class UpstreamHTTPError(Exception):
    """The provider answered with an error status; the client gets that status and body as they are."""

    def __init__(self, response: UpstreamResponse) -> None:
        super().__init__(f"upstream answered {response.status}")
        self.response = response


class ChatStream(Protocol):
    """An open 200 event stream from the provider; close() releases the connection at once."""

    retries: int

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def close(self) -> None: ...


class Provider(Protocol):
    name: str
    server_address: str
    server_port: int
    reports_cost: bool

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        """A non-streamed completion. Raises UpstreamHTTPError for a non-2xx answer after retries."""
        ...

    async def stream_chat_completion(self, call: UpstreamCall) -> ChatStream:
        """Open a streamed completion; retries happen only here, before any byte is returned."""
        ...

    async def embeddings(self, call: UpstreamCall) -> UpstreamResponse: ...

    async def list_models(self, deadline: float) -> UpstreamResponse: ...

    async def close(self) -> None: ...
