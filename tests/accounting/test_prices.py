"""The price table: Venice's published prices, configured prices, and what wins."""

from __future__ import annotations

import logging
from decimal import Decimal
from pathlib import Path

import orjson
import pytest
import yaml

from llmgw.accounting.prices import Price, PriceRule, PriceTable, parse_venice_models
from llmgw.accounting.usage import Usage
from llmgw.providers.base import UpstreamHTTPError, UpstreamResponse

RECORDED = Path(__file__).resolve().parents[2] / "../shared/venice/recorded/model_listing"


def test_a_venice_listing_gives_prices_and_output_limits() -> None:
    path = RECORDED / "list_models_smoke.yaml"
    if not path.exists():
        pytest.skip("the recorded Venice traffic is not beside the checkout")
    body = yaml.safe_load(path.read_text())["then"]["body"]
    prices = parse_venice_models(orjson.loads(body))
    flash = prices["gemini-3-6-flash"]
    assert flash == Price(1.875, 9.375, cache_read_usd_per_mtok=0.1875, max_output_tokens=65536)
    cached = Usage(input_tokens=1_000_000, output_tokens=0, cache_read_input_tokens=1_000_000)
    assert flash.bill(cached) == Decimal("0.1875")


def test_a_venice_listing_gives_cache_write_prices() -> None:
    listing = {"data": [{"id": "claude", "model_spec": {"pricing": {"input": {"usd": 3},
        "output": {"usd": 15}, "cache_input": {"usd": 0.3}, "cache_write": {"usd": 3.75}}}}]}  # fmt: skip
    assert parse_venice_models(listing)["claude"] == Price(
        3, 15, cache_read_usd_per_mtok=0.3, cache_write_usd_per_mtok=3.75
    )


def test_unpriced_or_malformed_models_are_skipped() -> None:
    listing = {"data": [{"id": "a", "model_spec": {}}, {"id": "b"}, "junk", {"id": "c",
        "model_spec": {"pricing": {"input": {"usd": -1}, "output": {"usd": 1}}}}]}  # fmt: skip
    assert parse_venice_models(listing) == {}


def test_a_published_price_past_ten_thousand_usd_is_no_price() -> None:
    listing = {"data": [{"id": "absurd", "model_spec": {"pricing": {"input": {"usd": 1e308},
        "output": {"usd": 1}}}}, {"id": "greedy", "model_spec": {"pricing": {"input": {"usd": 1},
        "output": {"usd": 1}, "cache_write": {"usd": 10_001}}}}]}  # fmt: skip
    assert parse_venice_models(listing) == {"greedy": Price(1, 1)}


def test_configured_prices_win_and_cover_a_whole_provider() -> None:
    table = PriceTable(
        [PriceRule("local:*", Price(1.0, 2.0)), PriceRule("venice:m", Price(3.0, 4.0))]
    )
    table.publish("venice", {"m": Price(9.0, 9.0), "n": Price(5.0, 6.0, max_output_tokens=7)})
    assert table.price("local", "anything") == Price(1.0, 2.0)
    assert table.price("venice", "m") == Price(3.0, 4.0)
    assert table.price("venice", "n") == Price(5.0, 6.0, max_output_tokens=7)
    assert table.price("venice", "unknown") is None


def test_the_most_specific_rule_wins_whatever_its_place() -> None:
    table = PriceTable(
        [
            PriceRule("*:*", Price(1, 1)),
            PriceRule("venice:claude-*", Price(2, 2)),
            PriceRule("venice:claude-opus-*", Price(3, 3)),
            PriceRule("venice:claude-opus-4", Price(4, 4)),
            PriceRule("venice:*-opus-*", Price(5, 5)),  # as many literal characters: the first wins
        ]
    )
    table.publish("venice", {"claude-opus-4": Price(9, 9, max_output_tokens=32000)})
    assert table.price("venice", "claude-opus-4") == Price(4, 4, max_output_tokens=32000)
    assert table.price("venice", "claude-opus-5") == Price(3, 3)
    assert table.price("venice", "claude-haiku") == Price(2, 2)
    assert table.price("local", "x") == Price(1, 1)


def test_a_rule_replaces_the_published_price_whole() -> None:
    table = PriceTable([PriceRule("venice:flux", Price(image_usd=0.01))])
    table.publish("venice", {"flux": Price(1, 2, cache_read_usd_per_mtok=0.5)})
    price = table.price("venice", "flux")
    assert price == Price(image_usd=0.01)
    assert price is not None and price.bill(Usage(input_tokens=10, output_tokens=0)) is None


class UnlistedProvider:
    """A publisher whose listing fails (an OpenAI-compatible server with no ``/models``)."""

    name = "venice"
    publishes_prices = True

    def __init__(self, listing: bytes | None = None) -> None:
        self.listing = listing

    async def published_prices(self, deadline: float) -> dict[str, Price]:
        if self.listing is None:
            raise UpstreamHTTPError(UpstreamResponse(404, b"Not Found", "text/plain"))
        return parse_venice_models(orjson.loads(self.listing))


PRICED_LISTING = orjson.dumps({"data": [{"id": "m", "model_spec": {"pricing": {
    "input": {"usd": 1.0}, "output": {"usd": 2.0}}}}]})  # fmt: skip


async def test_a_listing_that_fails_before_any_price_was_published_is_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="llmgw.accounting.prices")
    provider = UnlistedProvider()
    table = PriceTable()
    await table.start([provider])  # type: ignore[list-item]
    await table.refresh()
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    caplog.clear()

    provider.listing = PRICED_LISTING
    await table.refresh()
    provider.listing = None
    await table.refresh()  # now the prices it keeps are stale: that is worth a warning
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "its 1 published prices stay" in warning.getMessage()
    assert table.price("venice", "m") == Price(1.0, 2.0)
