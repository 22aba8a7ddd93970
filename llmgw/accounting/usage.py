"""Token usage and cost as providers report them (OpenAI ``usage``; some add a ``cost`` object, read
by the provider's :class:`CostReport`)."""

from __future__ import annotations

import functools
import math
import operator
import os
import random
import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Final

import attrs

__all__ = [
    "MAX_COST",
    "MAX_EXTRAS",
    "MAX_TEXT_CHARS",
    "MAX_TOKENS",
    "NO_EXTRAS",
    "USAGE_SOURCES",
    "CostReport",
    "Usage",
    "UsageRecord",
    "add_extras",
    "anthropic_usage",
    "cost_decimal",
    "parse_usage",
    "reported_count",
    "reported_usage",
    "storable_text",
]

# What a usage_events row holds (migrations 0003 and 0004): int4 token counts, costs as
# numeric(30,18) (below 10^12), an HTTP status. A cost above MAX_COST is no real request's price;
# bounding each row there also keeps the running totals summed over millions of rows storable.
MAX_TOKENS: Final = 2**31 - 1
MAX_COST: Final = 1_000_000
MAX_TEXT_CHARS: Final = 512
MAX_ATTEMPTS: Final = MAX_TOKENS  # int4, at least 1
USAGE_SOURCES: Final = ("reported", "estimated")
# A provider's figures beyond the core ones (Usage.extras): at most this many per answer, each a
# number within [0, MAX_COST] named by at most MAX_EXTRA_NAME_CHARS printable characters.
MAX_EXTRAS: Final = 16
MAX_EXTRA_NAME_CHARS: Final = 128
NO_EXTRAS: Final[Mapping[str, float]] = MappingProxyType({})
# Postgres text holds no NUL and UTF-8 no lone surrogate; the other control characters are
# storable but never belong in a model name or an id, and would garble an operator's terminal.
_UNSTORABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_COUNT_FIELDS: Final = (
    "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
    "cache_creation_1h_input_tokens", "reasoning_output_tokens",
)  # fmt: skip
_TEXT_FIELDS: Final = (
    "request_id", "response_id", "operation", "provider", "deployment", "model",
    "response_model", "outcome", "error_type", "trace_id", "started_deployment",
)  # fmt: skip


@attrs.frozen(slots=True)
class Usage:
    """Token counts in the OpenAI convention, whatever API reported them: ``input_tokens`` is all
    input, cache reads and writes included (subsets of it); ``output_tokens`` includes the
    reasoning tokens; ``cache_creation_1h_input_tokens`` is the part of the cache writes kept for
    an hour (Anthropic's 1-hour cache, priced apart).

    ``extras``: the figures the provider reported beyond these, by name (its :class:`CostReport`
    names them: Venice's ``venice.cost.usd`` and ``venice.cost.diem``); the core knows none of them.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    reasoning_output_tokens: int | None = None
    cache_creation_1h_input_tokens: int | None = None
    cost_usd: float | None = None
    extras: Mapping[str, float] = NO_EXTRAS


@attrs.frozen(slots=True)
class CostReport:
    """How a provider's answers say what they cost: a ``cost`` object beside ``usage`` whose
    ``usd`` is the answer's cost in US dollars (``Usage.cost_usd``). Every number in it, ``usd``
    included, is also a provider-reported extra named ``{namespace}.{key}``, as reported: the
    ledger keeps them (``provider_extras``) and the span shows them. A provider kind declares
    one (``Provider.cost_report``); Venice's is ``CostReport("venice.cost")``."""

    namespace: str

    def read(self, document: dict[str, Any]) -> tuple[float | None, Mapping[str, float]]:
        """The answer's cost in USD (None: not reported) and its extras (at most MAX_EXTRAS)."""
        cost = _dict(document.get("cost"))
        if not cost:
            return None, NO_EXTRAS
        extras: dict[str, float] = {}
        for key, value in cost.items():
            number = _number(value)
            if number is not None and isinstance(key, str):
                extras[f"{self.namespace}.{key}"] = number
                if len(extras) == MAX_EXTRAS:
                    break
        return _number(cost.get("usd")), extras


def add_extras(total: Mapping[str, float], more: Mapping[str, float]) -> Mapping[str, float]:
    """Two sets of extras summed by name (a continued answer's attempts)."""
    if not more:
        return total
    if not total:
        return more
    summed = dict(total)
    for name, value in more.items():
        summed[name] = summed.get(name, 0) + value
    return summed


_INT64 = 2**63


