"""A route: deployments tried in order, each after the one before failed in a way another may not.

A ``FallbackChain`` is itself a :class:`Provider`, so handlers call it like any adapter. The routing
policy (``llmgw.routing``) says in which order its deployments are tried (their health, the alias's
strategy) and is told how each attempt went. Each deployment is sent its own model id, without the parameters its provider does not accept (its
``Capabilities``), and retries as ``retry.decide`` says, but only when it is the last deployment
left (a probe never: see routing.breaker); when that says "move on" (overload past its
retries, a rate limit longer than the budget, a context window too small, silence) or the provider
cannot be reached, the next one is tried. Any other answer (a 400, a 404, a success) is final.
A deployment whose provider is at its account cap (``rpm`` / ``tpm``) is moved on from as from a
429, without being sent anything; when every one is, the caller gets a 429 with Retry-After.

Within one request a provider that stayed silent is not asked again, nor a model whose context
window the request exceeded; and every deployment but the last must begin to answer within an even
share of the time left, so a silent one never uses up the budget of those after it. A stream falls
back only while it is being opened (up to its first event); one that breaks after a byte reached
the client is finished on ``after`` (streaming.continuation).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Generic, TypeVar

import attrs

from llmgw.config.kinds import Capabilities
from llmgw.config.providers_file import ORDERED, Strategy
from llmgw.errors import GatewayError, RateLimited, UpstreamTimeout, UpstreamUnavailable
from llmgw.limits.caps import CapHold, CapTaker
from llmgw.providers.base import (
    ChatStream,
    Deployment,
    Provider,
    UpstreamCall,
    UpstreamHTTPError,
    UpstreamResponse,
    UpstreamStream,
)
from llmgw.routing.policy import RoutingPolicy
from llmgw.routing.retry import CONTEXT_TOO_LONG, SILENT

__all__ = ["Answer", "FallbackChain"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@attrs.frozen(slots=True)
class Answer(Generic[T]):
    """What a route's call came back with: the deployment that answered, after how many tried
    (this one included), and its result (a response or an open stream, each with its retries)."""

    deployment: Deployment
    tries: int
    result: T
    omitted: tuple[str, ...] = ()  # parameters that deployment was sent without (capabilities)
    cap: CapHold | None = None  # its provider's account caps counted it: settle at what it used
    # Call once the answer has been relayed (with a stream's seconds from its headers to its first
    # event, if it had one): the deployment stops counting it in flight, and is timed.
    done: Callable[[float | None], None] = attrs.field(default=lambda _: None, eq=False)


class FallbackChain:
    """Until a deployment answers, it speaks for the first one (name, address, cost reporting)."""

    def __init__(
        self,
        deployments: Sequence[Deployment],
        *,
        routing: RoutingPolicy | None = None,
        strategy: Strategy = ORDERED,
    ) -> None:
        if not deployments:
            raise ValueError("a route needs at least one deployment")
        self.deployments = tuple(deployments)
        self.routing = routing or RoutingPolicy()
        self.strategy = strategy
        first = self.deployments[0].provider
        self.name = first.name
        self.server_address = first.server_address
        self.server_port = first.server_port
        self.cost_report = first.cost_report
        # Each deployment is sent only what it accepts (``UpstreamCall.for_deployment``); native
        # Responses or Messages only when every deployment is: a fallback must take the same body.
        self.capabilities = Capabilities.common_to(
            d.provider.capabilities for d in self.deployments
        )

    def after(self, deployment: Deployment, tried: Collection[str] = ()) -> FallbackChain | None:
        """Where the answer a stream of ``deployment`` broke off is finished: the deployments
        after it, round the route, that the request has not been sent to yet (``tried``: their
        labels); ``deployment`` itself again only when it is the route's only one (issue 34,
        item 5: never back to one that broke while another is left). None: none is left."""
        index = self.deployments.index(deployment) + 1
        left = [
            d
            for d in self.deployments[index:] + self.deployments[:index]
            if d is not deployment and d.label not in tried
        ]
        if len(self.deployments) == 1:
            left = [deployment]
        return FallbackChain(left, routing=self.routing) if left else None

    async def first_answer(
        self, call: UpstreamCall, attempt: Callable[[Provider, UpstreamCall], Awaitable[T]]
    ) -> Answer[T]:
        """``attempt`` on each deployment in the policy's order until one answers, or the last one
        worth trying fails (its failure is raised); the policy is told each attempt's outcome."""
        loop = asyncio.get_running_loop()
        left = self.routing.plan(self.deployments, self.strategy)
        tried = 0
        failure: BaseException | None = None  # the last attempt's, when only capped ones followed
        capped_for: float | None = None  # the soonest a capped provider takes requests again
        while left:
            deployment, *left = left
            sent, omitted = call.for_deployment(deployment)
            # A probe is claimed only when another deployment is left: with none, the request
            # goes to it all the same, as when every deployment is open.
            if left and not await self.routing.claim(deployment):
                continue  # another replica is probing it
            cap = self.routing.caps.of(deployment.provider.name)
            hold = None
            admission = call.admission
            if cap is not None and admission is not None:
                # What the pipeline hands in is the request's ticket; adapters never see its type.
                assert isinstance(admission, CapTaker)
                try:
                    taken = await admission.take_cap(deployment.provider.name, cap, sent.body)
                except BaseException:
                    self.routing.not_sent(deployment)
                    raise
                if isinstance(taken, CapHold):
                    hold = taken
                else:
                    wait = taken
                    self.routing.not_sent(deployment)  # no failure of the deployment's
                    capped_for = wait if capped_for is None else min(capped_for, wait)
                    log.info(
                        "deployment %s skipped: its provider is at its account cap for %.0f s; %s",
                        deployment.label,
                        wait,
                        f"moving on to {left[0].label}" if left else "no deployment left to try",
                    )
                    continue
            tried += 1
            if call.on_deployment is not None:
                call.on_deployment(deployment, tried)
            if left:
                now = loop.time()
                share = (call.deadline - now) / (len(left) + 1)
                sent = attrs.evolve(sent, answer_by=now + share)
            outcome = self.routing.attempt(deployment, call.caller)
            if left or outcome.once:
                # Another deployment answers sooner than a retry of a failing one; one that was
                # down is asked once (issue 29, item 6).
                sent = attrs.evolve(sent, max_retries=0)
            try:
                result = await attempt(deployment.provider, sent)
            except UpstreamHTTPError as exc:
                decision = exc.decision
                outcome.refused(exc.response, decision)
                if call.on_failure is not None:
                    call.on_failure(deployment, str(exc.response.status), exc.response.status)
                if decision is None or decision.action != "move_on":
                    raise
                left = self._still_worth_trying(left, deployment, decision.reason)
                if not left:
                    raise
                failure = exc
            except (UpstreamUnavailable, UpstreamTimeout) as exc:
                outcome.unanswered(exc)
                if call.on_failure is not None:
                    call.on_failure(deployment, exc.error_kind, None)
                reason = SILENT if isinstance(exc, UpstreamTimeout) else exc.code or "unavailable"
                left = self._still_worth_trying(left, deployment, reason)
                if not left:
                    raise
                failure = exc
            except BaseException as exc:
                outcome.abandoned()
                if call.on_failure is not None:
                    kind = exc.error_kind if isinstance(exc, GatewayError) else "abandoned"
                    call.on_failure(deployment, kind, None)
                raise
            else:
                outcome.answered()
                return Answer(deployment, tried, result, omitted, hold, outcome.done)
        # Every deployment left was at its provider's cap.
        if failure is not None:
            raise failure  # what the last one sent to said: the caller's truest answer
        assert capped_for is not None
        retry_after = max(1, math.ceil(capped_for))
        raise RateLimited(
            f"Every deployment of model {call.model or self.deployments[0].model!r} is at its "
            f"provider's account limit (rpm / tpm set by the operator); retry in {retry_after}s.",
            code="provider_capacity_exceeded",
            headers={"Retry-After": str(retry_after)},
        )

    @staticmethod
    def _still_worth_trying(
        left: list[Deployment], failed: Deployment, reason: str
    ) -> list[Deployment]:
        """The deployments after ``failed`` that may still answer: not its provider when it was
        silent (a silent provider stays silent), not its model when the request is too long for
        it (the same model has the same window)."""
        if reason == SILENT:
            left = [d for d in left if d.provider is not failed.provider]
        elif reason == CONTEXT_TOO_LONG:
            left = [d for d in left if d.model != failed.model]
        log.info(
            "deployment %s failed (%s); %s",
            failed.label,
            reason,
            f"moving on to {left[0].label}" if left else "no deployment left to try",
        )
        return left

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
