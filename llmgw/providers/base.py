"""The contract every provider adapter implements, and the values that cross it."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Literal, Protocol

import attrs
import orjson

from llmgw.config.kinds import Capabilities

if TYPE_CHECKING:
    from llmgw.accounting.price import Price
    from llmgw.accounting.usage import CostReport

__all__ = [
    "REASONING_PARAMS",
    "Action",
    "ChatStream",
    "Decision",
    "Deployment",
    "Failure",
    "Provider",
    "Retries",
    "UpstreamCall",
    "UpstreamHTTPError",
    "UpstreamResponse",
    "UpstreamStream",
]

# Chat parameters sent only to a deployment whose provider declares ``reasoning``.
REASONING_PARAMS = ("reasoning_effort", "reasoning")

Action = Literal["retry", "move_on", "stop"]


@attrs.frozen
class Failure:
    """What one attempt on a deployment came back with instead of an answer to relay."""

    status: int = 0  # the provider's error status; 0: no answer (see ``silent``)
    headers: Mapping[str, str] = attrs.field(factory=dict)
    body: bytes = b""
    silent: bool = False  # nothing in time: no connection, or no first byte


@attrs.frozen
class Decision:
    """What a route does after a failed attempt (``llmgw.routing.retry.decide``)."""

    action: Action
    reason: str  # for logs and spans: "silent", "overloaded", "rate_limited", ...
    wait: float = 0.0  # seconds before the retry


class Retries(Protocol):
    """How often a deployment is asked again within one request: the route's policy
    (``llmgw.routing.retry.RetryPolicy``), handed to an adapter in its ``ProviderSetup``; the
    adapter's retry loop asks it after each failed attempt and does as it says."""

    def decide(
        self,
        failure: Failure,
        *,
        retries: int,
        remaining: float,
        now: float,
        max_retries: int | None = None,
    ) -> Decision: ...


@attrs.frozen(slots=True)
class UpstreamCall:
    """One upstream operation: the body to send (JSON unless said) and the limits it runs under."""

    body: bytes
    deadline: float  # event-loop time by which the whole call, retries included, must be answered
    # Event-loop time by which this deployment must have begun to answer (headers, or a stream's
    # first event), so that the deployments after it still get their turn; None: ``deadline``.
    answer_by: float | None = None
    trace_headers: Mapping[str, str] = attrs.field(factory=dict)
    # Headers of the caller's that the provider's own API defines (``anthropic-beta`` for a body
    # forwarded to an Anthropic upstream as it came), lower-cased; an adapter passes on those it
    # knows and never lets them replace its own credentials.
    caller_headers: Mapping[str, str] = attrs.field(factory=dict)
    model: str | None = None  # the body's "model", when known
    # Told before each deployment a route tries, with how many it has tried by then (1, 2, ...).
    on_deployment: Callable[[Deployment, int], None] | None = attrs.field(default=None, eq=False)
    # Told when the deployment tried last failed (error type, and the status it answered with,
    # if it answered): the request's record lists every attempt and how it ended.
    on_failure: Callable[[Deployment, str, int | None], None] | None = attrs.field(
        default=None, eq=False
    )
    content_type: str = "application/json"
    # The body asking for another model, for bodies that are not JSON (a multipart upload).
    encode_for_model: Callable[[str], bytes] | None = attrs.field(default=None, eq=False)
    # Those of REASONING_PARAMS the (chat) body carries: a deployment without the capability is
    # sent the body without them.
    reasoning_params: tuple[str, ...] = ()
    # Whose request it is (the API key's id; None: no key): one caller's failures alone do not
    # take a deployment away from the others (llmgw.routing.breaker).
    caller: str | None = None
    # At most this many retries on one deployment (None: its provider's own): a route sets 0 when
    # another deployment is left to try, or for a probe of one that was down.
    max_retries: int | None = None
    # The request's admission (its ticket), opaque to adapters: routing counts a deployment whose
    # provider has account caps on it before it is sent (as a ``llmgw.limits.caps.CapTaker``:
    # adapters sit below limits and never look at it); None (no request behind the call): not
    # counted.
    admission: object = attrs.field(default=None, eq=False)

    def for_deployment(self, deployment: Deployment) -> tuple[UpstreamCall, tuple[str, ...]]:
        """The call as ``deployment`` is sent it, and the parameters it was sent without.

        The body is re-encoded only when the model differs or parameters are left out.
        """
        model = deployment.model
        omitted = () if deployment.provider.capabilities.reasoning else self.reasoning_params
        if not omitted:
            return self.with_model(model), ()
        document = orjson.loads(self.body)
        for name in omitted:
            del document[name]
        document["model"] = model
        call = attrs.evolve(self, body=orjson.dumps(document), model=model, reasoning_params=())
        return call, omitted

    def with_model(self, model: str) -> UpstreamCall:
        """The same call asking for ``model``: the body is re-encoded only when the model differs."""
        if model == self.model:
            return self
        if self.encode_for_model is not None:
            return attrs.evolve(self, body=self.encode_for_model(model), model=model)
        document = orjson.loads(self.body)
        document["model"] = model
        return attrs.evolve(self, body=orjson.dumps(document), model=model)


