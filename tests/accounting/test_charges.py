"""What a finished request is charged: reported usage, else an estimate; priced when no cost came."""

from __future__ import annotations

from llmgw.accounting.charges import charge
from llmgw.accounting.price import Metered, Price
from llmgw.accounting.usage import Usage

PRICE = Price(1.0, 2.0)


def test_reported_usage_and_cost_are_kept() -> None:
    reported = Usage(input_tokens=3, output_tokens=5, cost_usd=0.5)
    charged = charge(reported, provider_worked=True, estimate=lambda: (9, 9), price=lambda: PRICE)
    assert (charged.usage, charged.source, charged.cost_computed) == (reported, "reported", False)


def test_an_upstream_that_reports_no_usage_is_charged_an_estimate() -> None:
    charged = charge(None, provider_worked=True, estimate=lambda: (10, 20), price=lambda: PRICE)
    assert (charged.usage.input_tokens, charged.usage.output_tokens) == (10, 20)
    assert charged.usage.cost_usd == 50e-6
    assert (charged.source, charged.cost_computed) == ("estimated", True)


def test_tokens_without_a_cost_are_priced() -> None:
    charged = charge(
        Usage(input_tokens=1, output_tokens=1), provider_worked=True, estimate=lambda: (0, 0),
        price=lambda: PRICE,
    )  # fmt: skip
    assert charged.usage.cost_usd == 3e-6
    assert (charged.source, charged.cost_computed) == ("reported", True)


def test_a_request_the_provider_never_accepted_costs_nothing() -> None:
    def unused() -> Price:
        raise AssertionError("no price is looked up")

    charged = charge(None, provider_worked=False, estimate=lambda: (1, 1), price=unused)
    assert charged.usage == Usage()
    assert charged.source == "reported"


def test_impossible_token_counts_are_not_priced() -> None:
    reported = Usage(input_tokens=-5, output_tokens=2**40)
    charged = charge(reported, provider_worked=True, estimate=lambda: (0, 0), price=lambda: PRICE)
    assert (charged.usage, charged.cost_computed) == (reported, False)


def test_a_media_call_is_priced_by_what_it_returned_not_by_tokens() -> None:
    price = Price(1.0, 2.0, image_usd=0.04)
    charged = charge(
        None, provider_worked=True, estimate=lambda: (10, 0), price=lambda: price,
        metered=Metered("image", 3),
    )  # fmt: skip
    assert charged.usage.cost_usd == 0.12
    assert charged.cost_computed


def test_a_media_call_without_its_price_has_no_cost() -> None:
    charged = charge(
        None, provider_worked=True, estimate=lambda: (10, 0), price=lambda: PRICE,
        metered=Metered("audio_second", 3),
    )  # fmt: skip
    assert (charged.usage.cost_usd, charged.cost_computed) == (None, False)
