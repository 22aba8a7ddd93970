"""Usage records are bounded where they are built: whatever a provider or a caller sends, the row
is storable, and every value that had to go is named in ``flags``."""

from __future__ import annotations

import asyncio
import math
import os
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import asyncpg
import attrs
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llmgw.accounting.charges import charge
from llmgw.accounting.price import Price
from llmgw.accounting.usage import (
    _UNSTORABLE,
    MAX_COST,
    MAX_EXTRAS,
    MAX_TEXT_CHARS,
    MAX_TOKENS,
    CostReport,
    Usage,
    UsageRecord,
    _storable,
    add_extras,
    anthropic_usage,
    parse_usage,
    storable_text,
)
from llmgw.storage.usage import write_batch
from tests.usage_records import unsanitized, usage_record


def test_an_ordinary_record_is_kept_as_given_and_unflagged() -> None:
    record = usage_record(model="qwen3-5-9b", input_tokens=3, cost_usd=0.00010471875)
    assert (record.model, record.input_tokens, record.cost_usd) == ("qwen3-5-9b", 3, 0.00010471875)
    assert (record.flags, record.usage_source) == ((), "reported")


@pytest.mark.parametrize(
    ("values", "kept", "flags"),
    [
        ({"model": "ok\x00x"}, {"model": "okx"}, ("model:control_characters",)),
        ({"response_id": "id\x00\r\n\x1b[31m\x85"}, {"response_id": "id[31m"}, ("response_id:control_characters",)),
        ({"response_id": "\ud800x"}, {"response_id": "x"}, ("response_id:control_characters",)),
        ({"model": "m" * 600}, {"model": "m" * MAX_TEXT_CHARS}, ("model:truncated",)),
        ({"input_tokens": -5, "output_tokens": -3}, {"input_tokens": None, "output_tokens": None}, ("input_tokens:out_of_range", "output_tokens:out_of_range")),
        ({"input_tokens": 2**31}, {"input_tokens": None}, ("input_tokens:out_of_range",)),
        ({"input_tokens": MAX_TOKENS}, {"input_tokens": MAX_TOKENS}, ()),
        ({"output_tokens": True}, {"output_tokens": None}, ("output_tokens:out_of_range",)),
        ({"cost_usd": 1e10}, {"cost_usd": None}, ("cost_usd:out_of_range",)),
        ({"attempts": 0}, {"attempts": 1}, ("attempts:out_of_range",)),
        ({"cost_usd": -0.01, "provider_extras": {"p.a": math.nan, "p.b": 2}}, {"cost_usd": None, "provider_extras": {"p.b": 2}}, ("cost_usd:out_of_range", "provider_extras:out_of_range")),
        ({"provider_extras": {"p.a": Decimal("sNaN")}}, {"provider_extras": {}}, ("provider_extras:out_of_range",)),
        ({"provider_extras": {"p\x00": 1, "": 1, "p" * 129: 1, "p.ok": 1}}, {"provider_extras": {"p.ok": 1}}, ("provider_extras:out_of_range",)),
        ({"provider_extras": {f"p.{n}": n for n in range(20)}}, {"provider_extras": {f"p.{n}": n for n in range(16)}}, ("provider_extras:out_of_range",)),
        ({"provider_extras": {"venice.cost.diem": MAX_COST}}, {"provider_extras": {"venice.cost.diem": MAX_COST}}, ()),
        ({"cost_usd": 10**400}, {"cost_usd": None}, ("cost_usd:out_of_range",)),
        ({"status": 999}, {"status": None}, ("status:out_of_range",)),
        ({"status": 99}, {"status": None}, ("status:out_of_range",)),
        ({"duration_ms": math.inf}, {"duration_ms": 0.0}, ("duration_ms:out_of_range",)),
        ({"time_to_first_chunk_ms": -1.0}, {"time_to_first_chunk_ms": None}, ("time_to_first_chunk_ms:out_of_range",)),
        ({"usage_source": "guessed"}, {"usage_source": "estimated"}, ("usage_source:unknown",)),
        ({"usage_source": "estimated"}, {"usage_source": "estimated"}, ()),
    ],
)  # fmt: skip
def test_a_value_that_cannot_be_kept_is_dropped_and_flagged(
    values: dict[str, Any], kept: dict[str, Any], flags: tuple[str, ...]
) -> None:
    record = usage_record(**values)
    assert {name: getattr(record, name) for name in kept} == kept
    assert record.flags == flags


