"""A private-name fast path is on only on the versions it was verified on, and never when told."""

from __future__ import annotations

import logging
from importlib import metadata

import pytest

from llmgw.compat import (
    PUBLIC_APIS_ONLY_VARIABLE,
    FastPath,
    log_fast_paths,
    public_apis_only,
)
from llmgw.config import ConfigError

PATH = FastPath("example", "opentelemetry-sdk", (1, 43), (1, 46))


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The version metadata reports, per distribution (set by the test)."""
    versions: dict[str, str] = {}

    def version(distribution: str) -> str:
        if distribution not in versions:
            raise metadata.PackageNotFoundError(distribution)
        return versions[distribution]

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.delenv(PUBLIC_APIS_ONLY_VARIABLE, raising=False)
    return versions


@pytest.mark.parametrize(
    ("version", "enabled"),
    [
        ("1.42.9", False),
        ("1.43.0", True),
        ("1.45.2", True),
        ("1.45.2rc1", True),
        ("1.46.0", False),
        ("2.0", False),
    ],
)
def test_on_only_within_the_verified_range(
    installed: dict[str, str], version: str, enabled: bool
) -> None:
    installed["opentelemetry-sdk"] = version
    assert PATH.enabled() is enabled
    assert PATH.state().startswith(f"example {'on' if enabled else 'off'} ")


def test_off_without_the_dependency(installed: dict[str, str]) -> None:
    assert PATH.enabled() is False


def test_off_when_public_apis_only(
    installed: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    installed["opentelemetry-sdk"] = "1.45.2"
    monkeypatch.setenv(PUBLIC_APIS_ONLY_VARIABLE, "true")
    assert PATH.enabled() is False
    assert PATH.state() == f"example off ({PUBLIC_APIS_ONLY_VARIABLE})"


def test_a_malformed_switch_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PUBLIC_APIS_ONLY_VARIABLE, "maybe")
    with pytest.raises(ConfigError, match=PUBLIC_APIS_ONLY_VARIABLE):
        public_apis_only()


def test_one_line_at_start_names_every_fast_path(
    installed: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    installed["opentelemetry-sdk"] = "1.99.0"
    caplog.set_level(logging.INFO, logger="llmgw.compat")
    log_fast_paths()
    [record] = caplog.records
    assert record.getMessage() == (
        "fast paths: metric-reader-hook off (opentelemetry-sdk 1.99.0, verified 1.43 to <1.46); "
        "lean-tracer off (opentelemetry-sdk 1.99.0, verified 1.43 to <1.46); "
        "otlp-span-export off (opentelemetry-exporter-otlp-proto-http None, verified 1.45 to <1.46); "
        "connection-hooks off (aiohttp None, verified 3.14 to <3.15)"
    )
