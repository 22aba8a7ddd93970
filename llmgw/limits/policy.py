"""The one place that answers "is this request admitted, and why not", and settles it afterwards.

- request window (every key): 429 ``rate_limit_exceeded`` with Retry-After and x-ratelimit-*;
- model allowlist: 403 ``model_not_allowed``;
- concurrency slots (``max_concurrent_requests``): 429 ``concurrency_limit_exceeded``;
- tokens per minute: the request's worst case (estimated input + the most output it may produce)
  is reserved in the current minute: 429 ``tokens_per_minute_exceeded``;
- the subject's monthly budget: the worst case priced by the price table is reserved in the current
  month (UTC): 429 ``budget_exceeded``; a model with no known price: 403 ``price_unknown``.

Everything a request reserves is taken in one store round trip together with its window hit, all or
nothing. When the request ends, :meth:`LimitPolicy.settle` queues the actual figures, and they leave
in batches, never on the request path: the next admission on this replica carries what is queued
(the store settles it first, in the same round trip: no transaction of its own), and a replica that
admits nothing meanwhile sends it by itself ``settle_seconds`` (0.25 s) after it was queued, or at
once when a batch is full. So a replica's released slots and unused reservations count for its own
next admission at once, and for other replicas' within ``settle_seconds``. An admission refused on a
counter while a release of that counter was still on its way (queued beyond the batch it carried,
or carried by another call in flight) waits for it to land and asks once more: a caller that sends
its requests one after another is never refused for the slot its previous request held.

Live leases are renewed while their request runs (long streams); a killed replica's leases expire
after ``lease_seconds``.

An admission the request stopped waiting for (the store stalled past its timeout, or the client
left) may still reach the store later. It is cancelled by its lease id, sent as settlements are by
an idle replica: the store gives back what it reserved if it landed, and refuses it if it lands
afterwards, so a stall never holds a key's slots or budget until the lease expires.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, NoReturn, TypeVar

import attrs

from llmgw.accounting.estimate import estimate_input_tokens, worst_case_output_tokens
from llmgw.accounting.price import Metered
from llmgw.accounting.prices import PriceTable
from llmgw.accounting.usage import UsageRecord
from llmgw.auth.authenticator import AuthenticatedKey, TeamLimits
from llmgw.background import cancel_and_wait
from llmgw.errors import ModelNotAllowed, PriceUnknown, RateLimited, ServiceUnavailable
from llmgw.limits.caps import AccountCap, CapHold, ProviderCaps
from llmgw.limits.store import (
    Admission,
    AdmissionResult,
    Charge,
    LimitStore,
    RateLimitDecision,
    Reservation,
    Window,
)
from llmgw.providers.base import Deployment

__all__ = ["LimitPolicy", "Ticket", "WorstCase"]

log = logging.getLogger(__name__)

_CONCURRENCY = "concurrency"
_TOKENS = "tokens"
_BUDGET = "budget"
# A team's counters: a level of the same hierarchy, reserved in the same round trip as its key's.
_TEAM_CONCURRENCY = "team-concurrency"
_TEAM_TOKENS = "team-tokens"
_TEAM_BUDGET = "team-budget"
_TEAM_REQUESTS = "team-requests"  # the team's request window: a counter each request keeps 1 of
_USES_TOKENS = frozenset({_TOKENS, _TEAM_TOKENS})
_USES_COST = frozenset({_BUDGET, _TEAM_BUDGET})
# Float sums in a store may land a hair above an exactly-fitting cap; this much is not an overshoot.
_CAP_SLACK = 1e-9
_MAX_QUEUED_CHARGES = 100_000
# Settlements one round trip carries at most (an admission's, or an idle replica's own); a queue this
# long is sent at once, not after ``settle_seconds``.
_BATCH = 1_000
# How long a store refuses a cancelled admission that reaches it late, in leases: past this, a
# statement held up that long would at worst hold its slots for one lease, as a killed replica does.
_CANCEL_MEMORY_LEASES = 10

T = TypeVar("T")


async def _send(queue: list[T], batch: list[T], send: Awaitable[None], what: str) -> bool:
    """Send ``batch`` (taken from ``queue``) in one round trip; False if the store was unreachable
    (the batch is queued again, in front: it is older than what was queued meanwhile)."""
    try:
        await send
    except ServiceUnavailable:
        # Kept for the next try, up to a bound: past it, the oldest leases expire instead.
        queue[:0] = batch[-_MAX_QUEUED_CHARGES:]
        return False
    except asyncio.CancelledError:
        queue[:0] = batch
        raise
    except Exception:
        # A batch the store refuses is not retried forever; its leases expire.
        log.exception("limit %s of %d items was refused", what, len(batch))
    return True


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A shielded call's failure is handled where it happened, whether or not anyone awaits it."""
    if not task.cancelled():
        task.exception()