def test_bounding_is_idempotent_and_keeps_flags_given() -> None:
    record = usage_record(model="a\x00b", flags=("cost_usd:estimated",))
    assert record.flags == ("cost_usd:estimated", "model:control_characters")
    assert attrs.evolve(record) == record
    assert attrs.evolve(record, status=1000).flags == (*record.flags, "status:out_of_range")


def test_the_billing_line_carries_usage_source_and_flags() -> None:
    fields = usage_record(usage_source="estimated", status=999).log_fields()
    assert fields["usage_source"] == "estimated"
    assert fields["flags"] == ("status:out_of_range",)
    orjson.dumps(fields)


def test_hostile_usage_from_a_provider_is_bounded() -> None:
    document = orjson.loads(
        b'{"usage": {"prompt_tokens": -1, "completion_tokens": 4e9},'
        b' "cost": {"usd": 1e10, "diem": 1e300}}'
    )
    usage = parse_usage(document, cost=CostReport("venice.cost"))
    assert usage is not None
    record = usage_record(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cost_usd=usage.cost_usd,
        provider_extras=usage.extras,
    )
    assert (record.input_tokens, record.output_tokens, record.cost_usd) == (None, None, None)
    assert record.provider_extras == {}
    assert len(record.flags) == 4


def test_a_cost_report_reads_every_number_of_the_cost_object_as_a_named_extra() -> None:
    venice = CostReport("venice.cost")
    document = {
        "usage": {"prompt_tokens": 3, "completion_tokens": 5},
        "cost": {"usd": 0.25, "diem": 1.5, "note": "text", "credits": True},
    }
    assert parse_usage(document, cost=venice) == Usage(
        3, 5, cost_usd=0.25, extras={"venice.cost.usd": 0.25, "venice.cost.diem": 1.5}
    )
    many = {"usage": document["usage"], "cost": {f"k{n}": n for n in range(40)}}
    usage = parse_usage(many, cost=venice)
    assert usage is not None and len(usage.extras) == MAX_EXTRAS and usage.cost_usd is None
    # A provider that reports no cost: none read, whatever the answer carries.
    assert parse_usage(document, cost=None) == Usage(3, 5)


def test_extras_of_attempts_add_by_name() -> None:
    first = {"venice.cost.usd": 0.25, "venice.cost.diem": 1.0}
    assert add_extras(first, {"venice.cost.diem": 2.0, "other.x": 1}) == {
        "venice.cost.usd": 0.25,
        "venice.cost.diem": 3.0,
        "other.x": 1,
    }
    assert add_extras({}, first) == first
    assert add_extras(first, {}) == first


_any_text = st.text(alphabet=st.characters(exclude_categories=()), max_size=700)  # NUL, surrogates
_any_int = st.integers() | st.integers(min_value=-(2**33), max_value=2**33) | st.booleans()
_any_number = (
    _any_int
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.decimals(allow_nan=True, allow_infinity=True)
    | st.floats(min_value=0, max_value=MAX_COST * 2)
)
_HOSTILE: dict[str, st.SearchStrategy[Any]] = {
    "request_id": _any_text,
    "response_id": st.none() | _any_text,
    "model": _any_text,
    "provider": _any_text,
    "response_model": st.none() | _any_text,
    "error_type": st.none() | _any_text,
    "status": st.none() | _any_int | st.integers(min_value=90, max_value=610),
    "input_tokens": st.none() | _any_int,
    "output_tokens": st.none() | _any_int,
    "cache_read_input_tokens": st.none() | _any_int,
    "cache_creation_input_tokens": st.none() | _any_int,
    "cache_creation_1h_input_tokens": st.none() | _any_int,
    "reasoning_output_tokens": st.none() | _any_int,
    "cost_usd": st.none() | _any_number,
    "provider_extras": st.dictionaries(_any_text, _any_number, max_size=20),
    "duration_ms": st.floats(allow_nan=True, allow_infinity=True),
    "time_to_first_chunk_ms": st.none() | st.floats(allow_nan=True, allow_infinity=True),
    "usage_source": st.sampled_from(["reported", "estimated", "", "x\x00"]),
    "subject_id": st.none() | st.uuids(),
    "attempts": _any_int,
}
_hostile_values = st.fixed_dictionaries(_HOSTILE)
hostile_records = _hostile_values.map(lambda values: usage_record(**values))


