"""What replicas tell each other about deployments: small messages, never one per request.

- a breaker's change (:class:`HealthChange`): a replica publishes when a breaker of its own opens
  or closes; every replica (itself included) receives it and takes it when it is newer than what it
  knows. A few hundred bytes of JSON: the deployment, until when it is open (null: closed), how
  often it opened in a row and when it last failed. The stores also keep the newest per deployment
  (newest by ``changed_at``, whatever order replicas wrote them in), so a replica that starts is
  told of the open ones before it serves (:meth:`HealthChannel.start`);
- a replica's load (:class:`LoadReport`, :mod:`llmgw.routing.load`): its requests in flight per
  deployment, at most four times a second and only when they changed. It travels on a channel of
  its own (``LOAD_CHANNEL``), so a replica of an older version is not sent what it cannot read.

A message that cannot be read is dropped (logged), never trusted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import orjson

__all__ = [
    "CHANNEL",
    "KEEP_SECONDS",
    "LOAD_CHANNEL",
    "HealthChange",
    "HealthChannel",
    "LoadReport",
    "Message",
    "Receiver",
    "decode",
    "encode",
    "kept_until",
]

log = logging.getLogger(__name__)

# The Postgres NOTIFY channels and the Redis pub/sub channels (breakers, load).
CHANNEL = "llmgw_deployment_health"
LOAD_CHANNEL = "llmgw_deployment_load"
# A change stays in the store this long after it stops mattering (the breaker closed, or its
# opening ran out): an older change that a late replica writes after it is then known to be older
# and not kept. Writes are late by seconds (a publish gives up after 2 s).
KEEP_SECONDS = 300.0


@attrs.frozen(slots=True)
class HealthChange:
    deployment: str  # provider:model
    open_until: float | None  # wall-clock seconds; None: closed
    openings: int
    last_failure_at: float
    changed_at: float


@attrs.frozen(slots=True)
class LoadReport:
    replica: str  # the sender's id (random, per process)
    in_flight: dict[str, int]  # provider:model -> requests it is serving; empty: none
    ttl: float  # seconds the receiver counts it (by its own clock: clocks need not agree)
    # provider:model -> callers (tags of API keys) it answered lately; a replica of an older
    # version sends none, and ignores these
    served: dict[str, list[str]] = attrs.field(factory=dict)
    # provider:model -> callers whose calls to it failed in a row there, oldest first (a breaker
    # opens on the failures of every replica)
    failing: dict[str, list[str]] = attrs.field(factory=dict)


def kept_until(change: HealthChange) -> float:
    """Until when the store keeps ``change`` (wall-clock seconds)."""
    return (change.changed_at if change.open_until is None else change.open_until) + KEEP_SECONDS


Message = HealthChange | LoadReport
Receiver = Callable[[Message], None]


class HealthChannel(Protocol):
    async def start(self, receive: Receiver) -> None:
        """Deliver every breaker the store keeps open, then every replica's messages (this one's
        too), to ``receive``; returns once they are delivered, or after a short wait when the store
        does not answer yet."""
        ...

    async def publish(self, message: Message) -> None:
        """Send ``message`` to every replica (and keep a breaker's change unless a newer one of
        the same deployment is kept); raises when the store cannot be reached."""
        ...

    async def close(self) -> None: ...


def encode(message: Message) -> str:
    return orjson.dumps(attrs.asdict(message)).decode()


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError("not a number")
    return float(value)


def _load_report(fields: dict[str, Any]) -> LoadReport:
    replica, in_flight = fields["replica"], fields["in_flight"]
    if not isinstance(replica, str) or not isinstance(in_flight, dict):
        raise ValueError("wrong type")
    for count in in_flight.values():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError("not a count")
    return LoadReport(
        replica=replica,
        in_flight=in_flight,
        ttl=_number(fields["ttl"]),
        served=_callers(fields.get("served", {})),
        failing=_callers(fields.get("failing", {})),
    )


def _callers(value: Any) -> dict[str, list[str]]:
    if not isinstance(value, dict) or not all(
        isinstance(callers, list) and all(isinstance(c, str) for c in callers)
        for callers in value.values()
    ):
        raise ValueError("wrong type")
    return value


def decode(payload: str | bytes) -> Message | None:
    try:
        fields = orjson.loads(payload)
        if not isinstance(fields, dict):
            raise ValueError("not an object")
        if "replica" in fields:
            return _load_report(fields)
        until = fields["open_until"]
        openings = fields["openings"]
        if not isinstance(fields["deployment"], str) or not isinstance(openings, int):
            raise ValueError("wrong type")
        return HealthChange(
            deployment=fields["deployment"],
            open_until=None if until is None else _number(until),
            openings=openings,
            last_failure_at=_number(fields["last_failure_at"]),
            changed_at=_number(fields["changed_at"]),
        )
    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
        log.warning("a deployment health message that cannot be read was dropped")
        return None
