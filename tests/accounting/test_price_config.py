"""Prices in LLMGW_CONFIG ([[prices]] and the providers' own keys): validated like every other
key, and given to the price table."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import attrs
import pytest

from llmgw.accounting.price import Price, PriceRule
from llmgw.accounting.prices import configured_prices
from llmgw.config import load_settings
from llmgw.config.prices import PRICE_KEYS
from llmgw.config.providers_file import ProviderConfigError, load_provider_config

PROVIDER = (
    '[[providers]]\nname = "local"\nkind = "openai-compatible"\nbase_url = "http://127.0.0.1:9"\n'
)


def write(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "llmgw.toml"
    path.write_text(PROVIDER + extra)
    return path


def test_a_provider_price_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, "input_usd_per_mtok = 0.15\noutput_usd_per_mtok = 1\n")
    (spec,) = load_provider_config(path, {}).providers
    assert (spec.input_usd_per_mtok, spec.output_usd_per_mtok) == (0.15, 1.0)


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("input_usd_per_mtok = 0.15\n", "set both or neither"),
        ('input_usd_per_mtok = "x"\noutput_usd_per_mtok = 1\n', "expected a number"),
        (
            "input_usd_per_mtok = -1\noutput_usd_per_mtok = 1\n",
            "expected a price of 0 to 10000 USD per million tokens",
        ),
        (
            "input_usd_per_mtok = 1\noutput_usd_per_mtok = inf\n",
            "expected a price of 0 to 10000 USD per million tokens",
        ),
    ],
)
def test_a_bad_price_names_the_entry(tmp_path: Path, extra: str, problem: str) -> None:
    with pytest.raises(ProviderConfigError) as error:
        load_provider_config(write(tmp_path, extra), {})
    assert "providers[0]." in str(error.value)
    assert problem in str(error.value)


PRICES = """
[[prices]]
model = "local:claude-*"
input_usd_per_mtok = 3
output_usd_per_mtok = 15
cache_read_usd_per_mtok = 0.3
cache_write_usd_per_mtok = 3.75
cache_write_1h_usd_per_mtok = 6
reasoning_usd_per_mtok = 15

[[prices]]
model = "*:flux-dev"
image_usd = 0.01
audio_usd_per_second = 0.0001
speech_usd_per_mchar = 15
"""


def test_price_entries_become_rules_with_exact_prices(tmp_path: Path) -> None:
    settings = load_settings({"LLMGW_CONFIG": str(write(tmp_path, PRICES))})
    claude, flux = configured_prices(settings)
    assert claude == PriceRule(
        "local:claude-*",
        Price(3, 15, cache_read_usd_per_mtok=0.3, cache_write_usd_per_mtok=3.75,
              cache_write_1h_usd_per_mtok=6, reasoning_usd_per_mtok=15),
    )  # fmt: skip
    assert flux.price.image_usd == Decimal("0.01")
    assert flux.price.audio_usd_per_second == Decimal("0.0001")  # not the float nearest it
    assert flux.matches("local:flux-dev") and not flux.matches("local:flux-dev-2")


@pytest.mark.parametrize(
    ("entry", "where", "problem"),
    [
        ('image_usd = 1\n', "prices[0].model", "is required"),
        ('model = "local"\nimage_usd = 1\n', "prices[0].model", 'expected "provider:model"'),
        ('model = "other:m"\nimage_usd = 1\n', "prices[0].model", 'unknown provider "other"'),
        ('model = "local:m"\n', "prices[0]", "expected at least one price"),
        ('model = "local:m"\nimage_usd = -1\n', "prices[0].image_usd", "expected a price of 0 to 10000 USD per image"),
        ('model = "local:m"\nimage_usd = true\n', "prices[0].image_usd", "expected a number"),
        ('model = "local:m"\nimage_usd = nan\n', "prices[0].image_usd", "expected a price of 0 to 10000 USD per image"),
        ('model = "local:m"\nimage = 1\n', "prices[0].image", "unknown key"),
        ('model = "local:m"\ninput_usd_per_mtok = 1\n', "prices[0].input_usd_per_mtok",
         "set both or neither"),
        ('model = "local:m"\ncache_read_usd_per_mtok = 1\n', "prices[0].cache_read_usd_per_mtok",
         "needs input_usd_per_mtok"),
    ],
)  # fmt: skip
def test_a_bad_price_entry_names_it(tmp_path: Path, entry: str, where: str, problem: str) -> None:
    with pytest.raises(ProviderConfigError) as error:
        load_provider_config(write(tmp_path, "[[prices]]\n" + entry), {})
    assert f"{where}: " in str(error.value)
    assert problem in str(error.value)


def test_a_pattern_priced_twice_is_refused(tmp_path: Path) -> None:
    twice = '[[prices]]\nmodel = "local:m"\nimage_usd = 1\n' * 2
    with pytest.raises(ProviderConfigError, match=r"prices\[1\].model: .* prices\[0\]"):
        load_provider_config(write(tmp_path, twice), {})


def test_the_file_may_set_every_price_a_price_has() -> None:
    assert set(PRICE_KEYS) == set(attrs.fields_dict(Price)) - {"max_output_tokens"}
