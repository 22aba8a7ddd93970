"""One proxied request's record: the facts the stages learn, from its authentication to its end.

It lives in ``accounting`` (below ``api``, ``routing`` and ``telemetry``) because the ledger row is
made from it and from nothing else: the pipeline fills it in as it goes (who asked, what was
routed where, what answered, how it ended), telemetry may read it, and billing never has to read
telemetry's attributes back.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import attrs

from llmgw.accounting.usage import CostReport, Usage, UsageRecord
from llmgw.limits.policy import Ticket

__all__ = ["RequestRecord"]


@attrs.define(slots=True)
class RequestRecord:
    ticket: Ticket  # the request's admission: what its end settles
    request_id: str
    api_key_id: uuid.UUID
    subject_id: uuid.UUID | None
    operation: str  # gen_ai.operation.name
    model: str  # as the caller asked for it
    stream: bool
    provider: str  # the route's provider until a deployment is tried, then that deployment's
    provider_cost_report: CostReport | None = None  # how the provider's answers say their cost
    trace_id: str | None = None
    started: float = attrs.field(factory=time.perf_counter)
    deployment: str | None = None  # "provider:model" of the deployment tried last
    deployments_tried: int = 0
    response_id: str | None = None
    response_model: str | None = None
    first_chunk_at: float | None = None  # perf_counter, as ``started``
    usage: Usage | None = None  # as the provider reported it; None until (or unless) it does
    usage_source: str = "reported"  # or "estimated" (see accounting.charges)
    status: int | None = None  # how it ended: set when it does
    outcome: str = ""
    error_type: str | None = None
    # Set by the one function that ends a request, and only there: the request's one guard.
    ended: bool = False

    def note_ids(self, document: dict[str, Any]) -> None:
        """The answer's own id and model, from the first document that says them."""
        if self.response_id is None and isinstance(document.get("id"), str):
            self.response_id = document["id"]
        if self.response_model is None and isinstance(document.get("model"), str):
            self.response_model = document["model"]

    def usage_row(
        self,
        usage: Usage,
        *,
        usage_source: str = "reported",
        cost_computed: bool = False,
        flags: tuple[str, ...] = (),
        attempts: int = 1,
        started_deployment: str | None = None,
        attempt_log: tuple[dict[str, Any], ...] = (),
        cache_hit: bool = False,
        saved_cost_usd: float | None = None,
    ) -> UsageRecord:
        """The ledger's row of an ended request."""
        return UsageRecord(
            occurred_at=datetime.now(UTC),
            api_key_id=self.api_key_id,
            subject_id=self.subject_id,
            request_id=self.request_id,
            response_id=self.response_id,
            operation=self.operation,
            provider=self.provider,
            deployment=self.deployment,
            model=self.model,
            response_model=self.response_model,
            stream=self.stream,
            status=self.status,
            outcome=self.outcome,
            error_type=self.error_type,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_input_tokens=usage.cache_read_input_tokens,
            cache_creation_input_tokens=usage.cache_creation_input_tokens,
            cache_creation_1h_input_tokens=usage.cache_creation_1h_input_tokens,
            reasoning_output_tokens=usage.reasoning_output_tokens,
            cost_usd=usage.cost_usd,
            provider_extras=usage.extras,
            duration_ms=round((time.perf_counter() - self.started) * 1000, 3),
            time_to_first_chunk_ms=None
            if self.first_chunk_at is None
            else round((self.first_chunk_at - self.started) * 1000, 3),
            trace_id=self.trace_id,
            usage_source=usage_source,
            cost_computed=cost_computed,
            flags=flags,
            attempts=attempts,
            started_deployment=started_deployment,
            attempt_log=attempt_log,
            cache_hit=cache_hit,
            saved_cost_usd=saved_cost_usd,
        )
