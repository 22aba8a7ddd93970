"""Where a finished request's one usage record goes: the billing log line, the settlement of what
it reserved (limits), and the usage ledger (in batches, off the request path)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

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
        """The request's billing line: the last thing its end does.

        What ``billing_log.info("billing record", extra={"event": ..., **fields})`` does, less
        its per-request work that says nothing new: the caller is known (no stack walk), and the
        fields are set on the record at once, not checked one by one in Python against the
        record's own attributes (they are a UsageRecord's field names, none of which is one:
        see ``tests/test_usage_sink.py``)."""
        if not billing_log.isEnabledFor(logging.INFO):
            return
        record = billing_log.makeRecord(
            billing_log.name, logging.INFO, _WHERE.co_filename, _WHERE.co_firstlineno,
            "billing record", (), None, _WHERE.co_name,
        )  # fmt: skip
        attributes = vars(record)
        attributes["event"] = BILLING_EVENT
        attributes.update(fields)
        billing_log.handle(record)


# Where a billing record says it was logged: this module's ``UsageAccounting.log`` (its first
# line), what ``Logger.findCaller`` would walk the stack for on every request.
_WHERE: Final = UsageAccounting.log.__code__
