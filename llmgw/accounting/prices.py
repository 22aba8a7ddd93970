"""The price table: each deployment's prices (accounting.price) and maximum output, from the
configuration (``[[prices]]`` rules, providers' own prices) and from providers that publish them
(Venice's ``/models``).

Prices turn a request's worst case into the amount a budget reservation holds, and price the usage
of providers that report tokens but no cost, so every ledger row has a cost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from llmgw.accounting.price import Price, PriceRule
from llmgw.background import cancel_and_wait
from llmgw.config import Settings
from llmgw.config.common import is_price

__all__ = [
    "Price",
    "PriceRule",
    "PriceTable",
    "Publisher",
    "configured_prices",
    "parse_venice_models",
    "publishers",
]

log = logging.getLogger(__name__)


def _usd(value: Any) -> float | None:
    usd = value.get("usd") if isinstance(value, dict) else None
    if isinstance(usd, int | float) and not isinstance(usd, bool) and is_price(usd):
        return float(usd)
    return None


def parse_venice_models(document: Any) -> dict[str, Price]:
    """Prices in a Venice ``/models`` listing (``model_spec.pricing``); unpriced models are skipped."""
    prices: dict[str, Price] = {}
    items = document.get("data") if isinstance(document, dict) else None
    for item in items if isinstance(items, list) else []:
        spec = item.get("model_spec") if isinstance(item, dict) else None
        if not isinstance(spec, dict) or not isinstance(item.get("id"), str):
            continue
        pricing = spec.get("pricing")
        if not isinstance(pricing, dict):
            continue
        input_price, output_price = _usd(pricing.get("input")), _usd(pricing.get("output"))
        if input_price is None:
            continue
        max_output = spec.get("maxCompletionTokens")
        prices[item["id"]] = Price(
            input_usd_per_mtok=input_price,
            output_usd_per_mtok=0.0 if output_price is None else output_price,
            cache_read_usd_per_mtok=_usd(pricing.get("cache_input")),
            cache_write_usd_per_mtok=_usd(pricing.get("cache_write")),
            max_output_tokens=max_output
            if isinstance(max_output, int) and not isinstance(max_output, bool) and max_output > 0
            else None,
        )
    return prices


def _price(usd: Mapping[str, Any]) -> Price:
    """A [[prices]] entry's prices, by key (llmgw.config.prices.PRICE_KEYS: Price's fields)."""
    return Price(**usd)


def configured_prices(settings: Settings) -> tuple[PriceRule, ...]:
    """The prices LLMGW_CONFIG gives: its [[prices]] entries, then each provider's own
    ``input/output_usd_per_mtok`` as "provider:*" (so an entry for the same pattern wins)."""
    entries = tuple(PriceRule(entry.pattern, _price(entry.usd)) for entry in settings.prices)
    provider_wide = tuple(
        PriceRule(f"{spec.name}:*", Price(spec.input_usd_per_mtok, spec.output_usd_per_mtok))
        for spec in settings.providers
        if spec.input_usd_per_mtok is not None and spec.output_usd_per_mtok is not None
    )
    return (*entries, *provider_wide)


class Publisher(Protocol):
    """A provider as the price table sees it (``llmgw.providers.base.Provider``): accounting sits
    below the adapters, so it names only what it asks of them."""

    name: str
    publishes_prices: bool  # published_prices gives its models' prices

    async def published_prices(self, deadline: float) -> Mapping[str, Price]: ...


def publishers(providers: Sequence[Publisher]) -> tuple[Publisher, ...]:
    """The providers that publish their models' prices (``Provider.publishes_prices``)."""
    return tuple(p for p in providers if p.publishes_prices)


