"""Where a finished request's one usage record goes: the billing log line, the settlement of what
it reserved (limits), and the usage ledger (in batches, off the request path)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs

from llmgw.accounting.usage import UsageRecord
from llmgw.limits.caps import CapHold
from llmgw.limits.policy import Ticket
from llmgw.storage.ledger import UsageLedger

__all__ = ["BILLING_EVENT", "UsageAccounting"]

billing_log = logging.getLogger("llmgw.billing")
# The billing record's "event" (it was "venice.billing" before other providers were billed).
BILLING_EVENT = "llmgw.billing"


@attrs.frozen
class UsageAccounting:
    ledger: UsageLedger

    def settle(
        self,
        record: UsageRecord,
        ticket: Ticket,
        caps: Sequence[tuple[CapHold | None, int]] = (),
    ) -> dict[str, Any]:
        """Settle what the request reserved (``caps``: each answering deployment's account-cap
        hold and the tokens its attempt used, see :meth:`Ticket.settle`) and queue its ledger
        row; returns the row's fields, made once, for the spool and then the billing line
        (:meth:`log`)."""
        fields = record.log_fields()
        ticket.settle(record, caps)
        self.ledger.record(record, fields)
        return fields

    def log(self, fields: dict[str, Any]) -> None:
        """The request's billing line: the last thing its end does."""
        billing_log.info("billing record", extra={"event": BILLING_EVENT, **fields})
