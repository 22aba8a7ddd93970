"""Where a finished request's one usage record goes: the billing log line, the settlement of what
it reserved (limits), and the usage ledger (in batches, off the request path)."""

from __future__ import annotations

import logging
from typing import Any

import attrs

from llmgw.accounting.usage import UsageRecord
from llmgw.limits.policy import Admitted, LimitPolicy
from llmgw.storage.ledger import UsageLedger

__all__ = ["BILLING_EVENT", "UsageAccounting"]

billing_log = logging.getLogger("llmgw.billing")
# The billing record's "event" (it was "venice.billing" before other providers were billed).
BILLING_EVENT = "llmgw.billing"


@attrs.frozen
class UsageAccounting:
    limits: LimitPolicy
    ledger: UsageLedger

    def settle(self, record: UsageRecord, admitted: Admitted) -> dict[str, Any]:
        """Settle what the request reserved and queue its ledger row; returns the row's fields,
        made once, for the ledger's spool and then the billing line (:meth:`log`)."""
        fields = record.log_fields()
        self.limits.settle(admitted, record)
        self.ledger.record(record, fields)
        return fields

    def log(self, fields: dict[str, Any]) -> None:
        """The request's billing line: the last thing its end does."""
        billing_log.info("billing record", extra={"event": BILLING_EVENT, **fields})
