"""What a finished request is charged: the provider's reported usage, or an estimate when none came,
priced by the price table when the provider reported no cost."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from llmgw.accounting.price import Metered, Price
from llmgw.accounting.usage import MAX_TOKENS, Usage

__all__ = ["ESTIMATED", "REPORTED", "Charged", "charge"]

REPORTED = "reported"
ESTIMATED = "estimated"


@attrs.frozen(slots=True)
class Charged:
    usage: Usage
    source: str  # REPORTED or ESTIMATED
    cost_computed: bool  # the cost is the price table's, not the provider's


def charge(
    reported: Usage | None,
    *,
    provider_worked: bool,
    estimate: Callable[[], tuple[int, int]],
    price: Callable[[], Price | None],
    metered: Metered | None = None,
) -> Charged:
    """``provider_worked``: the provider accepted the request (a 2xx, an opened stream), so it
    bills it whether or not it reported usage; ``estimate`` gives (input, output) tokens then.
    ``price`` is looked up only when the provider reported no cost. ``metered``: a media call is
    priced by what it is billed by (images, audio seconds, characters), not by tokens."""
    usage, source = reported or Usage(), REPORTED
    if provider_worked and usage.input_tokens is None and usage.output_tokens is None:
        input_tokens, output_tokens = estimate()
        usage = attrs.evolve(usage, input_tokens=input_tokens, output_tokens=output_tokens)
        source = ESTIMATED
    counts = (
        usage.input_tokens, usage.output_tokens, usage.cache_read_input_tokens,
        usage.cache_creation_input_tokens, usage.cache_creation_1h_input_tokens,
        usage.reasoning_output_tokens,
    )  # fmt: skip
    # Counts the record will drop as impossible price nothing (the row is flagged instead).
    sane = all(count is None or 0 <= count <= MAX_TOKENS for count in counts)
    found = None if usage.cost_usd is not None or not provider_worked or not sane else price()
    if found is None:
        return Charged(usage, source, cost_computed=False)
    cost = found.bill(usage) if metered is None else found.media_cost(metered)
    if cost is None:
        return Charged(usage, source, cost_computed=False)
    # A float for the record: the ledger stores its shortest decimal spelling (cost_decimal),
    # which is the exact bill whenever it has at most 15 significant digits.
    return Charged(attrs.evolve(usage, cost_usd=float(cost)), source, cost_computed=True)