def _int(value: Any) -> int | None:
    if value is None or value.__class__ is int:
        return value  # what JSON counts are, read without a call
    if isinstance(value, float) and value.is_integer():
        # 1e10 is a count too, and 1e30 one too large: kept (within int64, which is what JSON
        # writers take), so the charge flags what it cannot hold rather than reading it as none.
        return int(min(max(value, -_INT64), _INT64 - 1))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def reported_count(value: Any) -> int | None:
    """A provider's token count as a caller may be shown it: a whole number from 0 to MAX_TOKENS,
    else None, as if it was not reported (a negative, fractional or absurd count is no count)."""
    count = _int(value)
    return count if count is not None and 0 <= count <= MAX_TOKENS else None


def reported_usage(document: dict[str, Any]) -> Usage | None:
    """The usage of a response or chunk as a caller may be shown it: each count that is no count
    dropped as unreported (see reported_count), no cost; None when neither input nor output is."""
    usage = parse_usage(document, cost=None)
    if usage is None:
        return None
    shown = Usage(
        input_tokens=reported_count(usage.input_tokens),
        output_tokens=reported_count(usage.output_tokens),
        cache_read_input_tokens=reported_count(usage.cache_read_input_tokens),
        cache_creation_input_tokens=reported_count(usage.cache_creation_input_tokens),
        reasoning_output_tokens=reported_count(usage.reasoning_output_tokens),
        cache_creation_1h_input_tokens=reported_count(usage.cache_creation_1h_input_tokens),
    )
    return None if shown.input_tokens is None and shown.output_tokens is None else shown


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def parse_usage(document: dict[str, Any], *, cost: CostReport | None) -> Usage | None:
    """Usage from a response, chunk or Responses event; None when it carries none. Its cost and
    extras as ``cost`` reads them (None: the provider reports none)."""
    response = document.get("response")
    if "usage" not in document and isinstance(response, dict):
        document = response  # a Responses stream event: usage rides on its Response object
    usage = document.get("usage")
    if not isinstance(usage, dict):
        return None
    # Chat completions name the counts prompt/completion; the Responses API input/output.
    responses = "prompt_tokens" not in usage and "input_tokens" in usage
    prompt_details = _dict(
        usage.get("input_tokens_details" if responses else "prompt_tokens_details")
    )
    completion_details = _dict(
        usage.get("output_tokens_details" if responses else "completion_tokens_details")
    )
    cost_usd, extras = (None, NO_EXTRAS) if cost is None else cost.read(document)
    cache_read = _int(prompt_details.get("cached_tokens"))
    if cache_read is None:
        cache_read = _int(usage.get("cache_read_input_tokens"))
    # Venice names chat's cache writes cache_creation_input_tokens (in the details, and like its
    # cache reads maybe beside them), OpenAI's Responses SDK cache_write_tokens.
    cache_write = _int(prompt_details.get("cache_creation_input_tokens"))
    if cache_write is None:
        cache_write = _int(prompt_details.get("cache_write_tokens"))
    if cache_write is None:
        cache_write = _int(usage.get("cache_creation_input_tokens"))
    return Usage(
        input_tokens=_int(usage.get("input_tokens" if responses else "prompt_tokens")),
        output_tokens=_int(usage.get("output_tokens" if responses else "completion_tokens")),
        cache_read_input_tokens=cache_read,
        cache_creation_input_tokens=cache_write,
        reasoning_output_tokens=_int(completion_details.get("reasoning_tokens")),
        # An Anthropic answer translated to chat keeps its 1-hour cache writes there (llmgw's own
        # field: chat has none), so they are billed at their own price.
        cache_creation_1h_input_tokens=_int(prompt_details.get("cache_creation_1h_input_tokens")),
        cost_usd=cost_usd,
        extras=extras,
    )


def anthropic_usage(usage: dict[str, Any]) -> Usage:
    """An Anthropic Messages ``usage`` object (a message's, ``message_start``'s or
    ``message_delta``'s) in the OpenAI convention of :class:`Usage`.

    Anthropic's ``input_tokens`` excludes the cache reads and writes (anthropic-messages.md M2), so
    they are added to it; ``cache_creation.ephemeral_1h_input_tokens`` is the 1-hour part of the
    writes. Anthropic counts thinking within ``output_tokens`` without reporting it apart. A part
    that is no count (negative, absurd) makes the input none either: it is the input then, for the
    charge to flag and replace (a sum would hide it: -1000 fresh plus 5000 cache reads looks fine).
    """
    fresh = _int(usage.get("input_tokens"))
    cache_read = _int(usage.get("cache_read_input_tokens"))
    cache_write = _int(usage.get("cache_creation_input_tokens"))
    write_1h = _int(_dict(usage.get("cache_creation")).get("ephemeral_1h_input_tokens"))
    if cache_write is None and write_1h is not None:
        # Only the breakdown: the writes are its two parts.
        five_minutes = _int(_dict(usage.get("cache_creation")).get("ephemeral_5m_input_tokens"))
        cache_write = write_1h + (five_minutes or 0)
    parts = [count for count in (fresh, cache_read, cache_write) if count is not None]
    bad = next((count for count in parts if not 0 <= count <= MAX_TOKENS), None)
    return Usage(
        input_tokens=bad if bad is not None else sum(parts) if parts else None,
        output_tokens=_int(usage.get("output_tokens")),
        cache_read_input_tokens=cache_read,
        cache_creation_input_tokens=cache_write,
        cache_creation_1h_input_tokens=write_1h,
    )


