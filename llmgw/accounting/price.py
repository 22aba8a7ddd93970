"""A model's prices, exact, and what they charge: each token kind at its own price, media calls by
what they are billed by. Configured as [[prices]] entries (config.prices); looked up in
the price table (accounting.prices)."""

from __future__ import annotations

import functools
import re
from decimal import Decimal
from typing import Literal

import attrs

from llmgw.accounting.usage import Usage

__all__ = ["Metered", "MeteredUnit", "Price", "PriceRule"]

_MILLION = Decimal(1_000_000)  # token prices are per million tokens, speech per million characters


def _exact(value: float | Decimal | None) -> Decimal | None:
    """A price as the decimal it was written as (str() of a float is its shortest spelling)."""
    return None if value is None else value if isinstance(value, Decimal) else Decimal(str(value))


@attrs.frozen(slots=True)
class Price:
    """A model's prices in USD, as exact decimals. A token kind without a price of its own is
    billed at the price it is a kind of: cache reads and writes at the input price, a 1-hour
    cache write at the (5-minute) write price, reasoning at the output price. None for input and
    output: tokens are not priced (a media model's entry)."""

    input_usd_per_mtok: Decimal | None = attrs.field(default=None, converter=_exact)
    output_usd_per_mtok: Decimal | None = attrs.field(default=None, converter=_exact)
    cache_read_usd_per_mtok: Decimal | None = attrs.field(default=None, converter=_exact)
    cache_write_usd_per_mtok: Decimal | None = attrs.field(default=None, converter=_exact)
    cache_write_1h_usd_per_mtok: Decimal | None = attrs.field(default=None, converter=_exact)
    reasoning_usd_per_mtok: Decimal | None = attrs.field(default=None, converter=_exact)
    image_usd: Decimal | None = attrs.field(default=None, converter=_exact)
    audio_usd_per_second: Decimal | None = attrs.field(default=None, converter=_exact)
    speech_usd_per_mchar: Decimal | None = attrs.field(default=None, converter=_exact)
    max_output_tokens: int | None = None  # the model's own limit, where published

    def bill(self, usage: Usage) -> Decimal | None:
        """USD for every token kind ``usage`` reports, each at its own price; None when tokens
        are not priced. ``usage`` follows the OpenAI convention: input tokens include the cache
        reads and writes, output tokens the reasoning ones (accounting.usage.Usage)."""
        input_price, output_price = self.input_usd_per_mtok, self.output_usd_per_mtok
        if input_price is None or output_price is None:
            return None
        write_price = _first(self.cache_write_usd_per_mtok, input_price)
        cache_read = _count(usage.cache_read_input_tokens)
        cache_write = _count(usage.cache_creation_input_tokens)
        write_1h = min(_count(usage.cache_creation_1h_input_tokens), cache_write)
        # A provider reporting more cached than input tokens bills the cached ones as reported.
        fresh = max(0, _count(usage.input_tokens) - cache_read - cache_write)
        output = _count(usage.output_tokens)
        reasoning = 0
        if self.reasoning_usd_per_mtok is not None:
            reasoning = min(_count(usage.reasoning_output_tokens), output)
        return (
            fresh * input_price
            + cache_read * _first(self.cache_read_usd_per_mtok, input_price)
            + (cache_write - write_1h) * write_price
            + write_1h * _first(self.cache_write_1h_usd_per_mtok, write_price)
            + (output - reasoning) * output_price
            + reasoning * _first(self.reasoning_usd_per_mtok, output_price)
        ) / _MILLION

    def worst_cost(self, input_tokens: int, output_tokens: int) -> float | None:
        """The most ``input_tokens`` and ``output_tokens`` can cost, whichever kinds they turn out
        to be (a cache write may cost more than fresh input); None when tokens are not priced."""
        input_price, output_price = self.input_usd_per_mtok, self.output_usd_per_mtok
        if input_price is None or output_price is None:
            return None
        input_prices = (
            input_price, self.cache_read_usd_per_mtok, self.cache_write_usd_per_mtok,
            self.cache_write_1h_usd_per_mtok,
        )  # fmt: skip
        output_prices = (output_price, self.reasoning_usd_per_mtok)
        return float(
            (
                input_tokens * max(p for p in input_prices if p is not None)
                + output_tokens * max(p for p in output_prices if p is not None)
            )
            / _MILLION
        )

    def media_cost(self, metered: Metered) -> Decimal | None:
        """USD for a media call's quantity; None when this model has no price for it."""
        unit_price = {
            "image": self.image_usd,
            "audio_second": self.audio_usd_per_second,
            "speech_char": None
            if self.speech_usd_per_mchar is None
            else self.speech_usd_per_mchar / _MILLION,
        }[metered.unit]
        return None if unit_price is None else metered.amount * unit_price


MeteredUnit = Literal["image", "audio_second", "speech_char"]


@attrs.frozen(slots=True)
class Metered:
    """What a media call is billed by: images returned, seconds of audio transcribed, characters
    of text spoken."""

    unit: MeteredUnit
    amount: Decimal = attrs.field(converter=Decimal)


def _first(price: Decimal | None, fallback: Decimal) -> Decimal:
    return fallback if price is None else price


def _count(count: int | None) -> int:
    return max(0, count or 0)


@attrs.frozen(slots=True)
class PriceRule:
    """A configured price for the deployments ``pattern`` ("provider:model", ``*`` matching any
    characters) names."""

    pattern: str
    price: Price

    def matches(self, deployment: str) -> bool:
        return _glob(self.pattern).fullmatch(deployment) is not None

    @property
    def specificity(self) -> tuple[bool, int]:
        """Higher wins: an exact name over any glob, then the glob with more literal characters."""
        return "*" not in self.pattern, len(self.pattern.replace("*", ""))


@functools.cache  # the configured patterns: few, compiled once
def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))
