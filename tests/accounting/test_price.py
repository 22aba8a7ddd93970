"""Every token kind at its own price, exactly; media by what it is billed by (acceptance 4)."""

from __future__ import annotations

from decimal import Decimal

from llmgw.accounting.price import Metered, Price
from llmgw.accounting.usage import anthropic_usage, parse_usage

# Claude Sonnet's list prices: the 5-minute cache write at 1.25x input, the 1-hour one at 2x.
SONNET = Price(
    input_usd_per_mtok=3,
    output_usd_per_mtok=15,
    cache_read_usd_per_mtok=0.3,
    cache_write_usd_per_mtok=3.75,
    cache_write_1h_usd_per_mtok=6,
)
REASONER = Price(0.55, 2.19, cache_read_usd_per_mtok=0.14, reasoning_usd_per_mtok=5)


def test_an_anthropic_answer_bills_each_token_kind_at_its_price() -> None:
    # message_start's usage: input_tokens is only the fresh input (anthropic-messages.md M2).
    usage = anthropic_usage(
        {
            "input_tokens": 1_234,
            "cache_read_input_tokens": 50_000,
            "cache_creation_input_tokens": 7_000,
            "cache_creation": {
                "ephemeral_5m_input_tokens": 3_000,
                "ephemeral_1h_input_tokens": 4_000,
            },
            "output_tokens": 789,
        }
    )
    assert usage.input_tokens == 1_234 + 50_000 + 7_000  # the OpenAI convention
    by_hand = (
        Decimal("1234") * 3
        + Decimal("50000") * Decimal("0.3")
        + Decimal("3000") * Decimal("3.75")
        + Decimal("4000") * 6
        + Decimal("789") * 15
    ) / 1_000_000
    assert SONNET.bill(usage) == by_hand == Decimal("0.065787")


def test_a_one_hour_write_without_its_own_price_is_a_write_and_a_write_is_input() -> None:
    usage = anthropic_usage(
        {"input_tokens": 10, "output_tokens": 0,
         "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 1_000_000}}
    )  # fmt: skip
    assert usage.cache_creation_input_tokens == 1_000_000
    assert Price(1, 2, cache_write_usd_per_mtok=1.25).bill(usage) == Decimal("1.25001")
    assert Price(1, 2).bill(usage) == Decimal("1.00001")


def test_reasoning_priced_apart_is_taken_out_of_the_output() -> None:
    usage = parse_usage(
        {
            "usage": {
                "prompt_tokens": 2_000,
                "completion_tokens": 900,
                "prompt_tokens_details": {"cached_tokens": 1_500},
                "completion_tokens_details": {"reasoning_tokens": 600},
            }
        },
        cost=None,
    )
    assert usage is not None
    by_hand = (
        500 * Decimal("0.55") + 1_500 * Decimal("0.14") + 300 * Decimal("2.19") + 600 * 5
    ) / 1_000_000
    assert REASONER.bill(usage) == by_hand
    # Without a reasoning price, reasoning is output.
    assert (
        Price(0.55, 2.19, cache_read_usd_per_mtok=0.14).bill(usage)
        == (500 * Decimal("0.55") + 1_500 * Decimal("0.14") + 900 * Decimal("2.19")) / 1_000_000
    )


def test_the_worst_case_takes_the_dearest_kind() -> None:
    assert SONNET.worst_cost(1_000_000, 1_000_000) == 6 + 15
    assert REASONER.worst_cost(0, 1_000_000) == 5
    assert Price(image_usd=0.04).worst_cost(1, 1) is None


def test_media_is_billed_by_its_unit() -> None:
    price = Price(image_usd=0.04, audio_usd_per_second=0.0001, speech_usd_per_mchar=15)
    assert price.media_cost(Metered("image", 3)) == Decimal("0.12")
    assert price.media_cost(Metered("audio_second", Decimal("12.5"))) == Decimal("0.00125")
    assert price.media_cost(Metered("speech_char", 1_000)) == Decimal("0.015")
    assert Price(1, 2).media_cost(Metered("image", 1)) is None
