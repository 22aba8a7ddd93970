"""Where a finished request's one usage record goes: the billing log line, the settlement of what
it reserved (limits), and the usage ledger (in batches, off the request path)."""

from __future__ import annotations

import logging

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

    def __call__(self, record: UsageRecord, admitted: Admitted) -> None:
        fields = record.log_fields()  # made once, for the billing line and the ledger's spool
        billing_log.info("billing record", extra={"event": BILLING_EVENT, **fields})
        self.limits.settle(admitted, record)
        self.ledger.record(record, fields)