# Event ids are random version-4 UUIDs as uuid.uuid4 makes them, from a generator of this module's
# own instead of os.urandom: the same 122 random bits, without a system call per request. It is
# seeded from os.urandom when the module is imported and again in every child a fork makes (which
# would otherwise repeat its parent's ids), and no other code draws from it or seeds it (a test's
# random.seed does not reach it), so two processes' ids are as unlikely to meet as uuid4's.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)
_VERSION_4: Final = (0x4 << 76) | (0x8 << 60)  # the version and RFC 4122 variant bits
_RANDOM_BITS: Final = (1 << 128) - 1 ^ (0xF << 76) ^ (0xC << 60)


def _event_id() -> uuid.UUID:
    return uuid.UUID(int=_ids.getrandbits(128) & _RANDOM_BITS | _VERSION_4)


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
    status: int | None  # None only when what was given is no HTTP status (flagged)
    outcome: str
    error_type: str | None
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    duration_ms: float
    time_to_first_chunk_ms: float | None
    trace_id: str | None
    usage_source: str = "reported"  # or "estimated": computed by the gateway, not the provider's
    cost_computed: bool = False  # the cost is from the price table, not the provider
    # The token kinds priced apart, each a part of input_tokens or output_tokens (see Usage).
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_creation_1h_input_tokens: int | None = None
    reasoning_output_tokens: int | None = None
    # Deployment attempts whose tokens the row counts: more than 1 when a stream that broke
    # mid-answer was finished on another (``deployment`` names the one that finished it).
    attempts: int = 1
    # A continued stream's deployment that began the answer (``deployment`` finished it).
    started_deployment: str | None = None
    # Every upstream attempt, in order, and how it ended (``accounting.attempts.Attempt.as_json``).
    attempt_log: tuple[dict[str, Any], ...] = ()
    # Answered by the response cache: no provider was paid (cost 0), and ``saved_cost_usd`` is
    # what the stored answer cost when it was fetched.
    cache_hit: bool = False
    saved_cost_usd: float | None = None
    # The figures the providers reported beyond the core ones, by name, summed over the attempts
    # (``Usage.extras``; none on a cache hit: no provider was paid).
    provider_extras: Mapping[str, float] = NO_EXTRAS
    # "field:reason" for every value the constructor had to drop or change to make the row storable.
    flags: tuple[str, ...] = ()
    # The row's identity: a record written twice (a spool replayed after a crash) is stored once.
    event_id: uuid.UUID = attrs.field(factory=_event_id)

    def __attrs_post_init__(self) -> None:
        # The constructor is the one place every record passes, so no caller (and no provider's
        # answer) can produce a row the ledger cannot store: each field is bounded here, a value
        # that cannot be kept is dropped from its field, and the row says so in ``flags``.
        if not _storable(self):
            self._bound()

    def _bound(self) -> None:
        flags = list(self.flags)

        def replace(field: str, value: Any, reason: str) -> None:
            object.__setattr__(self, field, value)
            flag = f"{field}:{reason}"
            if flag not in flags:
                flags.append(flag)

        for field in _TEXT_FIELDS:
            text = getattr(self, field)
            if text is None:
                continue
            if not isinstance(text, str):
                replace(field, storable_text(str(text)), "not_text")
            elif text.isprintable() and len(text) <= MAX_TEXT_CHARS:
                continue  # the common case, checked in C: nothing to remove
            elif (bounded := storable_text(text)) != text:
                reason = "truncated" if _UNSTORABLE.search(text) is None else "control_characters"
                replace(field, bounded, reason)
        for field in _COUNT_FIELDS:
            count = getattr(self, field)
            if count is not None and not _is_int_within(count, 0, MAX_TOKENS):
                replace(field, None, "out_of_range")
        for field in ("cost_usd", "saved_cost_usd"):
            cost = getattr(self, field)
            if cost is not None and not _is_number_within(cost, MAX_COST):
                replace(field, None, "out_of_range")
        extras = self.provider_extras
        kept = {
            name: value
            for name, value in list(extras.items())[:MAX_EXTRAS]
            if _is_extra_name(name) and _is_number_within(value, MAX_COST)
        }
        if len(kept) != len(extras):
            replace("provider_extras", kept, "out_of_range")
        if self.status is not None and not _is_int_within(self.status, 100, 599):
            replace("status", None, "out_of_range")
        if not _is_number_within(self.duration_ms, math.inf):
            replace("duration_ms", 0.0, "out_of_range")
        ttfc = self.time_to_first_chunk_ms
        if ttfc is not None and not _is_number_within(ttfc, math.inf):
            replace("time_to_first_chunk_ms", None, "out_of_range")
        if not _is_int_within(self.attempts, 1, MAX_ATTEMPTS):
            replace("attempts", 1, "out_of_range")
        if self.usage_source not in USAGE_SOURCES:
            replace("usage_source", "estimated", "unknown")
        if len(flags) != len(self.flags):
            object.__setattr__(self, "flags", tuple(flags))

    def log_fields(self) -> dict[str, Any]:
        """The record as JSON-ready fields (ids and times as strings)."""
        # attrs.asdict(self, recurse=False), without its per-field Python loop (one per request),
        # into a copy of a dict that holds every name already: filled in C, never resized.
        fields = _EVERY_FIELD.copy()
        fields.update(zip(_FIELD_NAMES, _field_values(self), strict=True))
        fields["occurred_at"] = self.occurred_at.isoformat()
        fields["api_key_id"] = _id_text(self.api_key_id)
        fields["subject_id"] = None if self.subject_id is None else _id_text(self.subject_id)
        fields["event_id"] = str(self.event_id)
        fields["provider_extras"] = dict(self.provider_extras)
        return fields


