"""LLMGW_CONFIG's per-provider timeouts: read, validated, defaulted, never longer than an attempt."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.provider_config import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FIRST_TOKEN_TIMEOUT,
    DEFAULT_STALL_TIMEOUT,
    ProviderConfigError,
    load_provider_config,
)
from llmgw.providers.plugin import Timeouts

PROVIDER = (
    '[[providers]]\nname = "local"\nkind = "openai-compatible"\nbase_url = "http://127.0.0.1:9"\n'
)
REQUEST_TIMEOUT = 120.0


def timeouts(tmp_path: Path, extra: str) -> Timeouts:
    path = tmp_path / "llmgw.toml"
    path.write_text(PROVIDER + extra)
    (spec,) = load_provider_config(path, {}).providers
    return spec.timeouts(REQUEST_TIMEOUT)


def test_each_timeout_is_read(tmp_path: Path) -> None:
    extra = (
        "timeout_seconds = 40\nconnect_timeout_seconds = 2\n"
        "first_token_timeout_seconds = 15\nstall_timeout_seconds = 7.5\n"
    )
    assert timeouts(tmp_path, extra) == Timeouts(attempt=40, connect=2, first_token=15, stall=7.5)


def test_unset_timeouts_take_the_production_defaults(tmp_path: Path) -> None:
    assert timeouts(tmp_path, "") == Timeouts(
        attempt=REQUEST_TIMEOUT,
        connect=DEFAULT_CONNECT_TIMEOUT,
        first_token=DEFAULT_FIRST_TOKEN_TIMEOUT,
        stall=DEFAULT_STALL_TIMEOUT,
    )


def test_no_phase_outlasts_one_attempt(tmp_path: Path) -> None:
    found = timeouts(tmp_path, "timeout_seconds = 3\nstall_timeout_seconds = 10\n")
    assert found == Timeouts(attempt=3, connect=3, first_token=3, stall=3)


@pytest.mark.parametrize(
    "key",
    [
        "timeout_seconds",
        "connect_timeout_seconds",
        "first_token_timeout_seconds",
        "stall_timeout_seconds",
    ],
)
@pytest.mark.parametrize("value", ["0", "-1", "inf", '"5"', "true"])
def test_a_timeout_that_is_no_positive_number_names_the_entry(
    tmp_path: Path, key: str, value: str
) -> None:
    with pytest.raises(ProviderConfigError) as error:
        timeouts(tmp_path, f"{key} = {value}\n")
    assert f"providers[0].{key}: expected a" in str(error.value)
