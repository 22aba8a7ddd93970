"""LLMGW_CONFIG's providers: timeouts read, validated, defaulted, never longer than an attempt;
capabilities declared per provider; bad keys named, secret values never shown."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from llmgw.config.providers_file import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FIRST_TOKEN_TIMEOUT,
    DEFAULT_STALL_TIMEOUT,
    ProviderConfigError,
    load_provider_config,
)
from llmgw.providers.plugin import Capabilities, Timeouts

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


def capabilities(tmp_path: Path, extra: str) -> Capabilities:
    path = tmp_path / "llmgw.toml"
    path.write_text(PROVIDER + extra)
    (spec,) = load_provider_config(path, {}).providers
    return spec.capabilities


def test_native_responses_and_messages_are_capabilities_declared_per_provider(
    tmp_path: Path,
) -> None:
    assert capabilities(tmp_path, "") == Capabilities()
    declared = 'responses = "native"\nmessages = "native"\nprefill = true\n'
    assert capabilities(tmp_path, declared) == Capabilities(
        prefill=True, native_responses=True, native_messages=True
    )
    assert capabilities(tmp_path, 'messages = "translate"\n') == Capabilities()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('messages = "sometimes"\n', 'providers[0].messages: expected "translate" or "native", got "sometimes"'),
        ('headers = { "X-Secret" = 12345 }\n', "providers[0].headers.X-Secret: expected a string"),
        ('name = "a/b"\n', "providers[0].name: expected letters, digits"),
        ('options = "x"\n', "providers[0].options: unknown key"),
        ("api_key = 'sk-in-the-file'\n", "providers[0].api_key: unknown key"),
    ],
)  # fmt: skip
def test_a_bad_key_is_named_and_a_header_value_never_shown(
    tmp_path: Path, extra: str, message: str
) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        PROVIDER.replace('name = "local"\n', "")
        + ("" if "name =" in extra else 'name = "local"\n')
        + extra
    )
    with pytest.raises(ProviderConfigError) as error:
        load_provider_config(path, {})
    assert message in str(error.value)
    assert "12345" not in str(error.value)
    assert "sk-in-the-file" not in str(error.value)


@pytest.mark.parametrize(
    ("value", "sendable"),
    [
        ("org-1", True),
        ("a\\tb", True),  # a tab may stand inside a field value
        ("équipe", True),
        ("a\\rb", False),
        ("a\\nX-Injected: 1", False),
        ("a\\u007fb", False),
        ("a\\u0000", False),
    ],
)
def test_a_header_value_that_cannot_be_sent_is_refused_unseen(
    tmp_path: Path, value: str, sendable: bool
) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(PROVIDER + f'headers = {{ "X-Org" = "{value}" }}\n')
    if sendable:
        (spec,) = load_provider_config(path, {}).providers
        assert spec.headers == {"X-Org": tomllib.loads(f'v = "{value}"')["v"]}
        return
    with pytest.raises(ProviderConfigError) as error:
        load_provider_config(path, {})
    assert "providers[0].headers.X-Org: expected a header value without control characters" in (
        str(error.value)
    )
    assert "Injected" not in str(error.value)
