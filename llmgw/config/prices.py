"""The ``[[prices]]`` entries of LLMGW_CONFIG: one price per deployment pattern.

    [[prices]]
    model = "anthropic:claude-sonnet-4-5"  # "provider:model"; "*" matches any characters
    input_usd_per_mtok = 3                 # USD per million tokens
    output_usd_per_mtok = 15
    cache_read_usd_per_mtok = 0.30         # optional; default: the input price
    cache_write_usd_per_mtok = 3.75        # optional; default: the input price
    cache_write_1h_usd_per_mtok = 6        # optional; default: the cache write price
    reasoning_usd_per_mtok = 15            # optional; default: the output price

    [[prices]]
    model = "venice:flux-*"
    image_usd = 0.01                       # per image returned
    # audio_usd_per_second (transcriptions), speech_usd_per_mchar (per million characters spoken)

Each problem is reported through ``fail(where, problem)`` naming the entry and key
(``prices[2].image_usd``), like the rest of the file. An entry is data (:class:`PriceEntry`);
``llmgw.accounting.prices`` turns it into the price it charges.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, NoReturn

import attrs

from llmgw.config.common import is_price, price_expected
from llmgw.config.converter import show

__all__ = ["PRICE_KEYS", "PriceEntry", "parse_prices"]

# The prices an entry may set: the fields of llmgw.accounting.price.Price (a test holds them equal).
PRICE_KEYS = (
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    "cache_read_usd_per_mtok",
    "cache_write_usd_per_mtok",
    "cache_write_1h_usd_per_mtok",
    "reasoning_usd_per_mtok",
    "image_usd",
    "audio_usd_per_second",
    "speech_usd_per_mchar",
)
_TOKEN_EXTRAS = (
    "cache_read_usd_per_mtok",
    "cache_write_usd_per_mtok",
    "cache_write_1h_usd_per_mtok",
    "reasoning_usd_per_mtok",
)

Fail = Callable[[str, str], NoReturn]


@attrs.frozen
class PriceEntry:
    """A ``[[prices]]`` entry: the deployments it prices and its prices in USD, exact, by key
    (those of :data:`PRICE_KEYS` it sets)."""

    pattern: str  # "provider:model"; "*" matches any characters
    usd: Mapping[str, Decimal]


def parse_prices(
    tables: Sequence[dict[str, Any]], fail: Fail, providers: Sequence[str]
) -> tuple[PriceEntry, ...]:
    """The entries, in file order; ``providers``: the configured provider names."""
    rules: list[PriceEntry] = []
    first_seen: dict[str, int] = {}
    for index, table in enumerate(tables):
        where = f"prices[{index}]"
        rule = _rule(table, where, fail, providers)
        if rule.pattern in first_seen:
            fail(
                f"{where}.model",
                f"{show(rule.pattern)} is already priced by prices[{first_seen[rule.pattern]}]",
            )
        first_seen[rule.pattern] = index
        rules.append(rule)
    return tuple(rules)


def _rule(table: dict[str, Any], where: str, fail: Fail, providers: Sequence[str]) -> PriceEntry:
    for key in table:
        if key != "model" and key not in PRICE_KEYS:
            fail(f"{where}.{key}", f"unknown key; expected one of model, {', '.join(PRICE_KEYS)}")
    pattern = _pattern(table.get("model"), f"{where}.model", fail, providers)
    prices: dict[str, Decimal] = {
        key: _usd(table[key], f"{where}.{key}", fail) for key in PRICE_KEYS if key in table
    }
    if not prices:
        fail(where, f"expected at least one price: {', '.join(PRICE_KEYS)}")
    priced_tokens = ("input_usd_per_mtok" in prices) + ("output_usd_per_mtok" in prices)
    if priced_tokens == 1:
        fail(
            f"{where}.input_usd_per_mtok",
            "input_usd_per_mtok and output_usd_per_mtok go together; set both or neither",
        )
    for key in _TOKEN_EXTRAS:
        if key in prices and not priced_tokens:
            fail(f"{where}.{key}", "needs input_usd_per_mtok and output_usd_per_mtok too")
    return PriceEntry(pattern, prices)


def _pattern(value: Any, where: str, fail: Fail, providers: Sequence[str]) -> str:
    if value is None:
        fail(where, 'is required: "provider:model" (a "*" matches any characters)')
    provider, sep, model = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not sep or not provider or not model or value != value.strip():
        fail(where, f'expected "provider:model", got {show(value)}')
    if "*" not in provider and provider not in providers:
        known = ", ".join(show(name) for name in providers)
        fail(where, f"unknown provider {show(provider)} in {show(value)}; providers are {known}")
    pattern: str = value
    return pattern


def _usd(value: Any, where: str, fail: Fail) -> Decimal:
    # bool is an int to Python, not to TOML; inf and nan are TOML floats but no price.
    if not isinstance(value, int | float) or isinstance(value, bool):
        fail(where, f"expected a number, got {show(value)}")
    if not is_price(value):
        fail(where, f"expected {price_expected(where)}, got {show(value)}")
    return Decimal(str(value))  # the price as written: 0.1 is a tenth, not the float nearest it
