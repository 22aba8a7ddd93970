"""The ledger row is made from the request's record alone: no observation, no span."""

from __future__ import annotations

import uuid
from typing import Any, cast

from llmgw.accounting.usage import Usage
from llmgw.request_record import RequestRecord


def _record() -> RequestRecord:
    return RequestRecord(
        ticket=cast(Any, None),  # held, never used, by the record
        request_id="req-1",
        api_key_id=uuid.uuid4(),
        subject_id=None,
        operation="chat",
        model="fast",
        stream=True,
        provider="route",
        started=100.0,
    )


def test_the_row_says_what_the_stages_wrote_into_the_record() -> None:
    record = _record()
    record.provider, record.deployment, record.deployments_tried = "venice", "venice:qwen", 2
    record.note_ids({"id": "chatcmpl-1", "model": "qwen-2"})
    record.note_ids({"id": "chatcmpl-2", "model": "other"})  # the first that says them wins
    record.first_chunk_at = 100.25
    record.status, record.outcome, record.error_type = 200, "completed", None
    row = record.usage_row(Usage(input_tokens=3, output_tokens=4), attempts=2)
    assert (row.request_id, row.operation, row.model, row.stream) == ("req-1", "chat", "fast", True)
    assert (row.provider, row.deployment, row.attempts) == ("venice", "venice:qwen", 2)
    assert (row.response_id, row.response_model) == ("chatcmpl-1", "qwen-2")
    assert (row.status, row.outcome, row.error_type) == (200, "completed", None)
    assert (row.input_tokens, row.output_tokens) == (3, 4)
    assert row.time_to_first_chunk_ms == 250.0


def test_a_request_that_never_reached_a_provider_has_the_routes_name_and_no_first_chunk() -> None:
    record = _record()
    record.status, record.outcome, record.error_type = 429, "failed", "rate_limited"
    row = record.usage_row(Usage())
    assert (row.provider, row.deployment, row.time_to_first_chunk_ms) == ("route", None, None)
    assert row.response_id is None
