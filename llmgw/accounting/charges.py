"""What a finished request is charged: the provider's reported usage, or an estimate where none
came or what came cannot be kept, priced by the price table when the provider reported no cost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attrs

from llmgw.accounting.price import Metered, Price
from llmgw.accounting.usage import MAX_COST, MAX_TOKENS, Usage

__all__ = ["ESTIMATED", "REPORTED", "Charged", "charge"]

REPORTED = "reported"
ESTIMATED = "estimated"
# The counts a total (input or output) is made of, each a subset of it (see Usage).
_PARTS: Final = (
    ("input_tokens", ("cache_read_input_tokens", "cache_creation_input_tokens")),
    ("cache_creation_input_tokens", ("cache_creation_1h_input_tokens",)),
    ("output_tokens", ("reasoning_output_tokens",)),
)
_COUNTS: Final = (
    "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
    "cache_creation_1h_input_tokens", "reasoning_output_tokens",
)  # fmt: skip


@attrs.frozen(slots=True)
class Charged:
    usage: Usage
    source: str  # REPORTED or ESTIMATED
    cost_computed: bool  # the cost is the price table's, not the provider's
    # "field:reason" for each reported value that was not kept (the record's ``flags``).
    flags: tuple[str, ...] = ()


def charge(
    reported: Usage | None,
    *,
    provider_worked: bool,
    estimate: Callable[[], tuple[int, int]],
    price: Callable[[], Price | None],
    metered: Metered | None = None,
    final: bool = True,
) -> Charged:
    """``provider_worked``: the provider accepted the request (a 2xx, an opened stream), so it
    bills it whether or not it reported usage; ``estimate`` gives (input, output) tokens then.
    ``price`` is looked up only when the provider reported no cost. ``metered``: a media call is
    priced by what it is billed by (images, audio seconds, characters), not by tokens.

    A reported value that is no count (negative, fractional past reading, beyond what a row holds)
    or no cost is dropped and flagged ``field:out_of_range``; an input or output total dropped or
    missing is the estimate instead (never below its reported parts). ``final`` False: the stream
    ended before its final usage (a Messages stream reports 1 output token at its start), so the
    output is the larger of the count so far and the estimate of what was relayed. Parts that
    add up to more than their total are flagged ``total:parts_exceed_total``. Any estimated
    figure makes the whole charge estimated.
    """
    usage, source = reported or Usage(), REPORTED
    flags: tuple[str, ...] = ()
    if not (final and _kept(usage)):
        usage, estimated, flags = _usable(usage, provider_worked, estimate, final)
        source = ESTIMATED if estimated else REPORTED
    found = None if usage.cost_usd is not None or not provider_worked else price()
    if found is None:
        return Charged(usage, source, cost_computed=False, flags=flags)
    cost = found.bill(usage) if metered is None else found.media_cost(metered)
    if cost is None:
        return Charged(usage, source, cost_computed=False, flags=flags)
    # A float for the record: the ledger stores its shortest decimal spelling (cost_decimal),
    # which is the exact bill whenever it has at most 15 significant digits.
    return Charged(
        attrs.evolve(usage, cost_usd=float(cost)), source, cost_computed=True, flags=flags
    )


def _kept(usage: Usage) -> bool:
    """True when every figure of ``usage`` is kept as reported: both totals counts, each part a
    count within its total, each cost a cost (the usual answer, told without building anything).

    _is_count's and _is_cost's tests are written out here: this runs for every request, and a call
    for each figure cost more than the tests. Comparisons are false for NaN, so they say finite.
    """
    total_in, total_out = usage.input_tokens, usage.output_tokens
    if not (type(total_in) is int and type(total_out) is int):
        return False
    if not (0 <= total_in <= MAX_TOKENS and 0 <= total_out <= MAX_TOKENS):
        return False
    read, write = usage.cache_read_input_tokens, usage.cache_creation_input_tokens
    hour, reasoning = usage.cache_creation_1h_input_tokens, usage.reasoning_output_tokens
    for part in (read, write, hour, reasoning):
        if part is not None and not (type(part) is int and 0 <= part <= MAX_TOKENS):
            return False
    if (read or 0) + (write or 0) > total_in or (hour or 0) > (write or 0):
        return False
    if (reasoning or 0) > total_out:
        return False
    extras = usage.extras.values()
    for cost in extras if usage.cost_usd is None else (usage.cost_usd, *extras):
        if not ((type(cost) is float or type(cost) is int) and 0 <= cost <= MAX_COST):
            return False
    return True


def _usable(
    usage: Usage,
    provider_worked: bool,
    estimate: Callable[[], tuple[int, int]],
    final: bool,
) -> tuple[Usage, bool, tuple[str, ...]]:
    """``usage`` with each figure that cannot be kept dropped, and (``provider_worked``) the
    estimate where a total is needed; whether any figure is the estimate's; the flags."""
    values: dict[str, Any] = {field: getattr(usage, field) for field in _COUNTS}
    flags: list[str] = []
    dropped: set[str] = set()
    for field in _COUNTS:
        count = values[field]
        if count is not None and not _is_count(count):
            values[field] = None
            dropped.add(field)
            flags.append(f"{field}:out_of_range")
    cost = usage.cost_usd
    if cost is not None and not _is_cost(cost):
        cost = None
        flags.append("cost_usd:out_of_range")
    extras = {name: value for name, value in usage.extras.items() if _is_cost(value)}
    if len(extras) != len(usage.extras):
        flags.append("provider_extras:out_of_range")
    estimated = provider_worked and _estimate_totals(values, dropped, estimate, final)
    for total, parts in _PARTS:
        if (values[total] or 0) < sum(values[part] or 0 for part in parts):
            flags.append(f"{total}:parts_exceed_total")
    return Usage(**values, cost_usd=cost, extras=extras), estimated, tuple(flags)


def _estimate_totals(
    values: dict[str, Any],
    dropped: set[str],
    estimate: Callable[[], tuple[int, int]],
    final: bool,
) -> bool:
    """Put the estimate where a total is missing, was dropped, or (not ``final``) is short of
    what was relayed; True when any figure is the estimate's."""
    input_tokens, output_tokens = values["input_tokens"], values["output_tokens"]
    if final and input_tokens is not None and output_tokens is not None:
        return False  # the usual case: both totals reported and kept, no estimate made
    nothing = input_tokens is None and output_tokens is None
    estimated_input, estimated_output = estimate()
    estimated = not final
    if input_tokens is None:
        # Every request has input: a missing count is no count (the parts reported stay).
        values["input_tokens"] = max(
            estimated_input, (values["cache_read_input_tokens"] or 0)
            + (values["cache_creation_input_tokens"] or 0),
        )  # fmt: skip
        estimated = True
    if output_tokens is None and (nothing or "output_tokens" in dropped or estimated_output):
        # (Not when nothing was produced: an embedding reports no output and has none.)
        values["output_tokens"] = max(estimated_output, values["reasoning_output_tokens"] or 0)
        estimated = True
    elif output_tokens is not None and not final:
        values["output_tokens"] = max(output_tokens, estimated_output)
    return estimated


def _is_count(value: Any) -> bool:
    return value.__class__ is int and 0 <= value <= MAX_TOKENS


def _is_cost(value: Any) -> bool:
    # Comparisons are false for NaN, so this also says finite.
    return (value.__class__ is float or value.__class__ is int) and 0 <= value <= MAX_COST
