"""The billing line: the record ``UsageAccounting.log`` hands to logging is the one
``logger.info("billing record", extra=...)`` would make."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from llmgw.accounting.usage import UsageRecord
from llmgw.usage_sink import BILLING_EVENT, UsageAccounting, billing_log
from tests.telemetry.test_logs import Records
from tests.usage_records import usage_record

# What differs between two records made at two moments, from two places in the code.
_WHEN_AND_WHERE = {
    "created", "msecs", "relativeCreated", "pathname", "filename", "module", "lineno", "funcName",
}  # fmt: skip


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    handler, level = Records(), billing_log.level
    billing_log.addHandler(handler)
    billing_log.setLevel(logging.INFO)
    yield handler.records
    billing_log.removeHandler(handler)
    billing_log.setLevel(level)


def _accounting() -> UsageAccounting:
    return UsageAccounting(ledger=None)  # type: ignore[arg-type]  # log() never reads it


def test_the_billing_record_is_what_logging_makes_of_the_fields(
    records: list[logging.LogRecord],
) -> None:
    fields = usage_record(subject_id=uuid.uuid4(), cost_usd=0.25).log_fields()
    _accounting().log(fields)
    billing_log.info("billing record", extra={"event": BILLING_EVENT, **fields})
    ours, logging_own = records
    assert list(vars(ours)) == list(vars(logging_own))  # the same attributes, in the same order
    assert {k: v for k, v in vars(ours).items() if k not in _WHEN_AND_WHERE} == {
        k: v for k, v in vars(logging_own).items() if k not in _WHEN_AND_WHERE
    }
    assert ours.getMessage() == "billing record"
    assert (Path(ours.pathname).name, ours.funcName) == ("usage_sink.py", "log")


def test_no_billing_field_replaces_an_attribute_of_the_log_record() -> None:
    """What ``extra=`` refuses (a KeyError), and ``log`` no longer checks per request."""
    own = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
    assert not own & {"event", *(field.name for field in attrs.fields(UsageRecord))}


def test_no_billing_line_below_the_loggers_level(records: list[logging.LogRecord]) -> None:
    billing_log.setLevel(logging.WARNING)
    _accounting().log(usage_record().log_fields())
    assert records == []
