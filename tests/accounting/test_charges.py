"""What a finished request is charged: reported usage, else an estimate; priced when no cost came."""

from __future__ import annotations

import math
from decimal import Decimal

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.accounting.charges import _kept, _usable, charge
from llmgw.accounting.price import Metered, Price
from llmgw.accounting.usage import MAX_COST, MAX_TOKENS, Usage

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


def test_impossible_counts_and_costs_are_the_estimate_and_the_price_flagged() -> None:
    reported = Usage(input_tokens=-5, output_tokens=2**40, cost_usd=1e18)
    charged = charge(reported, provider_worked=True, estimate=lambda: (7, 3), price=lambda: PRICE)
    assert (charged.usage.input_tokens, charged.usage.output_tokens) == (7, 3)
    assert (charged.usage.cost_usd, charged.cost_computed) == (13e-6, True)
    assert charged.source == "estimated"
    assert charged.flags == (
        "input_tokens:out_of_range", "output_tokens:out_of_range", "cost_usd:out_of_range",
    )  # fmt: skip


def test_only_the_count_that_cannot_be_kept_is_estimated() -> None:
    reported = Usage(input_tokens=-1000, output_tokens=4, cache_read_input_tokens=50)
    charged = charge(reported, provider_worked=True, estimate=lambda: (7, 3), price=lambda: None)
    # The estimate is never below the parts reported.
    assert charged.usage == Usage(input_tokens=50, output_tokens=4, cache_read_input_tokens=50)
    assert (charged.source, charged.flags) == ("estimated", ("input_tokens:out_of_range",))


def test_a_stream_without_its_final_usage_bills_the_larger_output() -> None:
    opening = Usage(input_tokens=100, output_tokens=1)
    charged = charge(
        opening, provider_worked=True, estimate=lambda: (9, 250), price=lambda: None, final=False
    )
    assert (charged.usage, charged.source) == (Usage(100, 250), "estimated")
    more = Usage(input_tokens=100, output_tokens=400)
    charged = charge(
        more, provider_worked=True, estimate=lambda: (9, 250), price=lambda: None, final=False
    )
    assert (charged.usage, charged.source) == (Usage(100, 400), "estimated")


def test_a_missing_output_is_estimated_when_output_was_produced() -> None:
    charged = charge(Usage(input_tokens=5), provider_worked=True, estimate=lambda: (9, 4),
                     price=lambda: None)  # fmt: skip
    assert (charged.usage, charged.source) == (Usage(5, 4), "estimated")
    # An embedding reports no output and produced none: nothing to estimate.
    charged = charge(Usage(input_tokens=5), provider_worked=True, estimate=lambda: (9, 0),
                     price=lambda: None)  # fmt: skip
    assert (charged.usage, charged.source) == (Usage(5), "reported")


def test_parts_that_add_up_to_more_than_their_total_are_flagged() -> None:
    reported = Usage(
        input_tokens=10, output_tokens=5, cache_read_input_tokens=8, cache_creation_input_tokens=4,
        cache_creation_1h_input_tokens=6, reasoning_output_tokens=9,
    )  # fmt: skip
    charged = charge(reported, provider_worked=True, estimate=lambda: (0, 0), price=lambda: None)
    assert charged.usage == reported
    assert charged.flags == (
        "input_tokens:parts_exceed_total", "cache_creation_input_tokens:parts_exceed_total",
        "output_tokens:parts_exceed_total",
    )  # fmt: skip


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


_COUNTS = (
    st.none()
    | st.integers(min_value=-2, max_value=MAX_TOKENS + 2)
    | st.sampled_from([0, 1, 5, 9, MAX_TOKENS, True, 5.0, math.nan])
)
_COSTS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0, 1, MAX_COST, MAX_COST + 1, -1, 0.5, True, Decimal("0.5")]
)


@settings(max_examples=500, deadline=None)
@given(
    usage=st.builds(
        Usage,
        **{field.name: _COUNTS for field in attrs.fields(Usage) if field.name.endswith("tokens")},
        cost_usd=st.none() | _COSTS,
        extras=st.dictionaries(st.sampled_from(["p.a", "p.b"]), _COSTS, max_size=2),
    )
)
def test_usage_is_told_kept_exactly_when_checking_each_figure_keeps_it(usage: Usage) -> None:
    """charge's fast path (_kept) says "kept" only, and always, when its figure-by-figure path
    would keep everything as reported, estimate nothing and flag nothing."""
    checked = _usable(usage, True, lambda: (7, 7), True)
    assert _kept(usage) == (checked == (usage, False, ()))
