"""Provider account caps: the ``rpm`` / ``tpm`` of a provider's account, shared by every replica.

A provider limits its account as a whole, whatever the number of gateways in front of it; a
deployment whose provider is at its cap would only answer 429. So a request is counted on its
deployment's provider just before it is sent (routing asks the request's admission ticket,
``llmgw.limits.policy.Ticket.take_cap``: which deployment is routing's choice, counting it is the
limits'), on counters of the limits store the keys' admission
uses (one per provider and minute: ``provider-requests:<name>:<minute>``,
``provider-tokens:<name>:<minute>``), both in one round trip, all or nothing. One that does not
fit is not sent: the route moves on to its next deployment.

Tokens are reserved at their worst case (the estimated input plus the most output the request may
produce), as providers themselves count ``max_tokens`` against a tokens-per-minute limit when they
admit a request; a request larger than a whole minute's tokens is reserved as the whole minute
(the provider decides). When the request ends, the reservation of each deployment that answered is
settled at the tokens its attempt used (:class:`CapHold`), through the settlement queue the keys'
limits use (``LimitPolicy.charge``): the minute is not used up by worst cases. An attempt that
failed keeps its worst case until its minute ends (the provider may have counted it). A provider
without caps costs nothing: no store round trip.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs
import orjson

from llmgw.accounting.estimate import (
    BYTES_PER_TOKEN,
    estimate_input_tokens,
    worst_case_output_tokens,
)
from llmgw.limits.store import Admission, Charge, LimitStore, Reservation

__all__ = ["AccountCap", "CapHold", "CapTaker", "ProviderCaps"]

_MINUTE = 60.0
# A reservation outlives its minute: one not settled simply stops mattering when the next
# minute's counter is used.
_KEEP_SECONDS = 2 * _MINUTE


@attrs.frozen
class AccountCap:
    """A provider account's limits per minute (None: not capped)."""

    rpm: int | None = None
    tpm: int | None = None


@attrs.frozen(slots=True)
class CapHold:
    """A request counted on its provider's caps: its lease, and the ``tpm`` counter that holds its
    worst case (None: no ``tpm``, nothing to settle)."""

    lease_id: uuid.UUID
    tokens_counter: str | None

    def charge(self, tokens: int) -> Charge | None:
        """The settlement of its worst case at the ``tokens`` the attempt used."""
        if self.tokens_counter is None:
            return None
        return Charge(self.lease_id, self.tokens_counter, float(tokens))


@runtime_checkable
class CapTaker(Protocol):
    """What routing counts a deployment's attempt on (a request's admission ticket)."""

    async def take_cap(self, provider: str, cap: AccountCap, body: bytes) -> CapHold | float: ...


class ProviderCaps:
    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # which minute a request counts in
        self._caps: dict[str, AccountCap] = {}
        self._store: LimitStore | None = None
        self._default_max_output = 4096

    def configure(self, caps: Mapping[str, AccountCap]) -> None:
        """Each capped provider's caps, by name (at start and on every reload)."""
        self._caps = {name: cap for name, cap in caps.items() if cap.rpm or cap.tpm}

    def use(self, store: LimitStore, *, default_max_output_tokens: int) -> None:
        """Count on ``store`` from now on (the limits store, shared by every replica)."""
        self._store = store
        self._default_max_output = default_max_output_tokens

    def of(self, provider: str) -> AccountCap | None:
        """The provider's caps, if it has any and a store counts them (a dict lookup)."""
        return None if self._store is None else self._caps.get(provider)

    async def take(self, provider: str, cap: AccountCap, body: bytes) -> CapHold | float:
        """Count one request with ``body`` on the provider's caps: what holds it (it fits, send
        it), else the seconds until the minute that is full ends (nothing was counted)."""
        assert self._store is not None
        now = self.clock()
        minute = math.floor(now / _MINUTE) * _MINUTE
        reservations = []
        tokens_counter = None
        if cap.rpm is not None:
            reservations.append(
                Reservation(f"provider-requests:{provider}:{minute:.0f}", cap.rpm, 1, _KEEP_SECONDS)
            )
        if cap.tpm is not None:
            tokens = min(cap.tpm, self._worst_case_tokens(body))
            tokens_counter = f"provider-tokens:{provider}:{minute:.0f}"
            reservations.append(Reservation(tokens_counter, cap.tpm, tokens, _KEEP_SECONDS))
        lease_id = uuid.uuid4()
        result = await self._store.admit(
            Admission(
                lease_id=lease_id,
                lease_seconds=_KEEP_SECONDS,
                window=None,
                # One locking order (by name) for every store, as the keys' admissions.
                reservations=tuple(sorted(reservations, key=lambda r: r.counter)),
            )
        )
        if not result.admitted:
            return minute + _MINUTE - now
        return CapHold(lease_id, tokens_counter)

    def _worst_case_tokens(self, body: bytes) -> int:
        try:
            document: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            document = None
        if not isinstance(document, dict):
            # Not JSON (an upload): counted as the estimate counts text.
            return max(1, len(body) // BYTES_PER_TOKEN)
        output = worst_case_output_tokens(
            document, model_max=None, default_max=self._default_max_output
        )
        return estimate_input_tokens(document) + output