_FIELD_NAMES: Final = tuple(field.name for field in attrs.fields(UsageRecord))
_field_values: Final = operator.attrgetter(*_FIELD_NAMES)
_EVERY_FIELD: Final = dict.fromkeys(_FIELD_NAMES)
# A key's and a subject's id are the same on every request of theirs: their text is made once.
_id_text: Final = functools.lru_cache(maxsize=4096)(str)
_text_values: Final = operator.attrgetter(*_TEXT_FIELDS)
_count_values: Final = operator.attrgetter(*_COUNT_FIELDS)


def _storable(record: UsageRecord) -> bool:
    """True when ``_bound`` would change nothing: every field already what a row holds.

    The usual record (a request that went as expected), told with a few comparisons instead of
    ``_bound``'s checks of each field; exact types only, anything else (a subclass, a Decimal, a
    value out of range) is left to ``_bound``. Comparisons are false for NaN, so ``0 <= x < inf``
    also says finite.
    """
    for text in _text_values(record):
        if text is not None and (
            text.__class__ is not str or len(text) > MAX_TEXT_CHARS or not text.isprintable()
        ):
            return False
    for count in _count_values(record):
        if count is not None and (count.__class__ is not int or not 0 <= count <= MAX_TOKENS):
            return False
    for cost in (record.cost_usd, record.saved_cost_usd, *record.provider_extras.values()):
        if cost is not None and (
            (cost.__class__ is not float and cost.__class__ is not int) or not 0 <= cost <= MAX_COST
        ):
            return False
    extras = record.provider_extras
    if len(extras) > MAX_EXTRAS or not all(map(_is_extra_name, extras)):
        return False
    status, duration, ttfc = record.status, record.duration_ms, record.time_to_first_chunk_ms
    return (
        (status is None or (status.__class__ is int and 100 <= status <= 599))
        and (duration.__class__ is float or duration.__class__ is int)
        and 0 <= duration < math.inf
        and (
            ttfc is None
            or ((ttfc.__class__ is float or ttfc.__class__ is int) and 0 <= ttfc < math.inf)
        )
        and record.attempts.__class__ is int
        and 1 <= record.attempts <= MAX_ATTEMPTS
        and record.usage_source in USAGE_SOURCES
    )


def cost_decimal(value: float) -> Decimal:
    """A cost as the exact decimal the provider wrote.

    str() of a float is the shortest text that reads back as it, so a cost written with up to 15
    significant digits (Venice's 0.00010471875) becomes that very decimal, not the float's binary
    expansion.
    """
    return Decimal(str(value))


def storable_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` without what Postgres cannot (or should not) hold, at most ``limit`` long."""
    if text.__class__ is str and len(text) <= limit and text.isprintable():
        return text  # the usual text, told in C: no character of _UNSTORABLE is printable
    return _UNSTORABLE.sub("", text)[:limit]


def _is_extra_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_EXTRA_NAME_CHARS
        and name.isprintable()  # so none of _UNSTORABLE's characters, which are not
    )


def _is_int_within(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_number_within(value: Any, high: float) -> bool:
    """A finite, non-negative int, float or Decimal no greater than ``high``."""
    if isinstance(value, Decimal):
        finite = value.is_finite()  # math.isfinite raises on a signalling NaN
    elif isinstance(value, float):
        finite = math.isfinite(value)
    else:
        finite = isinstance(value, int) and not isinstance(value, bool)
    return finite and 0 <= value <= high
