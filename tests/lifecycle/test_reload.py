"""SIGHUP's reload: new requests get the new providers, the old ones close once no request uses them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from llmgw.accounting.prices import Price, PriceRule, PriceTable
from llmgw.api.models import ModelListCache
from llmgw.config import Settings
from llmgw.lifecycle.reload import ConfigReloader, RequestGenerations
from llmgw.routing.registry import ProviderRegistry


class StubProvider:
    publishes_prices = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def registry_of(name: str) -> ProviderRegistry:
    return ProviderRegistry([StubProvider(name)])  # type: ignore[list-item]


def builds(name: str) -> Callable[[Settings], Awaitable[ProviderRegistry]]:
    async def build(_settings: Settings) -> ProviderRegistry:
        return registry_of(name)

    return build


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("LLMGW_CONFIG", "DATABASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("VENICE_API_KEY", "unused")


async def test_old_providers_close_when_the_last_request_that_may_use_them_ends(
    environment: None,
) -> None:
    built: list[ProviderRegistry] = []

    async def build(_settings: Settings) -> ProviderRegistry:
        built.append(registry_of(f"new-{len(built)}"))
        return built[-1]

    registry = registry_of("old")
    (old,) = registry.providers
    generations = RequestGenerations()
    reloader = ConfigReloader(registry, build, ModelListCache(), generations)
    in_flight = generations.enter()
    assert await reloader.reload() is True
    assert [p.name for p in registry.providers] == ["new-0"]
    await asyncio.sleep(0.01)
    assert not old.closed, "a request that started before the reload may still use it"
    in_flight.leave()
    await reloader.close()
    assert old.closed
    assert not registry.providers[0].closed  # type: ignore[attr-defined]


async def test_an_invalid_file_keeps_the_running_configuration(
    environment: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = tmp_path / "llmgw.toml"
    config.write_text("[[providers]]\nname = 'unterminated\n")
    monkeypatch.setenv("LLMGW_CONFIG", str(config))
    registry = registry_of("running")
    reloader = ConfigReloader(registry, builds("never"), ModelListCache(), RequestGenerations())
    with caplog.at_level(logging.ERROR, logger="llmgw.lifecycle.reload"):
        assert await reloader.reload() is False
    assert [p.name for p in registry.providers] == ["running"]
    assert "configuration reload failed, the running configuration stays" in caplog.text
    assert str(config) in caplog.text


async def test_a_reload_brings_the_new_files_prices(
    environment: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "llmgw.toml"
    config.write_text(
        "[[providers]]\n"
        'name = "local"\n'
        'kind = "openai-compatible"\n'
        'base_url = "http://127.0.0.1:9/v1"\n'
        "input_usd_per_mtok = 0.5\n"
        "output_usd_per_mtok = 2.0\n"
    )
    monkeypatch.setenv("LLMGW_CONFIG", str(config))
    prices = PriceTable([PriceRule("local:*", Price(9.0, 9.0))])
    reloader = ConfigReloader(
        registry_of("local"),
        builds("local"),
        ModelListCache(),
        RequestGenerations(),
        prices,
    )
    assert await reloader.reload() is True
    assert prices.price("local", "any-model") == Price(0.5, 2.0)
    config.write_text(config.read_text().replace("2.0", "3.0"))
    assert await reloader.reload() is True
    assert prices.price("local", "any-model") == Price(0.5, 3.0)
    await reloader.close()
    await prices.close()
