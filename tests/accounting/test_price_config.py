"""Prices in LLMGW_CONFIG: validated like every other key, and given to the price table."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.provider_config import ProviderConfigError, load_provider_config

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
        ("input_usd_per_mtok = -1\noutput_usd_per_mtok = 1\n", "expected a number >= 0"),
        ("input_usd_per_mtok = 1\noutput_usd_per_mtok = inf\n", "expected a number >= 0"),
    ],
)
def test_a_bad_price_names_the_entry(tmp_path: Path, extra: str, problem: str) -> None:
    with pytest.raises(ProviderConfigError) as error:
        load_provider_config(write(tmp_path, extra), {})
    assert "providers[0]." in str(error.value)
    assert problem in str(error.value)
