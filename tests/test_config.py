"""Configuration: defaults, and a one-line exit 2 for every missing or malformed variable."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw.config import ConfigError, load_settings, venice_provider
from tests.processes import clean_env, run_llmgw

BAD_VALUES = [
    ("BIND_ADDR", "nonsense"),
    ("BIND_ADDR", "0.0.0.0:99999"),
    ("DATABASE_URL", "mysql://user:secret-password@db/x"),
    ("VENICE_BASE_URL", "ftp://example.com"),
    ("UPSTREAM_MAX_RETRIES", "-1"),
    ("UPSTREAM_MAX_RETRIES", "many"),
    ("VENICE_MAX_RETRIES", "-1"),
    ("VENICE_MAX_RETRIES", "many"),
    ("VENICE_MAX_CONNECTIONS", "0"),
    ("VENICE_MAX_CONNECTIONS", "lots"),
    ("REQUEST_TIMEOUT_SECONDS", "0"),
    ("REQUEST_BODY_LIMIT_BYTES", "1MB"),
    ("UPSTREAM_MAX_RESPONSE_BYTES", "32MiB"),
    ("UPSTREAM_MAX_RESPONSE_BYTES", "100"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
    ("CAPTURE_GENAI_CONTENT", "maybe"),
    ("LLMGW_AUTO_MIGRATE", "2"),
    ("SHUTDOWN_GRACE_SECONDS", "-5"),
    ("STREAM_MAX_SECONDS", "0"),
    ("STREAM_MAX_SECONDS", "inf"),
    ("UPSTREAM_MAX_EVENT_BYTES", "1MiB"),
    ("UPSTREAM_MAX_EVENT_BYTES", "10"),
    ("RATE_LIMIT_BACKEND", "memcached"),
    ("LLMGW_PROMETHEUS", "yes please"),
    ("LOG_LEVEL", "LOUD"),
    ("LLMGW_WORKERS", "0"),
    ("LLMGW_WORKERS", "257"),
    ("LLMGW_WORKERS", "many"),
]


def base_env(tmp_path: Path) -> dict[str, str]:
    return clean_env(VENICE_API_KEY="x", LLMGW_DATA_DIR=str(tmp_path))


def in_process_env(tmp_path: Path) -> dict[str, str]:
    """:func:`base_env` less its BIND_ADDR (``serve_in_process`` chooses it)."""
    return {k: v for k, v in base_env(tmp_path).items() if k != "BIND_ADDR"}


def test_defaults_match_the_reference_design() -> None:
    settings = load_settings({})
    assert (settings.bind_host, settings.bind_port) == ("0.0.0.0", 3000)
    assert settings.database_url is None and settings.uses_embedded_database
    assert settings.environment_provider == venice_provider()
    assert settings.environment_provider.base_url == "https://api.venice.ai/api/v1"
    assert settings.routed_providers == (settings.environment_provider,)
    assert settings.otel_service_name == "llm-gateway"
    assert settings.otel_exporter_otlp_endpoint is None
    assert settings.request_timeout_seconds == 120
    assert settings.request_body_limit_bytes == 1_048_576
    assert settings.upstream_max_response_bytes == 32 * 1024 * 1024
    assert settings.upstream_max_retries == 2
    assert settings.capture_genai_content is False
    assert settings.auto_migrate is False
    assert settings.workers == 1
    assert settings.stream_max_seconds == 600
    assert settings.upstream_max_event_bytes == 1_048_576


def test_stream_bounds_are_read_from_the_environment() -> None:
    settings = load_settings({"STREAM_MAX_SECONDS": "2.5", "UPSTREAM_MAX_EVENT_BYTES": "4096"})
    assert (settings.stream_max_seconds, settings.upstream_max_event_bytes) == (2.5, 4096)


def assert_one_line_naming(variable: str, stderr: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert variable in lines[0]
    assert "Traceback" not in stderr
    assert "secret-password" not in stderr


@pytest.mark.parametrize(("variable", "value"), BAD_VALUES)
def test_each_invalid_value_is_refused_with_one_line_naming_it(
    serve_in_process: Callable[[dict[str, str]], int],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    variable: str,
    value: str,
) -> None:
    assert serve_in_process({**in_process_env(tmp_path), variable: value}) == 2
    assert_one_line_naming(variable, capsys.readouterr().err)


@pytest.mark.slow  # a process per value: the same as above, through python -m llmgw
@pytest.mark.parametrize(("variable", "value"), BAD_VALUES)
def test_each_invalid_value_exits_2_with_one_line_naming_it(
    tmp_path: Path, variable: str, value: str
) -> None:
    result = run_llmgw("serve", env={**base_env(tmp_path), variable: value})
    assert result.returncode == 2
    assert_one_line_naming(variable, result.stderr)


def test_missing_venice_key_exits_2(tmp_path: Path) -> None:
    env = base_env(tmp_path)
    del env["VENICE_API_KEY"]
    result = run_llmgw("serve", env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("llmgw: configuration error: VENICE_API_KEY is not set")


def test_secret_values_are_never_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"DATABASE_URL": "mysql://u:hunter2@h/d"})
    assert "hunter2" not in str(caught.value)
    assert "DATABASE_URL" in str(caught.value)


def test_help_teaches_every_variable() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmgw", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    for variable in (
        "BIND_ADDR",
        "DATABASE_URL",
        "VENICE_API_KEY",
        "LLMGW_DATA_DIR",
        "SHUTDOWN_GRACE_SECONDS",
        "UPSTREAM_MAX_RESPONSE_BYTES",
        "LLMGW_WORKERS",
        "--workers",
        "STREAM_MAX_SECONDS",
        "UPSTREAM_MAX_EVENT_BYTES",
    ):
        assert variable in result.stdout


def test_upstream_max_response_bytes_is_read() -> None:
    assert (
        load_settings({"UPSTREAM_MAX_RESPONSE_BYTES": "4096"}).upstream_max_response_bytes == 4096
    )


def test_workers_is_a_count_or_auto_the_cores_this_process_may_use() -> None:
    assert load_settings({"LLMGW_WORKERS": "3"}).workers == 3
    assert load_settings({"LLMGW_WORKERS": "AUTO"}).workers == len(os.sched_getaffinity(0))


def test_workers_flag_refuses_a_bad_count_with_exit_2(tmp_path: Path) -> None:
    result = run_llmgw("serve", "--workers", "0", env=base_env(tmp_path))
    assert result.returncode == 2
    assert "--workers" in result.stderr and "Traceback" not in result.stderr


def test_without_llmgw_config_the_environment_names_the_one_provider(tmp_path: Path) -> None:
    settings = load_settings(
        {
            "VENICE_API_KEY": "sk-venice-secret",
            "VENICE_BASE_URL": "http://127.0.0.1:9/api/v1",
            "VENICE_MAX_CONNECTIONS": "7",
        },
        require_venice_key=True,
    )
    (spec,) = settings.routed_providers
    assert spec is settings.environment_provider
    assert (spec.name, spec.kind, spec.base_url) == (
        "venice",
        "venice",
        "http://127.0.0.1:9/api/v1",
    )
    assert (spec.api_key, spec.api_key_env, spec.max_connections) == (
        "sk-venice-secret",
        "VENICE_API_KEY",
        7,
    )
    assert "sk-venice-secret" not in repr(settings)
    # With LLMGW_CONFIG its providers are routed to, and no key is required.
    config = tmp_path / "llmgw.toml"
    config.write_text(
        '[[providers]]\nname = "local"\nkind = "openai-compatible"\n'
        'base_url = "http://127.0.0.1:8/v1"\n'
    )
    configured = load_settings({"LLMGW_CONFIG": str(config)}, require_venice_key=True)
    assert [spec.name for spec in configured.routed_providers] == ["local"]
    with pytest.raises(ConfigError, match="VENICE_API_KEY"):
        load_settings({}, require_venice_key=True)
    # The environment's key is redacted from the logs whether or not it is routed to.
    both = load_settings({"LLMGW_CONFIG": str(config), "VENICE_API_KEY": "sk-venice-secret"})
    assert "sk-venice-secret" in both.secrets()


def test_the_retry_count_has_a_generic_name_and_the_deprecated_one_is_still_read() -> None:
    assert load_settings({"UPSTREAM_MAX_RETRIES": "5"}).upstream_max_retries == 5
    assert load_settings({"VENICE_MAX_RETRIES": "4"}).upstream_max_retries == 4
    both = {"UPSTREAM_MAX_RETRIES": "1", "VENICE_MAX_RETRIES": "4"}
    assert load_settings(both).upstream_max_retries == 1


def test_the_configuration_imports_no_other_llmgw_package() -> None:
    """config/ is the ground floor: importing it loads nothing of llmgw but itself."""
    listed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, llmgw.config\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('llmgw'))))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    ).stdout.split()
    assert "llmgw.config.providers_file" in listed
    assert [m for m in listed if m != "llmgw" and not m.startswith("llmgw.config")] == []