@attrs.frozen(slots=True)
class WorstCase:
    input_tokens: int
    output_tokens: int
    cost_usd: float | None  # None: not priced (no budget applies)


# What a request the response cache answers uses: no tokens, and nothing a budget counts.
_NOTHING = WorstCase(0, 0, None)


@attrs.define(slots=True, eq=False)
class Ticket:
    """One request's admission, from the middleware's :meth:`LimitPolicy.admit` to the one
    :meth:`settle` of the request's end.

    Admission is made in steps as the request's facts become known, each a call on the ticket,
    never a count of its own elsewhere: the request window when the key is known (unless the
    key's reservations will count it in their own round trip), the model's limits once the
    body is read (:meth:`reserve`: allowlist, tokens per minute, concurrency, budget), and each
    deployment's provider account caps when routing chooses it (:meth:`take_cap`): which
    deployment answers is routing's to decide, what it may cost is the ticket's."""

    policy: LimitPolicy
    key: AuthenticatedKey
    window: RateLimitDecision | None = None
    window_deferred: bool = False  # counted with the reservations, in their round trip
    # Whether the key reserves limits (LimitPolicy.reserves), if admission asked already: asked
    # once per request, not again when it reserves.
    reserves: bool | None = None
    lease_id: uuid.UUID | None = None
    counters: tuple[str, ...] = ()
    worst: WorstCase | None = None
    # Reserved for further attempts (:meth:`reserve_more`): released at the one settlement.
    more: list[tuple[uuid.UUID, tuple[str, ...]]] = attrs.field(factory=list)
    # Reserved as a stored answer: its tokens and spend not yet (:meth:`reserve_call`).
    stored_answer: bool = False
    # The tokens and spend reserved once a stored answer turned into a call (its lease, counters).
    call: tuple[uuid.UUID, tuple[str, ...]] | None = None
    settled: bool = False

    def allow_model(self, model: str) -> None:
        """Raise :class:`ModelNotAllowed` unless the key may use ``model`` (what :meth:`reserve`
        checks first; asked on its own before the response cache is read, since a key must be
        allowed a model before it may read an answer of it)."""
        self.policy.allow_model(self.key, model)

    async def reserve(
        self,
        *,
        model: str,
        body: dict[str, Any],
        deployments: Sequence[Deployment],
        produces_output: bool,
        metered: Metered | None = None,
        stored_answer: bool = False,
    ) -> None:
        """Apply the model's limits to the request, or raise the error it breaks.

        ``stored_answer``: the response cache answers it with an answer it holds: the request
        takes its place in the request windows and concurrency slots, and reserves no tokens
        or spend, of which it uses none (a key whose tokens per minute or budget are used up
        still gets its stored answers)."""
        await self.policy._reserve(
            self,
            model=model,
            body=body,
            deployments=deployments,
            produces_output=produces_output,
            metered=metered,
            stored_answer=stored_answer,
        )

    async def reserve_call(
        self,
        *,
        model: str,
        body: dict[str, Any],
        deployments: Sequence[Deployment],
        produces_output: bool,
        metered: Metered | None = None,
    ) -> None:
        """A request reserved as a stored answer calls the provider after all (it followed an
        identical request in flight, whose answer did not come): reserve the tokens and spend
        :meth:`reserve` left out, or raise the error a limit breaks. Its places in the windows
        and concurrency slots it holds already. Nothing for any other request."""
        await self.policy._reserve_call(
            self,
            model=model,
            body=body,
            deployments=deployments,
            produces_output=produces_output,
            metered=metered,
        )

    async def reserve_more(
        self, *, model: str, body: dict[str, Any], deployments: Sequence[Deployment]
    ) -> None:
        """Reserve what one more attempt of the admitted request can add to its bill, or raise
        the error a limit breaks: a broken stream's continuation is sent the prompt again, and
        billed for it (issue 34, item 5). ``body``: that attempt's request at its worst;
        ``deployments``: those that may take it. Tokens and budgets only: the request already
        holds its place in every window and concurrency slot."""
        await self.policy._reserve_more(self, model=model, body=body, deployments=deployments)

    async def take_cap(self, provider: str, cap: AccountCap, body: bytes) -> CapHold | float:
        """Count the attempt to send ``body`` to ``provider`` on its account caps (routing calls
        this for each deployment it chooses): what holds it, or the seconds until it may."""
        return await self.policy.caps.take(provider, cap, body)

    def settle(
        self, record: UsageRecord | None, caps: Sequence[tuple[CapHold | None, int]] = ()
    ) -> None:
        """The request ended: settle what it reserved at ``record``'s figures (None: it used
        nothing) and each answering deployment's account caps at the tokens its attempt used
        (``caps``); once, whatever calls it again. Never blocks, never raises."""
        if self.settled:
            return
        self.settled = True
        if self.lease_id is not None or self.call is not None:  # else it reserved nothing
            self.policy._settle(self, record)
        # Nothing queued when no cap counted it: queueing nothing still cost a round of calls.
        charges = [
            charge
            for hold, tokens in caps
            if hold is not None and (charge := hold.charge(tokens)) is not None
        ]
        if charges:
            self.policy.charge(charges)


