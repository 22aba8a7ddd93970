"""``python -m bench.ledger_spool``: what the usage ledger's spool adds to each request.

A request's share of the ledger is ``UsageLedger.record``: queue the row, and with the spool also
serialize it and append it to this process's spool file (one ``write``). This times that call
with and without the spool on a real file in a temporary directory, in rounds (best of each, the
least disturbed by other processes), and prints microseconds per record; and the record's event id
(``uuid4``, made with every record). The batch writer runs off the request path; it is not started.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import timeit
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmgw.accounting.usage import UsageRecord
from llmgw.storage.ledger import UsageLedger
from llmgw.storage.spool import Spool

_RECORDS = 20_000
_ROUNDS = 7


def _record(index: int) -> UsageRecord:
    """A streamed chat request's record, as the pipeline makes it."""
    return UsageRecord(
        occurred_at=datetime.now(UTC), api_key_id=uuid.uuid4(), subject_id=uuid.uuid4(),
        request_id=uuid.uuid4().hex, response_id=f"chatcmpl-{index}", operation="chat",
        provider="venice", deployment="venice", model="qwen3-5-9b", response_model="qwen3-5-9b",
        stream=True, status=200, outcome="completed", error_type=None, input_tokens=12,
        output_tokens=20, cost_usd=0.00010471875, duration_ms=12.345,
        time_to_first_chunk_ms=3.21, trace_id="0af7651916cd43dd8448eb211c80319c",
    )  # fmt: skip


def _per_record_us(spool: Spool | None) -> float:
    pool: Any = None  # record() never touches the database
    records = [_record(index) for index in range(_RECORDS)]
    ledger = UsageLedger(pool, capacity=_RECORDS, batch_size=_RECORDS + 1, spool=spool)
    started = time.perf_counter()
    for record in records:
        ledger.record(record)
    elapsed = time.perf_counter() - started
    if spool is not None:
        spool.discard(spool.rotate())
    return elapsed / _RECORDS * 1e6


def main() -> None:
    async def measure() -> None:
        with tempfile.TemporaryDirectory(prefix="llmgw-bench-spool-") as directory:
            spool = Spool.open(Path(directory))
            assert spool is not None
            without = min(_per_record_us(None) for _ in range(_ROUNDS))
            with_spool = min(_per_record_us(spool) for _ in range(_ROUNDS))
            spool.close(empty=True)
        print(f"UsageLedger.record without spool: {without:.2f} µs per record")
        print(f"UsageLedger.record with spool:    {with_spool:.2f} µs per record")
        print(f"the spool adds:                   {with_spool - without:.2f} µs per record")
        event_id = min(timeit.repeat(uuid.uuid4, number=100_000, repeat=_ROUNDS)) * 10
        print(f"an event id (uuid4):              {event_id:.2f} µs per record")

    asyncio.run(measure())


if __name__ == "__main__":
    main()
