"""Where a finished request's one usage record goes: the billing log line, the settlement of what
it reserved (limits), and the usage ledger (in batches, off the request path)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

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

    def __call__(
        self,
        record: UsageRecord,
        ticket: Ticket,
        caps: Sequence[tuple[CapHold | None, int]] = (),
    ) -> None:
        """``caps``: each answering deployment's account-cap hold, and the tokens its attempt
        used (see :meth:`Ticket.settle`)."""
        fields = record.log_fields()  # made once, for the billing line and the ledger's spool
        billing_log.info("billing record", extra={"event": BILLING_EVENT, **fields})
        ticket.settle(record, caps)
        self.ledger.record(record, fields)
