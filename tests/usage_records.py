"""Usage records for unit tests of accounting and storage."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from llmgw.accounting.usage import UsageRecord


def usage_record(**overrides: Any) -> UsageRecord:
    """An ordinary completed chat request; ``overrides`` replace any field."""
    values: dict[str, Any] = {
        "occurred_at": datetime.now(UTC), "api_key_id": uuid.uuid4(), "subject_id": None,
        "request_id": "r", "response_id": None, "operation": "chat", "provider": "venice",
        "model": "m", "deployment": None, "response_model": None, "stream": False,
        "status": 200, "outcome": "completed", "error_type": None,
        "input_tokens": 1, "output_tokens": 1, "cost_usd": None,
        "duration_ms": 1.0, "time_to_first_chunk_ms": None, "trace_id": None,
    }  # fmt: skip
    values.update(overrides)
    return UsageRecord(**values)


def unsanitized(record: UsageRecord, **values: Any) -> UsageRecord:
    """``record`` with ``values`` forced in past the constructor's bounds (a bug, or a schema the
    code does not know yet), to exercise what the ledger does with a row the database refuses."""
    for name, value in values.items():
        object.__setattr__(record, name, value)
    return record