@attrs.frozen(slots=True)
class UpstreamResponse:
    """A complete upstream answer (any status): forwarded to the client byte for byte."""

    status: int
    body: bytes
    content_type: str
    retries: int = 0
    retry_after: str | None = None  # the provider's Retry-After, passed on with its error


class UpstreamHTTPError(Exception):
    """The provider answered with an error status; the client gets that status and body as they are.

    ``decision`` says whether a route moves on to its next deployment (``Retries.decide``).
    """

    def __init__(self, response: UpstreamResponse, decision: Decision | None = None) -> None:
        super().__init__(f"upstream answered {response.status}")
        self.response = response
        self.decision = decision


class ChatStream(Protocol):
    """An open 200 event stream from the provider; close() releases the connection at once."""

    retries: int
    content_type: str  # the provider's Content-Type: an event stream, or a whole JSON answer

    def chunks(self) -> AsyncGenerator[bytes, None]: ...

    async def close(self) -> None: ...


class UpstreamStream(ChatStream, Protocol):
    """Any open 200 answer read as it arrives (events or audio), with the provider's type."""

    content_type: str


class Provider(Protocol):
    """What a provider kind's factory returns (docs/plugins.md is the guide for plugin authors)."""

    name: str  # the [[providers]] entry's name
    server_address: str  # host and port, for telemetry (server.address, server.port)
    server_port: int
    # How its answers say what they cost (Venice's ``cost`` object); None: the gateway prices them.
    cost_report: CostReport | None
    publishes_prices: bool  # published_prices gives its models' prices
    capabilities: Capabilities  # what it accepts beyond plain chat (ProviderSetup.capabilities)

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        """A non-streamed completion. Raises UpstreamHTTPError for a non-2xx answer after retries."""
        ...

    async def stream_chat_completion(self, call: UpstreamCall) -> ChatStream:
        """Open a streamed completion, up to its first event: retries, and a route's move to its
        next deployment, happen only here, before any byte is returned."""
        ...

    async def embeddings(self, call: UpstreamCall) -> UpstreamResponse: ...

    async def forward(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        """POST ``call`` to ``path`` (``/images/generations``) and read the whole answer."""
        ...

    async def forward_stream(self, path: str, call: UpstreamCall, *, accept: str) -> UpstreamStream:
        """POST ``call`` to ``path`` and return the 200 answer (read only up to its first bytes),
        to relay as it arrives."""
        ...

    async def list_models(self, deadline: float) -> UpstreamResponse: ...

    async def published_prices(self, deadline: float) -> Mapping[str, Price]:
        """Its models' prices by model id, read from the provider (asked only when
        ``publishes_prices``; refreshed every PRICE_REFRESH_SECONDS). Raises as the calls do."""
        ...

    async def close(self) -> None: ...


@attrs.frozen(slots=True)
class Deployment:
    """A provider and the model id it knows: one step of a route (``venice:llama-3.2-3b``)."""

    provider: Provider
    model: str
    # Made once: routing, the observation and the ledger row each read it for every attempt.
    label: str = attrs.field(init=False, eq=False, repr=False)

    @label.default
    def _label(self) -> str:
        return f"{self.provider.name}:{self.model}"
