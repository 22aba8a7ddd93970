"""Where a finished request's usage goes: the local policy view at once, the ledger in batches."""

from __future__ import annotations

import attrs

from llmgw.accounting.usage import UsageRecord
from llmgw.policy.guards import PolicyGuard
from llmgw.storage.ledger import UsageLedger

__all__ = ["UsageAccounting"]


@attrs.frozen
class UsageAccounting:
    policy: PolicyGuard
    ledger: UsageLedger

    def __call__(self, record: UsageRecord) -> None:
        self.policy.account(record)
        self.ledger.record(record)