class PriceTable:
    """Configured prices win over published ones: the most specific rule matching a deployment
    (see PriceRule.specificity; among equals, the first) is its price whole, with the model's
    published output limit. Publishers (given to ``start``) are the providers whose listings carry
    prices (Venice), fetched at start and refreshed in the background.
    """

    def __init__(
        self, configured: Sequence[PriceRule] = (), *, refresh_seconds: float = 3600.0
    ) -> None:
        self._configure(configured)
        self._published: dict[tuple[str, str], Price] = {}
        self._publishers: tuple[Publisher, ...] = ()
        self._refresh_seconds = refresh_seconds
        self._refresher: asyncio.Task[None] | None = None
        self._fetched = asyncio.Event()  # the first fetch ended (whatever its result)
        self._reloads: set[asyncio.Task[None]] = set()

    def _configure(self, configured: Sequence[PriceRule]) -> None:
        # sorted() is stable: among rules as specific, the first configured stays first.
        self._rules = sorted(configured, key=lambda rule: rule.specificity, reverse=True)

    def _configured(self, provider: str, model: str) -> Price | None:
        # Not memoized per deployment: a caller's model names are unbounded, the rules are few.
        deployment = f"{provider}:{model}"
        return next((rule.price for rule in self._rules if rule.matches(deployment)), None)

    def price(self, provider: str, model: str) -> Price | None:
        published = self._published.get((provider, model))
        configured = self._configured(provider, model)
        if configured is None:
            return published
        if published is not None and configured.max_output_tokens is None:
            # The operator's price, the model's published output limit.
            return attrs.evolve(configured, max_output_tokens=published.max_output_tokens)
        return configured

    def publish(self, provider: str, prices: Mapping[str, Price]) -> None:
        """Replace what ``provider`` publishes (a fresh listing)."""
        for key in [k for k in self._published if k[0] == provider]:
            del self._published[key]
        self._published.update({(provider, model): p for model, p in prices.items()})

    async def refresh(self, *, timeout: float = 5.0) -> None:
        """Fetch every publisher's listing once; a failure keeps the prices it had."""
        for provider in self._publishers:
            deadline = asyncio.get_running_loop().time() + timeout
            try:
                prices = await provider.published_prices(deadline)
            # A listing fails as its provider's calls do (GatewayError, UpstreamHTTPError), with a
            # body that is no JSON, or as a plugin's adapter may: in the background, whatever it
            # is, it is logged and the prices it had stay.
            except Exception as exc:
                self._listing_failed(provider.name, exc)
                continue
            self.publish(provider.name, prices)

    def _listing_failed(self, provider: str, error: Exception) -> None:
        kept = sum(1 for name, _ in self._published if name == provider)
        if kept:
            log.warning(
                "price table: %s's model listing failed (%s); its %d published prices stay",
                provider,
                error,
                kept,
            )
            return
        # Nothing published yet: an OpenAI-compatible server at VENICE_BASE_URL may have no
        # listing at all, and serve's start-up check already warned about a listing that fails.
        log.debug("price table: %s's model listing failed (%s)", provider, error)

    async def start(self, publishers: Sequence[Publisher] = ()) -> None:
        """Remember the publishers; their listings are fetched when a price is first needed."""
        self._publishers = tuple(publishers)

    def reconfigure(self, configured: Sequence[PriceRule], publishers: Sequence[Publisher]) -> None:
        """A reloaded configuration (SIGHUP): its prices, and the listings of its providers.

        Published prices of providers that are gone are dropped; the new publishers' listings
        are fetched at once, in the background (until then their last published prices stay).
        """
        self._configure(configured)
        self._publishers = tuple(publishers)
        names = {provider.name for provider in self._publishers}
        for key in [k for k in self._published if k[0] not in names]:
            del self._published[key]
        if self._refresher is not None:
            task = asyncio.create_task(self.refresh(), name="llmgw-prices-reload")
            self._reloads.add(task)
            task.add_done_callback(self._reloads.discard)

    async def loaded(self) -> None:
        """Wait (once) for the publishers' listings; afterwards they refresh in the background."""
        self.warm()
        if self._publishers:
            await self._fetched.wait()

    def warm(self) -> None:
        """Start fetching the listings if that has not happened yet; do not wait."""
        if self._refresher is None and self._publishers:
            self._refresher = asyncio.create_task(self._refresh_forever(), name="llmgw-prices")

    async def close(self) -> None:
        for task in self._reloads:
            task.cancel()
        await cancel_and_wait([self._refresher])

    async def _refresh_forever(self) -> None:
        try:
            await self.refresh()
        finally:
            self._fetched.set()
        while True:
            await asyncio.sleep(self._refresh_seconds)
            await self.refresh()