_TIMES = {"duration_ms": _any_number, "time_to_first_chunk_ms": st.none() | _any_number}


@settings(max_examples=500, deadline=None)
# Some fields hostile, the others as usual: both ways through the constructor.
@given(values=st.fixed_dictionaries({}, optional={**_HOSTILE, **_TIMES}))
@example({"duration_ms": math.inf})
@example({"time_to_first_chunk_ms": math.nan})
@example({"cost_usd": MAX_COST, "provider_extras": {"p.x": MAX_COST + 1}})
@example({"status": 600})
@example({"reasoning_output_tokens": MAX_TOKENS + 1})
@example({"attempts": 0})
@example({"model": "m" * (MAX_TEXT_CHARS + 1)})
def test_a_record_is_bounded_as_checking_each_field_bounds_it(values: dict[str, Any]) -> None:
    # The constructor skips the checks of each field when a few comparisons say they would
    # change nothing: whatever it is given, the record is the one the checks make.
    ids = {"occurred_at": datetime.now(UTC), "api_key_id": uuid.uuid4(), "event_id": uuid.uuid4()}
    checked = unsanitized(usage_record(**ids), **values)
    checked._bound()
    assert usage_record(**ids, **values) == checked


def test_the_usual_record_is_told_storable_without_checking_each_field() -> None:
    assert _storable(
        usage_record(
            response_id="chatcmpl-1", cost_usd=0.0001, provider_extras={"venice.cost.diem": 1}
        )
    )
    assert _storable(usage_record(time_to_first_chunk_ms=3, cache_read_input_tokens=0))


async def _write(database_url: str, records: list[UsageRecord]) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        transaction = connection.transaction()
        await transaction.start()
        try:
            await write_batch(connection, records)
        finally:
            await transaction.rollback()  # leave the test database as it was
    finally:
        await connection.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(hostile_records, min_size=1, max_size=8))
def test_every_record_built_from_hostile_values_is_storable(
    database_url: str, records: list[UsageRecord]
) -> None:
    for record in records:
        assert attrs.evolve(record) == record  # bounded values pass unchanged
        assert all(isinstance(flag, str) and ":" in flag for flag in record.flags)
        orjson.dumps(record.log_fields(), default=str)  # the billing line, as logs.py writes it
    asyncio.run(_write(database_url, records))


def test_cache_writes_are_read_from_chat_and_responses_usage() -> None:
    chat = {"usage": {"prompt_tokens": 10, "completion_tokens": 1,
                      "prompt_tokens_details": {"cache_creation_input_tokens": 4}}}  # fmt: skip
    responses = {"usage": {"input_tokens": 10, "output_tokens": 1,
                           "input_tokens_details": {"cache_write_tokens": 6}}}  # fmt: skip
    assert parse_usage(chat, cost=None) == Usage(10, 1, cache_creation_input_tokens=4)
    assert parse_usage(responses, cost=None) == Usage(10, 1, cache_creation_input_tokens=6)
    beside = {"usage": {"prompt_tokens": 10, "completion_tokens": 1,
                        "cache_creation_input_tokens": 3}}  # fmt: skip
    assert parse_usage(beside, cost=None) == Usage(10, 1, cache_creation_input_tokens=3)


def test_anthropic_usage_counts_cache_reads_and_writes_as_input() -> None:
    assert anthropic_usage({"input_tokens": 5, "output_tokens": 2}) == Usage(5, 2)
    assert anthropic_usage(
        {"input_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 30,
         "cache_creation": {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 20},
         "output_tokens": 2}
    ) == Usage(135, 2, cache_read_input_tokens=100, cache_creation_input_tokens=30,
               cache_creation_1h_input_tokens=20)  # fmt: skip
    # message_delta carries only the output count.
    assert anthropic_usage({"output_tokens": 9}) == Usage(output_tokens=9)


