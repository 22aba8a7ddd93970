"""How a breaker's change reaches every replica: one small message per change, never per request.

A replica publishes when a breaker of its own opens or closes; every replica (itself included)
receives it and takes it when it is newer than what it knows. Messages are a few hundred bytes of
JSON: the deployment, until when it is open (null: closed), how often it opened in a row and when
it last failed. A message that cannot be read is dropped (logged), never trusted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import orjson

__all__ = ["CHANNEL", "HealthChange", "HealthChannel", "Receiver", "decode", "encode"]

log = logging.getLogger(__name__)

# The Postgres NOTIFY channel and the Redis pub/sub channel.
CHANNEL = "llmgw_deployment_health"


@attrs.frozen(slots=True)
class HealthChange:
    deployment: str  # provider:model
    open_until: float | None  # wall-clock seconds; None: closed
    openings: int
    last_failure_at: float
    changed_at: float


Receiver = Callable[[HealthChange], None]


class HealthChannel(Protocol):
    async def start(self, receive: Receiver) -> None:
        """Begin delivering every replica's changes (this one's too) to ``receive``; returns once
        they are delivered, or after a short wait when the store does not answer yet."""
        ...

    async def publish(self, change: HealthChange) -> None:
        """Send ``change`` to every replica; raises when the store cannot be reached."""
        ...

    async def close(self) -> None: ...


def encode(change: HealthChange) -> str:
    return orjson.dumps(attrs.asdict(change)).decode()


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError("not a number")
    return float(value)


def decode(payload: str | bytes) -> HealthChange | None:
    try:
        fields = orjson.loads(payload)
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