def _float(cost: Decimal | None) -> float | None:
    return None if cost is None else float(cost)


def _month(moment: datetime) -> date:
    return moment.date().replace(day=1)


def _budget_counter(subject_id: uuid.UUID, now: datetime) -> str:
    return f"{_BUDGET}:{subject_id}:{_month(now).strftime('%Y-%m')}"


def _seconds_until_next_month(moment: datetime) -> float:
    days = calendar.monthrange(moment.year, moment.month)[1]
    start = datetime(moment.year, moment.month, 1, tzinfo=UTC)
    return start.timestamp() + days * 86400 - moment.timestamp()


def _next_minute_wait(now: datetime) -> int:
    """Whole seconds (at least 1) until a tokens-per-minute counter's next minute."""
    return max(1, math.ceil(60 - now.timestamp() % 60))


def _month_reset(now: datetime) -> tuple[date, dict[str, str]]:
    """When a monthly budget resets (UTC), and the Retry-After that waits for it."""
    reset = (_month(now).replace(day=28) + timedelta(days=4)).replace(day=1)
    wait = max(1, math.ceil(_seconds_until_next_month(now)))
    return reset, {"Retry-After": str(wait)}


class LimitPolicy:
    def __init__(
        self,
        store: LimitStore,
        prices: PriceTable,
        *,
        default_max_output_tokens: int = 4096,
        lease_seconds: float = 60.0,
        settle_seconds: float = 0.25,
        clock: Callable[[], float] = time.time,
        on_window_refusal: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.prices = prices
        self._default_max_output = default_max_output_tokens
        self._lease_seconds = lease_seconds
        self._settle_seconds = settle_seconds
        self._clock = clock
        self._on_window_refusal = on_window_refusal
        # Providers' account caps, counted on this store (routing configures which are capped).
        self.caps = ProviderCaps(clock=clock)
        self.caps.use(store, default_max_output_tokens=default_max_output_tokens)
        self._live: dict[uuid.UUID, tuple[str, ...]] = {}
        self._charges: list[Charge] = []
        self._cancels: list[tuple[uuid.UUID, tuple[str, ...]]] = []
        self._due: float | None = None  # when what is queued is sent if no admission carries it
        # Store calls carrying settlements or cancellations, until they end: the counters of each.
        self._in_flight: dict[asyncio.Future[Any], frozenset[str]] = {}
        self._wake = asyncio.Event()  # the queue started, or filled a batch
        self._flushing = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # Lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.store.start()
        self._tasks = [
            asyncio.create_task(self._settle_forever(), name="llmgw-limits-settle"),
            asyncio.create_task(self._renew_forever(), name="llmgw-limits-renew"),
        ]

    async def close(self) -> None:
        """Settle what is queued, then stop (after the server stopped serving)."""
        await cancel_and_wait(self._tasks)
        await self.flush()
        await self.store.close()

    # Admission --------------------------------------------------------------------------------

    @staticmethod
    def reserves(key: AuthenticatedKey) -> bool:
        """Whether the key's requests reserve anything (else: a window hit, as always)."""
        team = key.team
        return (
            key.max_concurrent_requests is not None
            or key.tokens_per_minute is not None
            or (key.subject_id is not None and key.monthly_budget_usd is not None)
            or (
                team is not None
                and (
                    team.max_concurrent_requests is not None
                    or team.tokens_per_minute is not None
                    or team.monthly_budget_usd is not None
                    or team.rate_limit_requests is not None
                )
            )
        )

    @staticmethod
    def allow_model(key: AuthenticatedKey, model: str) -> None:
        """:meth:`Ticket.allow_model`."""
        if not key.allows_model(model):
            raise ModelNotAllowed(
                f"This key may not use model {model!r}; allowed: {', '.join(sorted(key.allowlist)) or 'none'}.",
                param="model",
            )

    @staticmethod
    def _budgeted(key: AuthenticatedKey) -> bool:
        """Whether a budget (the subject's or the team's) caps the key's spending."""
        subject = key.subject_id is not None and key.monthly_budget_usd is not None
        return subject or (key.team is not None and key.team.monthly_budget_usd is not None)

    @staticmethod
    def _window(key: AuthenticatedKey) -> Window:
        return Window(key.id, key.rate_limit_requests, key.rate_limit_window_seconds)

    def _refuse_window(self, key: AuthenticatedKey, decision: RateLimitDecision) -> NoReturn:
        self._on_window_refusal()
        raise RateLimited(
            f"Rate limit of {decision.limit} requests per {key.rate_limit_window_seconds}s "
            f"reached for this key; retry in {decision.retry_after}s.",
            headers={"Retry-After": str(decision.retry_after), **decision.headers()},
        )

    async def admit(self, key: AuthenticatedKey, *, reserving: bool = False) -> Ticket:
        """The one admission of an authenticated request: its ticket, with the request window
        counted (429 when it is full), unless ``reserving`` (the request will :meth:`Ticket.
        reserve` once its body is read) and the key has limits to reserve: then the window is
        counted with them, in the same round trip."""
        reserves = self.reserves(key) if reserving else None
        if reserves:
            return Ticket(self, key, window_deferred=True, reserves=True)
        return Ticket(self, key, window=await self._hit_window(key), reserves=reserves)

    async def _hit_window(self, key: AuthenticatedKey) -> RateLimitDecision:
        """Count the request in the key's window on its own (429 when it is full)."""
        decision = await self.store.hit(self._window(key))
        if not decision.allowed:
            self._refuse_window(key, decision)
        return decision

    async def _reserve(
        self,
        ticket: Ticket,
        *,
        model: str,
        body: dict[str, Any],
        deployments: Sequence[Deployment],
        produces_output: bool,
        metered: Metered | None = None,
        stored_answer: bool = False,
    ) -> None:
        """:meth:`Ticket.reserve`: the model's limits, or the error the request breaks."""
        key = ticket.key
        self.allow_model(key, model)
        reserves = self.reserves(key) if ticket.reserves is None else ticket.reserves
        if not reserves or ticket.lease_id is not None:
            return
        now = datetime.fromtimestamp(self._clock(), UTC)
        ticket.stored_answer = stored_answer
        if stored_answer:
            # Its places only: the tokens and spend counters are left as they are.
            worst = _NOTHING
            reservations = tuple(
                r
                for r in self._reservations(key, worst, now)
                if r.counter.split(":", 1)[0] not in _USES_TOKENS
            )
            if not reservations:  # the key limits only tokens: the window is all there is
                if ticket.window_deferred:
                    ticket.window, ticket.window_deferred = await self._hit_window(key), False
                return
        else:
            await self.prices.loaded()
            worst = self.worst_case(
                body,
                deployments,
                produces_output=produces_output,
                priced=self._budgeted(key),
                model=model,
                metered=metered,
            )
            reservations = self._reservations(key, worst, now)
        window = self._window(key) if ticket.window_deferred else None
        lease_id, counters, result = await self._lease(reservations, window)
        if result.window is not None:
            ticket.window, ticket.window_deferred = result.window, False
            if not result.window.allowed:
                self._refuse_window(key, result.window)
        if result.refused is not None:
            refusal = self._refusal(key, result.refused, now)
            if result.window is not None:
                refusal.headers = {**refusal.headers, **result.window.headers()}
            raise refusal
        self._live[lease_id] = counters
        ticket.lease_id, ticket.counters, ticket.worst = lease_id, counters, worst

    async def _reserve_more(
        self,
        ticket: Ticket,
        *,
        model: str,
        body: dict[str, Any],
        deployments: Sequence[Deployment],
    ) -> None:
        """:meth:`Ticket.reserve_more`."""
        if (ticket.lease_id is None and ticket.call is None) or ticket.settled:
            return  # the key reserves nothing (or the request has ended)
        key = ticket.key
        worst = self.worst_case(
            body,
            deployments,
            produces_output=True,
            priced=self._budgeted(key),
            model=model,
        )
        leased = await self._lease_use(key, worst)
        if leased is not None:
            ticket.more.append(leased)

    async def _reserve_call(
        self,
        ticket: Ticket,
        *,
        model: str,
        body: dict[str, Any],
        deployments: Sequence[Deployment],
        produces_output: bool,
        metered: Metered | None,
    ) -> None:
        """:meth:`Ticket.reserve_call`."""
        if not ticket.stored_answer or ticket.settled:
            return
        ticket.stored_answer = False
        key = ticket.key
        await self.prices.loaded()
        worst = self.worst_case(
            body,
            deployments,
            produces_output=produces_output,
            priced=self._budgeted(key),
            model=model,
            metered=metered,
        )
        leased = await self._lease_use(key, worst)
        if leased is not None:
            ticket.call, ticket.worst = leased, worst

    async def _lease_use(
        self, key: AuthenticatedKey, worst: WorstCase
    ) -> tuple[uuid.UUID, tuple[str, ...]] | None:
        """The tokens and spend of ``worst`` on the key's counters, under a lease of their own:
        its id and counters (None: the key limits neither), or the error a limit breaks."""
        now = datetime.fromtimestamp(self._clock(), UTC)
        reservations = tuple(
            r
            for r in self._reservations(key, worst, now)
            if r.counter.split(":", 1)[0] in _USES_TOKENS | _USES_COST
        )
        if not reservations:
            return None
        lease_id, counters, result = await self._lease(reservations, None)
        if result.refused is not None:
            raise self._refusal(key, result.refused, now)
        self._live[lease_id] = counters
        return lease_id, counters

    async def _lease(
        self, reservations: tuple[Reservation, ...], window: Window | None
    ) -> tuple[uuid.UUID, tuple[str, ...], AdmissionResult]:
        """``reservations`` (and ``window``) taken under a new lease: its id, counters and the
        store's answer."""
        lease_id = uuid.uuid4()
        counters = tuple(r.counter for r in reservations)
        admission = Admission(
            lease_id=lease_id,
            lease_seconds=self._lease_seconds,
            window=window,
            reservations=reservations,
        )
        try:
            result = await self._admit(admission)
        except BaseException:
            # Timed out, cut off or cancelled: the store may still run it, so take it back.
            self._cancels.append((lease_id, counters))
            self._queued()
            raise
        return lease_id, counters, result

    async def _admit(self, admission: Admission, *, again: bool = True) -> AdmissionResult:
        """One store admission carrying the oldest queued settlements; once more if it was refused
        on a counter whose release was still on its way (after waiting for that to land)."""
        carried = self._charges[:_BATCH]
        del self._charges[:_BATCH]
        if not self._charges and not self._cancels:
            self._due = None
        on_the_way = self._on_the_way()  # what the store may not have seen when it admits this
        if carried:
            # Shielded: a caller that leaves does not cut off the settlements the call carries.
            call = asyncio.ensure_future(self._admit_carrying(admission, carried))
            call.add_done_callback(_retrieved)
            result = await asyncio.shield(call)
        else:
            result = await self.store.admit(admission)
        refused = result.refused
        if not again or refused is None or refused.counter not in on_the_way:
            return result
        await self._land(refused.counter)
        return await self._admit(admission, again=False)

    async def _admit_carrying(self, admission: Admission, carried: list[Charge]) -> AdmissionResult:
        with self._sending(carried, []):
            try:
                return await self.store.admit(admission, carried)
            except (ServiceUnavailable, asyncio.CancelledError):
                self._charges[:0] = carried  # for the next try (as a failed flush keeps them)
                self._queued()
                raise
            except Exception:
                log.exception("limit settlement of %d items was refused", len(carried))
                raise

    @contextlib.contextmanager
    def _sending(
        self, charges: list[Charge], cancels: list[tuple[uuid.UUID, tuple[str, ...]]]
    ) -> Iterator[None]:
        """Marks the counters of ``charges`` and ``cancels`` as on their way while in the block."""
        sent = asyncio.get_running_loop().create_future()
        self._in_flight[sent] = frozenset(c.counter for c in charges).union(
            *(counters for _, counters in cancels)
        )
        try:
            yield
        finally:
            del self._in_flight[sent]
            sent.set_result(None)

    def _on_the_way(self) -> frozenset[str]:
        """Counters with a release queued or in flight."""
        return frozenset(charge.counter for charge in self._charges).union(
            *(counters for _, counters in self._cancels), *self._in_flight.values()
        )

    async def _land(self, counter: str) -> None:
        """Until what was on its way to ``counter`` when this was called has reached the store
        (or failed to)."""
        sending = [sent for sent, counters in self._in_flight.items() if counter in counters]
        if sending:
            await asyncio.wait(sending)
        if any(c.counter == counter for c in self._charges) or any(
            counter in counters for _, counters in self._cancels
        ):
            await self.flush()

    def worst_case(
        self,
        body: dict[str, Any],
        deployments: Sequence[Deployment],
        *,
        produces_output: bool,
        priced: bool,
        model: str,
        metered: Metered | None = None,
    ) -> WorstCase:
        """The most a request can use on any deployment of its route (the first that answers).

        ``metered``: a media call, priced by what it is billed by (at most ``metered``), not by
        tokens."""
        prices = [self.prices.price(d.provider.name, d.model) for d in deployments]
        input_tokens = estimate_input_tokens(body)
        output_tokens = 0
        if produces_output:
            model_maxima = [p.max_output_tokens for p in prices if p is not None]
            output_tokens = worst_case_output_tokens(
                body,
                model_max=max((m for m in model_maxima if m is not None), default=None),
                default_max=self._default_max_output,
            )
        if not priced:
            return WorstCase(input_tokens, output_tokens, None)
        costs = [
            None
            if p is None
            else p.worst_cost(input_tokens, output_tokens)
            if metered is None
            else _float(p.media_cost(metered))
            for p in prices
        ]
        known = [cost for cost in costs if cost is not None]
        if len(known) < len(costs):
            unit = "" if metered is None else f" per {metered.unit.replace('_', ' ')}"
            raise PriceUnknown(
                f"Model {model!r} has no known price{unit}, and this key's spending is capped by "
                "a budget; the operator must price it (see docs/accounting.md, the price table).",
                param="model",
            )
        return WorstCase(input_tokens, output_tokens, max(known))

    def _reservations(
        self, key: AuthenticatedKey, worst: WorstCase, now: datetime
    ) -> tuple[Reservation, ...]:
        reservations = []
        if key.max_concurrent_requests is not None:
            reservations.append(
                Reservation(
                    f"{_CONCURRENCY}:{key.id}",
                    key.max_concurrent_requests,
                    1,
                    keep_seconds=self._lease_seconds * 2,
                )
            )
        if key.tokens_per_minute is not None:
            minute = math.floor(now.timestamp() / 60) * 60
            reservations.append(
                Reservation(
                    f"{_TOKENS}:{key.id}:{minute}",
                    key.tokens_per_minute,
                    worst.input_tokens + worst.output_tokens,
                    keep_seconds=120,
                )
            )
        if (
            worst.cost_usd is not None
            and key.subject_id is not None
            and key.monthly_budget_usd is not None
        ):
            cap = key.monthly_budget_usd
            reservations.append(
                Reservation(
                    _budget_counter(key.subject_id, now),
                    cap + cap * _CAP_SLACK,
                    worst.cost_usd,
                    keep_seconds=_seconds_until_next_month(now) + 86400,
                )
            )
        if key.team is not None:
            reservations.extend(self._team_reservations(key.team, worst, now))
        # One global locking order (by name) for every store, so concurrent calls never deadlock.
        return tuple(sorted(reservations, key=lambda r: r.counter))

    def _team_reservations(
        self, team: TeamLimits, worst: WorstCase, now: datetime
    ) -> Iterator[Reservation]:
        """The team's level of the hierarchy: counters over all its keys, on every replica."""
        if team.rate_limit_requests is not None and team.rate_limit_window_seconds is not None:
            seconds = team.rate_limit_window_seconds
            start = math.floor(now.timestamp() / seconds) * seconds
            yield Reservation(
                f"{_TEAM_REQUESTS}:{team.id}:{seconds}:{start}",
                team.rate_limit_requests,
                1,
                keep_seconds=seconds * 2 + self._lease_seconds,
            )
        if team.max_concurrent_requests is not None:
            yield Reservation(
                f"{_TEAM_CONCURRENCY}:{team.id}",
                team.max_concurrent_requests,
                1,
                keep_seconds=self._lease_seconds * 2,
            )
        if team.tokens_per_minute is not None:
            minute = math.floor(now.timestamp() / 60) * 60
            yield Reservation(
                f"{_TEAM_TOKENS}:{team.id}:{minute}",
                team.tokens_per_minute,
                worst.input_tokens + worst.output_tokens,
                keep_seconds=120,
            )
        if team.monthly_budget_usd is not None and worst.cost_usd is not None:
            cap = team.monthly_budget_usd
            # The counter holds what keys spent in the team this month; what keys that joined it
            # spent before (less what keys that left spent in it) counts too (docs/teams.md).
            month = _month(now)
            carried = team.carried_spend_usd if team.carried_month == month else 0.0
            yield Reservation(
                f"{_TEAM_BUDGET}:{team.id}:{month.strftime('%Y-%m')}",
                max(0.0, cap + cap * _CAP_SLACK - carried),
                worst.cost_usd,
                keep_seconds=_seconds_until_next_month(now) + 86400,
            )

    async def budget_reserved(self, subject_id: uuid.UUID) -> float:
        """USD the subject's requests in flight hold against this month's budget (their worst
        cases, until they settle)."""
        now = datetime.fromtimestamp(self._clock(), UTC)
        _used, reserved = await self.store.usage(_budget_counter(subject_id, now))
        return reserved

    def _refusal(self, key: AuthenticatedKey, refused: Reservation, now: datetime) -> RateLimited:
        kind = refused.counter.split(":", 1)[0]
        if kind.startswith("team-"):
            return self._team_refusal(kind, refused, now)
        if kind == _CONCURRENCY:
            return RateLimited(
                f"This key already has {key.max_concurrent_requests} requests in flight, its "
                "limit; retry when one has finished.",
                code="concurrency_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        if kind == _TOKENS:
            wait = _next_minute_wait(now)
            amount = int(refused.amount)
            if amount > (key.tokens_per_minute or 0):
                message = (
                    f"This request may use up to {amount} tokens, more than this key's "
                    f"{key.tokens_per_minute} tokens per minute; lower max_tokens."
                )
            else:
                message = (
                    f"This key's {key.tokens_per_minute} tokens per minute cannot cover this "
                    f"request's worst case of {amount} tokens now; retry in {wait}s."
                )
            return RateLimited(
                message, code="tokens_per_minute_exceeded", headers={"Retry-After": str(wait)}
            )
        reset, retry = _month_reset(now)
        return RateLimited(
            f"The monthly budget of subject {key.subject_id} cannot cover this request (worst "
            f"case ${refused.amount:.6f}); it resets on {reset.isoformat()} (UTC).",
            code="budget_exceeded",
            headers=retry,
        )

    @staticmethod
    def _team_refusal(kind: str, refused: Reservation, now: datetime) -> RateLimited:
        """Which of the team's limits refused, by its own code (docs/teams.md)."""
        if kind == _TEAM_REQUESTS:
            seconds = int(refused.counter.split(":")[2])
            wait = max(1, math.ceil(seconds - now.timestamp() % seconds))
            return RateLimited(
                f"The team's rate limit of {int(refused.cap)} requests per {seconds}s is reached; "
                f"retry in {wait}s.",
                code="team_rate_limited",
                headers={"Retry-After": str(wait)},
            )
        if kind == _TEAM_CONCURRENCY:
            return RateLimited(
                f"The team already has {int(refused.cap)} requests in flight, its limit; retry "
                "when one has finished.",
                code="team_concurrency_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        if kind == _TEAM_TOKENS:
            wait = _next_minute_wait(now)
            return RateLimited(
                f"The team's {int(refused.cap)} tokens per minute cannot cover this request's "
                f"worst case of {int(refused.amount)} tokens now; retry in {wait}s.",
                code="team_tokens_per_minute_exceeded",
                headers={"Retry-After": str(wait)},
            )
        reset, retry = _month_reset(now)
        return RateLimited(
            f"The team's monthly budget cannot cover this request (worst case "
            f"${refused.amount:.6f}); it resets on {reset.isoformat()} (UTC).",
            code="team_budget_exceeded",
            headers=retry,
        )

    # Settlement -------------------------------------------------------------------------------

    def _settle(self, ticket: Ticket, record: UsageRecord | None) -> None:
        """:meth:`Ticket.settle`: queue the actual figures of a finished request that reserved
        (under its lease, and its call's when a stored answer turned into one)."""
        # A cache hit used no provider's tokens: it counts against requests, never tokens.
        tokens = (
            0.0
            if record is None or record.cache_hit
            else float((record.input_tokens or 0) + (record.output_tokens or 0))
        )
        cost = 0.0 if record is None else float(record.cost_usd or 0)
        # Each lease with whether it carries the tokens and spend used: a call reserved after a
        # stored answer's lease carries them, so they are charged once.
        leases: list[tuple[uuid.UUID, tuple[str, ...], bool]] = []
        if ticket.lease_id is not None:
            leases.append((ticket.lease_id, ticket.counters, ticket.call is None))
        if ticket.call is not None:
            leases.append((*ticket.call, True))
        charges = []
        for lease_id, counters, used in leases:
            self._live.pop(lease_id, None)
            for counter in counters:
                kind = counter.split(":", 1)[0]
                actual = (
                    (tokens if used else 0.0)
                    if kind in _USES_TOKENS
                    else (cost if used else 0.0)
                    if kind in _USES_COST
                    else 1.0
                    if kind == _TEAM_REQUESTS  # the request was made: it keeps its place
                    else 0.0
                )
                charges.append(Charge(lease_id, counter, actual))
        # What further attempts reserved is given back: their use is in the figures above.
        for lease_id, counters in ticket.more:
            self._live.pop(lease_id, None)
            charges.extend(Charge(lease_id, counter, 0.0) for counter in counters)
        self.charge(charges)

    def charge(self, charges: Iterable[Charge]) -> None:
        """Queue settlements (a ticket's reservations, its provider account caps); never blocks,
        never raises."""
        self._charges.extend(charges)
        self._queued()

    def _queued(self) -> None:
        """Something was queued: due in ``settle_seconds`` unless an admission carries it first,
        at once if a batch is full."""
        if not self._charges and not self._cancels:
            return
        if self._due is None:
            self._due = time.monotonic() + self._settle_seconds
            self._wake.set()
        if len(self._charges) >= _BATCH:
            self._wake.set()

    async def flush(self) -> bool:
        """Send every queued cancellation and settlement now; False if the store was unreachable
        (what was not sent stays queued)."""
        async with self._flushing:
            cancels, charges = self._cancels, self._charges
            self._cancels, self._charges, self._due = [], [], None
            cancel_seconds = self._lease_seconds * _CANCEL_MEMORY_LEASES
            try:
                with self._sending(charges, cancels):
                    sent = not cancels or await _send(
                        self._cancels, cancels, self.store.cancel(cancels, cancel_seconds), "cancel"
                    )
                    if sent and charges:
                        handed, charges = charges, []
                        sent = await _send(
                            self._charges, handed, self.store.settle(handed), "settlement"
                        )
            finally:
                self._charges[:0] = charges  # not sent: the cancellations did not get through
                self._queued()
            return sent

    async def _settle_forever(self) -> None:
        failing = False  # logged once when sending starts failing and once when it works again
        while True:
            due = self._due
            wait = None if due is None else due - time.monotonic()
            if wait is None or (wait > 0 and len(self._charges) < _BATCH):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                self._wake.clear()
                continue
            if await self.flush():
                if failing:
                    log.warning("limit settlements and cancellations are sent again")
                failing = False
                continue
            if not failing:
                log.warning(
                    "limit settlements and cancellations cannot reach the store; they stay queued "
                    "and are retried every second"
                )
            failing = True
            await asyncio.sleep(1.0)

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self._lease_seconds / 3)
            if self._live:
                try:
                    await self.store.renew(list(self._live.items()), self._lease_seconds)
                except ServiceUnavailable:
                    log.warning("limit leases could not be renewed; retrying")