async def test_the_ledger_keeps_an_anthropic_answers_exact_bill_and_its_counts(
    db: asyncpg.Connection,
) -> None:
    usage = anthropic_usage(
        {"input_tokens": 1_234, "cache_read_input_tokens": 50_000,
         "cache_creation_input_tokens": 7_000,
         "cache_creation": {"ephemeral_5m_input_tokens": 3_000, "ephemeral_1h_input_tokens": 4_000},
         "output_tokens": 789}
    )  # fmt: skip
    sonnet = Price(3, 15, cache_read_usd_per_mtok=0.3, cache_write_usd_per_mtok=3.75,
                   cache_write_1h_usd_per_mtok=6)  # fmt: skip
    charged = charge(usage, provider_worked=True, estimate=lambda: (0, 0), price=lambda: sonnet)
    billed = charged.usage
    record = usage_record(
        input_tokens=billed.input_tokens, output_tokens=billed.output_tokens,
        cache_read_input_tokens=billed.cache_read_input_tokens,
        cache_creation_input_tokens=billed.cache_creation_input_tokens,
        cache_creation_1h_input_tokens=billed.cache_creation_1h_input_tokens,
        cost_usd=billed.cost_usd, cost_computed=charged.cost_computed,
    )  # fmt: skip
    await write_batch(db, [record])
    row = await db.fetchrow("SELECT * FROM usage_events WHERE event_id = $1", record.event_id)
    by_hand = (
        1_234 * Decimal(3) + 50_000 * Decimal("0.3") + 3_000 * Decimal("3.75")
        + 4_000 * Decimal(6) + 789 * Decimal(15)
    ) / 1_000_000  # fmt: skip
    assert row["cost_usd"] == by_hand
    counts = (
        row["input_tokens"], row["cache_read_input_tokens"], row["cache_creation_input_tokens"],
        row["cache_creation_1h_input_tokens"], row["output_tokens"],
    )  # fmt: skip
    assert counts == (58_234, 50_000, 7_000, 4_000, 789)


def test_event_ids_are_version_4_uuids_none_repeated_by_a_forked_child() -> None:
    """Made without a system call (see usage._event_id), they are what uuid4 makes: random
    version-4 UUIDs; a child a fork makes draws its own, not its parent's next ones."""
    ids = [usage_record().event_id for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(i.version == 4 and i.variant == uuid.RFC_4122 for i in ids)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover  (the child: its ids go to the parent, then it leaves)
        os.write(write, b"".join(usage_record().event_id.bytes for _ in range(10)))
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read, "rb") as pipe:
        children = pipe.read()
    parents = [usage_record().event_id for _ in range(10)]
    theirs = {uuid.UUID(bytes=children[i : i + 16]) for i in range(0, len(children), 16)}
    assert len(theirs) == 10
    assert not theirs & {*parents, *ids}


def test_no_unstorable_character_is_printable() -> None:
    """What the fast paths of storable_text and of the extras' names rely on: a printable text
    holds nothing storable_text would remove."""
    unstorable = [chr(c) for c in range(0x110000) if _UNSTORABLE.search(chr(c))]
    assert len(unstorable) == 0x20 + 0x21 + 0x800
    assert not any(c.isprintable() for c in unstorable)
    assert storable_text("qwen3-5-9b") == "qwen3-5-9b"
    assert storable_text("qwen\x00 3\ud800") == "qwen 3"
    assert storable_text("m" * 9, limit=4) == "mmmm"


@pytest.mark.parametrize("subject_id", [None, uuid.uuid4()])
def test_log_fields_are_the_record_as_json_ready_fields_in_field_order(
    subject_id: uuid.UUID | None,
) -> None:
    record = usage_record(subject_id=subject_id, provider_extras={"p.x": 0.5})
    expected = attrs.asdict(record, recurse=False)
    expected.update(
        occurred_at=record.occurred_at.isoformat(),
        api_key_id=str(record.api_key_id),
        subject_id=None if subject_id is None else str(subject_id),
        event_id=str(record.event_id),
        provider_extras={"p.x": 0.5},
    )
    fields = record.log_fields()
    assert list(fields.items()) == list(expected.items())
    assert record.log_fields() == fields  # made afresh each time (the ids' texts remembered)
    assert fields is not record.log_fields()
