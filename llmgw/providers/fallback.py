"""A route: deployments tried in order, each after the one before failed in a retryable way.

A ``FallbackChain`` is itself a :class:`Provider`, so handlers call it like any adapter. Each
deployment is sent its own model id, without the parameters its provider does not accept (its
``Capabilities``), and retries as it always does; when it still ends in a retryable
status (``RETRYABLE_STATUSES``) or cannot be reached or times out, the next one is tried. Any other
answer (a 400, a 404, a success) is final. A stream falls back only while it is being opened; one
that breaks after a byte reached the client is finished on ``after`` (streaming.continuation).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import attrs

from llmgw.errors import UpstreamTimeout, UpstreamUnavailable
from llmgw.provider_config import Capabilities
from llmgw.providers.base import (
    ChatStream,
    Deployment,
    Provider,
    UpstreamCall,
    UpstreamHTTPError,
    UpstreamResponse,
    UpstreamStream,
)
from llmgw.providers.retry import RETRYABLE_STATUSES

__all__ = ["Answer", "FallbackChain"]

T = TypeVar("T")


@attrs.frozen(slots=True)
class Answer(Generic[T]):
    """What a route's call came back with: the deployment that answered, after how many tried
    (this one included), and its result (a response or an open stream, each with its retries)."""

    deployment: Deployment
    tries: int
    result: T
    omitted: tuple[str, ...] = ()  # parameters that deployment was sent without (capabilities)


class FallbackChain:
    """Until a deployment answers, it speaks for the first one (name, address, cost reporting)."""

    def __init__(self, deployments: Sequence[Deployment]) -> None:
        if not deployments:
            raise ValueError("a route needs at least one deployment")
        self.deployments = tuple(deployments)
        first = self.deployments[0].provider
        self.name = first.name
        self.server_address = first.server_address
        self.server_port = first.server_port
        self.reports_cost = first.reports_cost
        # Native only when every deployment is: a fallback must be able to take the same body.
        self.speaks_responses = all(d.provider.speaks_responses for d in self.deployments)
        # Each deployment is sent only what it accepts (``UpstreamCall.for_deployment``).
        self.capabilities = Capabilities.common_to(
            d.provider.capabilities for d in self.deployments
        )

    def after(self, deployment: Deployment) -> FallbackChain:
        """The route from the deployment after ``deployment``, round to it last: where the answer
        a stream of it broke off is finished (on it again only when no other will)."""
        index = self.deployments.index(deployment) + 1
        return FallbackChain(self.deployments[index:] + self.deployments[:index])

    async def first_answer(
        self, call: UpstreamCall, attempt: Callable[[Provider, UpstreamCall], Awaitable[T]]
    ) -> Answer[T]:
        """``attempt`` on each deployment in turn until one answers (or the last one fails)."""
        last = len(self.deployments)
        for tried, deployment in enumerate(self.deployments, start=1):
            if call.on_deployment is not None:
                call.on_deployment(deployment, tried)
            sent, omitted = call.for_deployment(deployment)
            try:
                result = await attempt(deployment.provider, sent)
                return Answer(deployment, tried, result, omitted)
            except UpstreamHTTPError as exc:
                if tried == last or exc.response.status not in RETRYABLE_STATUSES:
                    raise
            except (UpstreamUnavailable, UpstreamTimeout):
                if tried == last:
                    raise
        raise AssertionError("unreachable: the last deployment returns or raises")

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        return (await self.first_answer(call, lambda p, c: p.chat_completion(c))).result

    async def stream_chat_completion(self, call: UpstreamCall) -> ChatStream:
        return (await self.first_answer(call, lambda p, c: p.stream_chat_completion(c))).result

    async def embeddings(self, call: UpstreamCall) -> UpstreamResponse:
        return (await self.first_answer(call, lambda p, c: p.embeddings(c))).result

    async def forward(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        return (await self.first_answer(call, lambda p, c: p.forward(path, c))).result

    async def forward_stream(self, path: str, call: UpstreamCall, *, accept: str) -> UpstreamStream:
        answer = await self.first_answer(
            call, lambda p, c: p.forward_stream(path, c, accept=accept)
        )
        return answer.result

    async def list_models(self, deadline: float) -> UpstreamResponse:
        return await self.deployments[0].provider.list_models(deadline)

    async def close(self) -> None:
        """Nothing to release: the registry owns and closes the providers."""
