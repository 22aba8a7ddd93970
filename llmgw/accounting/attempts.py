"""Every upstream attempt of one request: which deployment it went to, and how it ended.

The request's own state (``api.pipeline.Exchange``) keeps one :class:`Attempt` per deployment the
route sent the request to, in order: those that failed to answer (a 503, a refused connection,
silence), those whose stream broke off and was continued elsewhere, and the one that ended the
request. The ledger row is built from these (``deployment`` is the last one that produced the
answer's bytes, ``attempts`` counts them all, ``attempt_log`` lists them); telemetry is never read
for them.
"""

from __future__ import annotations

import math
from typing import Any, Final

import attrs

from llmgw.accounting.usage import MAX_COST, MAX_TOKENS, Usage, storable_text

__all__ = [
    "ANSWERED",
    "BROKE",
    "PENDING",
    "Attempt",
]

PENDING: Final = "pending"  # sent, no answer yet
ANSWERED: Final = "answered"  # it answered (its stream may still break: BROKE)
BROKE: Final = "broke"  # its stream broke off after answering; another attempt continued it


@attrs.define(slots=True)
class Attempt:
    """One deployment the request was sent to."""

    deployment: str  # "provider:model"
    provider: str
    model: str  # the model id that deployment was sent
    ended: str = PENDING  # PENDING, ANSWERED, BROKE, or how it failed (``error``)
    status: int | None = None  # the HTTP status it answered with, when it answered at all
    error: str | None = None  # why it failed or broke off (an error type, e.g. "503", "timeout")
    # What it produced, for an attempt that answered (None: nothing known; see ``estimated``).
    usage: Usage | None = None
    estimated: bool = False  # ``usage`` is the gateway's estimate, not the provider's count
    response_model: str | None = None  # the model its answer named

    def failed(self, error: str, status: int | None = None) -> None:
        self.ended, self.error, self.status = "failed", error, status

    def as_json(self) -> dict[str, Any]:
        """The attempt as the ledger stores it (``usage_events.attempt_log``)."""
        usage = self.usage or Usage()
        return {
            "deployment": self.deployment,
            "ended": self.ended,
            "status": self.status,
            "error": self.error,
            # A provider's text: bounded as the row's own text columns are.
            "response_model": None
            if self.response_model is None
            else storable_text(self.response_model),
            "input_tokens": _count(usage.input_tokens),
            "output_tokens": _count(usage.output_tokens),
            "cost_usd": _cost(usage.cost_usd),
            "estimated": self.estimated,
        }


# What a JSON column holds of a figure the row's own columns would hold (UsageRecord's bounds).
def _count(value: int | None) -> int | None:
    return value if value.__class__ is int and 0 <= value <= MAX_TOKENS else None


def _cost(value: float | None) -> float | None:
    if value is None or not math.isfinite(value) or not 0 <= value <= MAX_COST:
        return None
    return value
