"""Token usage and cost as providers report them (OpenAI ``usage``; Venice adds ``cost``)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import attrs

__all__ = ["Usage", "UsageRecord", "parse_usage"]


@attrs.frozen(slots=True)
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    reasoning_output_tokens: int | None = None
    cost_usd: float | None = None
    cost_diem: float | None = None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def parse_usage(document: dict[str, Any], *, with_cost: bool) -> Usage | None:
    """Usage from a response or chunk object; None when it carries none. Cost only if reported."""
    usage = document.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt_details = _dict(usage.get("prompt_tokens_details"))
    completion_details = _dict(usage.get("completion_tokens_details"))
    cost = _dict(document.get("cost")) if with_cost else {}
    cache_read = _int(prompt_details.get("cached_tokens"))
    if cache_read is None:
        cache_read = _int(usage.get("cache_read_input_tokens"))
    return Usage(
        input_tokens=_int(usage.get("prompt_tokens")),
        output_tokens=_int(usage.get("completion_tokens")),
        cache_read_input_tokens=cache_read,
        cache_creation_input_tokens=_int(prompt_details.get("cache_creation_input_tokens")),
        reasoning_output_tokens=_int(completion_details.get("reasoning_tokens")),
        cost_usd=_number(cost.get("usd")),
        cost_diem=_number(cost.get("diem")),
    )


@attrs.frozen(slots=True)
class UsageRecord:
    """One finished request, as billed: the billing log line and the usage ledger row."""

    occurred_at: datetime
    api_key_id: uuid.UUID
    subject_id: uuid.UUID | None
    request_id: str
    response_id: str | None
    operation: str
    provider: str
    deployment: str | None
    model: str
    response_model: str | None
    stream: bool
    status: int
    outcome: str
    error_type: str | None
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    cost_diem: float | None
    duration_ms: float
    time_to_first_chunk_ms: float | None
    trace_id: str | None
    usage_source: str = "reported"  # "estimated": the provider never reported usage
    cost_computed: bool = False  # the cost is from the price table, not the provider

    def log_fields(self) -> dict[str, Any]:
        """The record as JSON-ready fields (ids and times as strings)."""
        fields = attrs.asdict(self, recurse=False)
        fields["occurred_at"] = self.occurred_at.isoformat()
        fields["api_key_id"] = str(self.api_key_id)
        fields["subject_id"] = None if self.subject_id is None else str(self.subject_id)
        return fields
