"""Settings read once from the environment into a frozen attrs class.

Every variable has one parser; a missing or malformed value raises :class:`ConfigError`, which the CLI
turns into one line on stderr and exit status 2. Secret values are never echoed back.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
import platformdirs

from llmgw.config.common import (
    DEFAULT_MAX_CONNECTIONS,
    MAX_CACHE_TTL_SECONDS,
    MOST_CONNECTIONS,
    ConfigError,
    parse_url,
)
from llmgw.config.prices import PriceEntry
from llmgw.config.providers_file import ModelAlias, ProviderSpec, load_provider_config

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "ENVIRONMENT_VARIABLES",
    "MAX_CACHE_TTL_SECONDS",
    "MAX_WORKERS",
    "MOST_CONNECTIONS",
    "ConfigError",
    "EnvVar",
    "Settings",
    "load_bind_addr",
    "load_settings",
    "parse_bool",
    "parse_workers",
    "venice_provider",
]

T = TypeVar("T")


@attrs.frozen
class EnvVar:
    """One documented environment variable: the CLI's --help is generated from these."""

    name: str
    default: str | None
    help: str
    secret: bool = False


ENVIRONMENT_VARIABLES: tuple[EnvVar, ...] = (
    EnvVar("BIND_ADDR", "0.0.0.0:3000", "HOST:PORT the gateway listens on"),
    EnvVar(
        "DATABASE_URL",
        None,
        "postgresql://user:pass@host:port/db; unset = embedded PostgreSQL in LLMGW_DATA_DIR",
        secret=True,
    ),
    EnvVar("VENICE_API_KEY", None, "Venice AI API key (required by serve)", secret=True),
    EnvVar("VENICE_BASE_URL", "https://api.venice.ai/api/v1", "Venice API base URL"),
    EnvVar(
        "LLMGW_CONFIG",
        None,
        "TOML file of providers and model aliases; unset = one provider venice from VENICE_*",
    ),
    EnvVar(
        "UPSTREAM_MAX_RETRIES",
        "2",
        "retries of a failed upstream call (0-10); a provider's max_retries in LLMGW_CONFIG wins",
    ),
    EnvVar(
        "VENICE_MAX_RETRIES",
        None,
        "deprecated: UPSTREAM_MAX_RETRIES's old name, read only when that is unset",
    ),
    EnvVar(
        "VENICE_MAX_CONNECTIONS",
        "2048",
        "calls to Venice in flight at once (a stream holds one to its end); past it a call waits "
        "up to 1 s, then is refused with 503 upstream_busy. max_connections in LLMGW_CONFIG",
    ),
    EnvVar(
        "REQUEST_TIMEOUT_SECONDS",
        "120",
        "upper bound on a request's upstream calls up to their answer, and the default of each "
        "provider's timeout_seconds, in seconds",
    ),
    EnvVar(
        "REQUEST_BODY_LIMIT_BYTES",
        "1048576",
        "largest accepted request body on chat, embeddings and the other routes",
    ),
    EnvVar(
        "MESSAGES_BODY_LIMIT_BYTES",
        "33554432",
        "largest accepted /v1/messages body (Anthropic accepts 32 MB)",
    ),
    EnvVar(
        "RESPONSES_BODY_LIMIT_BYTES",
        "33554432",
        "largest accepted /v1/responses body, previous_response_id chain included",
    ),
    EnvVar(
        "REQUEST_BODY_MEMORY_BYTES",
        "67108864",
        "request-body bytes held in memory at once, all requests together; over it: wait, then 503",
    ),
    EnvVar(
        "UPSTREAM_MAX_RESPONSE_BYTES",
        "33554432",
        "largest provider answer read, after decompression; over it: 502",
    ),
    EnvVar(
        "AUDIO_UPLOAD_LIMIT_BYTES",
        "26214400",
        "largest accepted /v1/audio/transcriptions upload (multipart body)",
    ),
    EnvVar(
        "RESPONSES_RETENTION_DAYS",
        "30",
        "days a stored /v1/responses answer stays retrievable (previous_response_id, GET)",
    ),
    EnvVar("OTEL_SERVICE_NAME", "llm-gateway", "service.name of spans and metrics"),
    EnvVar(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        None,
        "OTLP collector URL; unset = telemetry is not exported",
    ),
    EnvVar(
        "CAPTURE_GENAI_CONTENT",
        "false",
        "true = record prompts and completions on spans (off by default)",
    ),
    EnvVar(
        "LLMGW_DATA_DIR",
        None,
        "where the embedded database and the usage ledger's spool live (default: user data dir)",
    ),
    EnvVar("LLMGW_AUTO_MIGRATE", "false", "true = serve migrates an external database to head"),
    EnvVar(
        "LLMGW_PUBLIC_APIS_ONLY",
        "false",
        "true = no private-name fast path into a dependency (llmgw.compat), only public APIs",
    ),
    EnvVar("SHUTDOWN_GRACE_SECONDS", "30", "time in-flight requests get to finish on SIGTERM"),
    EnvVar(
        "LLMGW_WORKERS",
        "1",
        "serve's worker processes: a number 1-256, or auto = the cores this process may use",
    ),
    EnvVar("STREAM_MAX_SECONDS", "600", "longest a streamed answer may last, in seconds"),
    EnvVar(
        "UPSTREAM_MAX_EVENT_BYTES",
        "1048576",
        "largest single event of a provider's stream (and JSON answer to a stream)",
    ),
    EnvVar(
        "RATE_LIMIT_BACKEND",
        "postgres",
        "where limits live (windows, reservations, concurrency): postgres or redis",
    ),
    EnvVar(
        "REDIS_URL",
        None,
        "redis://host:port/db, used when RATE_LIMIT_BACKEND=redis or LLMGW_CACHE=redis",
    ),
    EnvVar("LLMGW_CACHE", "off", "the response cache: off, memory or redis (REDIS_URL)"),
    EnvVar("CACHE_TTL_SECONDS", "3600", "how long a cached answer is served, in seconds"),
    EnvVar(
        "CACHE_MAX_BYTES",
        "268435456",
        "memory cache: bytes held at most; least recently used entries are evicted first",
    ),
    EnvVar("CACHE_MAX_ENTRY_BYTES", "4194304", "a larger answer is not cached"),
    EnvVar(
        "CACHE_SCOPE",
        "key",
        "who may hit an entry: key (the key that stored it), subject, team or shared (every key)",
    ),
    EnvVar(
        "LIMIT_SLICE_REQUESTS",
        "64",
        "capacity leases, for keys busy on a replica (a few hundred admissions a second): the "
        "largest slice of a key's limits a replica takes at once, in requests (0 = off: every "
        "admission is a round trip to the limit store)",
    ),
    EnvVar(
        "LIMIT_SLICE_BUSY_RATE",
        "200",
        "capacity leases: admissions a second on a replica from which a key takes slices (off "
        "again below half of it); 0 = every key takes slices",
    ),
    EnvVar(
        "LIMIT_SLICE_SECONDS",
        "10",
        "lease of a slice: how soon a killed replica's unused slices count again",
    ),
    EnvVar(
        "DEFAULT_MAX_OUTPUT_TOKENS",
        "4096",
        "output tokens reserved for a request that sets no max_tokens (capped by the model's own)",
    ),
    EnvVar("PRICE_REFRESH_SECONDS", "3600", "how often Venice's model prices are fetched again"),
    EnvVar("LLMGW_PROMETHEUS", "false", "true = also serve metrics at GET /metrics"),
    EnvVar("LOG_LEVEL", "INFO", "DEBUG, INFO, WARNING or ERROR"),
    EnvVar(
        "LLMGW_ADMIN_TOKEN",
        None,
        "bearer token of the admin API under /admin/v1; unset = the admin API is off (404)",
        secret=True,
    ),
    EnvVar(
        "OIDC_ISSUER",
        None,
        "console single sign-on: the OpenID provider's issuer URL (https://, or http:// on "
        "loopback); with OIDC_CLIENT_ID and OIDC_CLIENT_SECRET",
    ),
    EnvVar("OIDC_CLIENT_ID", None, "the console's client id at the OpenID provider"),
    EnvVar("OIDC_CLIENT_SECRET", None, "the console's client secret there", secret=True),
    EnvVar(
        "OIDC_REDIRECT_URL",
        None,
        "the callback URL given to the provider (default: this request's "
        "/console/oidc/callback), for a gateway behind a proxy",
    ),
    EnvVar("OIDC_GROUPS_CLAIM", "groups", "the ID token claim that lists a person's groups"),
    EnvVar(
        "OIDC_ADMIN_GROUPS",
        None,
        "comma-separated groups whose members are console admins (everything)",
    ),
    EnvVar(
        "CONSOLE_TOKEN_SIGN_IN",
        "true",
        "false = the console's admin-token sign-in is off (single sign-on only)",
    ),
    EnvVar("CONSOLE_SESSION_HOURS", "8", "longest a console session lasts, in hours"),
    EnvVar(
        "TRUST_FORWARDED_HEADERS",
        "false",
        "true = believe a reverse proxy's X-Forwarded-Proto/Forwarded proto (Secure console "
        "cookie) and X-Forwarded-For (client address for sign-in throttling); only behind one",
    ),
)

_BY_NAME = {var.name: var for var in ENVIRONMENT_VARIABLES}
VENICE_BASE_URL = "https://api.venice.ai/api/v1"


def venice_provider(
    api_key: str | None = None,
    base_url: str = VENICE_BASE_URL,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> ProviderSpec:
    """The provider the environment names without LLMGW_CONFIG: ``venice``, of kind ``venice``,
    from VENICE_API_KEY, VENICE_BASE_URL and VENICE_MAX_CONNECTIONS."""
    return ProviderSpec(
        name="venice",
        kind="venice",
        base_url=base_url,
        api_key_env="VENICE_API_KEY",
        api_key=api_key,
        max_connections=max_connections,
    )


@attrs.frozen
class Settings:
    """Everything the gateway reads from its environment, validated."""

    bind_host: str = "0.0.0.0"
    bind_port: int = 3000
    database_url: str | None = attrs.field(default=None, repr=False)
    upstream_max_retries: int = 2
    request_timeout_seconds: float = 120.0
    request_body_limit_bytes: int = 1_048_576
    messages_body_limit_bytes: int = 32 * 1024 * 1024
    responses_body_limit_bytes: int = 32 * 1024 * 1024
    request_body_memory_bytes: int = 64 * 1024 * 1024
    upstream_max_response_bytes: int = 32 * 1024 * 1024
    audio_upload_limit_bytes: int = 26_214_400
    responses_retention_days: int = 30
    otel_service_name: str = "llm-gateway"
    otel_exporter_otlp_endpoint: str | None = None
    capture_genai_content: bool = False
    data_dir: Path = attrs.field(factory=lambda: default_data_dir())
    auto_migrate: bool = False
    shutdown_grace_seconds: float = 30.0
    workers: int = 1
    stream_max_seconds: float = 600.0
    upstream_max_event_bytes: int = 1_048_576
    rate_limit_backend: str = "postgres"
    redis_url: str | None = attrs.field(default=None, repr=False)
    cache: str = "off"  # off | memory | redis
    cache_ttl_seconds: float = 3600.0
    cache_max_bytes: int = 256 * 1024 * 1024
    cache_max_entry_bytes: int = 4 * 1024 * 1024
    cache_scope: str = "key"  # key | subject | team | shared
    limit_slice_requests: int = 64
    limit_slice_busy_rate: float = 200.0
    limit_slice_seconds: float = 10.0
    default_max_output_tokens: int = 4096
    price_refresh_seconds: float = 3600.0
    prometheus: bool = False
    log_level: str = "INFO"
    admin_token: str | None = attrs.field(default=None, repr=False)
    trust_forwarded_headers: bool = False
    oidc_issuer: str | None = None
    oidc_client_id: str | None = None
    oidc_client_secret: str | None = attrs.field(default=None, repr=False)
    oidc_redirect_url: str | None = None
    oidc_groups_claim: str = "groups"
    oidc_admin_groups: tuple[str, ...] = ()
    console_token_sign_in: bool = True
    console_session_hours: float = 8.0
    # From LLMGW_CONFIG; empty = environment_provider alone.
    providers: tuple[ProviderSpec, ...] = ()
    # The provider the environment names (venice_provider; its key is redacted from the logs
    # either way), routed to when LLMGW_CONFIG names none.
    environment_provider: ProviderSpec = attrs.field(factory=venice_provider)
    model_aliases: tuple[ModelAlias, ...] = ()
    prices: tuple[PriceEntry, ...] = ()  # [[prices]]

    @property
    def uses_embedded_database(self) -> bool:
        return self.database_url is None

    @property
    def routed_providers(self) -> tuple[ProviderSpec, ...]:
        """The providers the gateway routes to: LLMGW_CONFIG's, or the environment's one."""
        return self.providers or (self.environment_provider,)

    def secrets(self) -> tuple[str, ...]:
        """The credentials these settings hold, for the log to redact wherever they appear:
        provider keys and header values, the admin token, the OIDC client secret, and the
        passwords of the database and Redis URLs."""
        held = [self.admin_token, self.oidc_client_secret]
        for spec in (self.environment_provider, *self.providers):
            held.append(spec.api_key)
            held.extend(spec.headers.values())
        for url in (self.database_url, self.redis_url):
            if url is not None:
                held.append(urllib.parse.urlsplit(url).password)
        return tuple(dict.fromkeys(secret for secret in held if secret))


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("llmgw", appauthor=False))


def load_settings(
    environ: Mapping[str, str] | None = None, *, require_venice_key: bool = False
) -> Settings:
    """Read and validate every variable; raise ConfigError naming the first bad one."""
    env = os.environ if environ is None else environ
    reader = _Reader(env)
    host, port = load_bind_addr(env)
    venice_key = reader.optional("VENICE_API_KEY", _parse_non_empty, "a non-empty API key")
    config_path = reader.optional("LLMGW_CONFIG", _parse_path, "a TOML file path")
    if require_venice_key and venice_key is None and config_path is None:
        raise ConfigError(
            "VENICE_API_KEY", None, "your Venice API key (https://venice.ai/settings/api)"
        )
    data_dir = reader.optional("LLMGW_DATA_DIR", _parse_path, "a directory path")
    backend = reader.get(
        "RATE_LIMIT_BACKEND", _parse_choice("postgres", "redis"), "postgres or redis"
    )
    redis_url = reader.optional(
        "REDIS_URL", parse_url("redis", "rediss", "unix"), "redis://host:port/db"
    )
    if backend == "redis" and redis_url is None:
        raise ConfigError("REDIS_URL", None, "redis://host:port/db when RATE_LIMIT_BACKEND=redis")
    cache = reader.get(
        "LLMGW_CACHE", _parse_choice("off", "memory", "redis"), "off, memory or redis"
    )
    if cache == "redis" and redis_url is None:
        raise ConfigError("REDIS_URL", None, "redis://host:port/db when LLMGW_CACHE=redis")
    if "redis" in (backend, cache) and importlib.util.find_spec("redis") is None:
        raise ConfigError(
            "RATE_LIMIT_BACKEND" if backend == "redis" else "LLMGW_CACHE",
            "redis",
            "postgres, or install the extra: pip install 'llmgw[redis]'",
        )
    providers: tuple[ProviderSpec, ...] = ()
    model_aliases: tuple[ModelAlias, ...] = ()
    prices: tuple[PriceEntry, ...] = ()
    if config_path is not None:
        providers_config = load_provider_config(config_path, env)
        providers, model_aliases = providers_config.providers, providers_config.model_aliases
        prices = providers_config.prices
    return Settings(
        bind_host=host,
        bind_port=port,
        database_url=reader.optional(
            "DATABASE_URL",
            parse_url("postgresql", "postgres"),
            "postgresql://user:password@host:5432/dbname",
        ),
        environment_provider=venice_provider(
            venice_key,
            reader.get("VENICE_BASE_URL", parse_url("http", "https"), "an http(s) URL"),
            reader.get(
                "VENICE_MAX_CONNECTIONS",
                _parse_int(1, MOST_CONNECTIONS),
                f"an integer 1-{MOST_CONNECTIONS}",
            ),
        ),
        upstream_max_retries=_max_retries(reader),
        request_timeout_seconds=reader.get(
            "REQUEST_TIMEOUT_SECONDS", _parse_positive_float, "a positive number of seconds"
        ),
        request_body_limit_bytes=reader.get(
            "REQUEST_BODY_LIMIT_BYTES", _parse_int(1, 1 << 31), "a positive integer (bytes)"
        ),
        messages_body_limit_bytes=reader.get(
            "MESSAGES_BODY_LIMIT_BYTES", _parse_int(1, 1 << 31), "a positive integer (bytes)"
        ),
        responses_body_limit_bytes=reader.get(
            "RESPONSES_BODY_LIMIT_BYTES", _parse_int(1, 1 << 31), "a positive integer (bytes)"
        ),
        request_body_memory_bytes=reader.get(
            "REQUEST_BODY_MEMORY_BYTES", _parse_int(1, 1 << 40), "a positive integer (bytes)"
        ),
        upstream_max_response_bytes=reader.get(
            "UPSTREAM_MAX_RESPONSE_BYTES", _parse_int(1024, 1 << 40), "an integer >= 1024 (bytes)"
        ),
        audio_upload_limit_bytes=reader.get(
            "AUDIO_UPLOAD_LIMIT_BYTES", _parse_int(1, 1 << 31), "a positive integer (bytes)"
        ),
        responses_retention_days=reader.get(
            "RESPONSES_RETENTION_DAYS", _parse_int(1, 36500), "a number of days, 1-36500"
        ),
        otel_service_name=reader.get("OTEL_SERVICE_NAME", _parse_non_empty, "a non-empty name"),
        otel_exporter_otlp_endpoint=reader.optional(
            "OTEL_EXPORTER_OTLP_ENDPOINT", parse_url("http", "https"), "an http(s) URL"
        ),
        capture_genai_content=reader.get("CAPTURE_GENAI_CONTENT", parse_bool, "true or false"),
        data_dir=data_dir if data_dir is not None else default_data_dir(),
        auto_migrate=reader.get("LLMGW_AUTO_MIGRATE", parse_bool, "true or false"),
        shutdown_grace_seconds=reader.get(
            "SHUTDOWN_GRACE_SECONDS", _parse_non_negative_float, "a number of seconds >= 0"
        ),
        workers=reader.get("LLMGW_WORKERS", parse_workers, "a number 1-256, or auto"),
        stream_max_seconds=reader.get(
            "STREAM_MAX_SECONDS", _parse_positive_float, "a positive number of seconds"
        ),
        upstream_max_event_bytes=reader.get(
            "UPSTREAM_MAX_EVENT_BYTES", _parse_int(1024, 1 << 30), "an integer 1024-1073741824"
        ),
        rate_limit_backend=backend,
        redis_url=redis_url,
        cache=cache,
        cache_ttl_seconds=reader.get(
            "CACHE_TTL_SECONDS",
            _parse_cache_ttl,
            f"a positive number of seconds, at most {MAX_CACHE_TTL_SECONDS}",
        ),
        cache_max_bytes=reader.get(
            "CACHE_MAX_BYTES", _parse_int(1024, 1 << 42), "an integer >= 1024 (bytes)"
        ),
        cache_max_entry_bytes=reader.get(
            "CACHE_MAX_ENTRY_BYTES", _parse_int(1, 1 << 31), "a positive integer (bytes)"
        ),
        cache_scope=reader.get(
            "CACHE_SCOPE",
            _parse_choice("key", "subject", "team", "shared"),
            "key, subject, team or shared",
        ),
        limit_slice_requests=reader.get(
            "LIMIT_SLICE_REQUESTS", _parse_int(0, 1_000_000), "an integer 0-1000000"
        ),
        limit_slice_busy_rate=reader.get(
            "LIMIT_SLICE_BUSY_RATE", _parse_non_negative_float, "a number of admissions a second"
        ),
        limit_slice_seconds=reader.get(
            "LIMIT_SLICE_SECONDS", _parse_positive_float, "a positive number of seconds"
        ),
        default_max_output_tokens=reader.get(
            "DEFAULT_MAX_OUTPUT_TOKENS", _parse_int(1, 10_000_000), "an integer 1-10000000"
        ),
        price_refresh_seconds=reader.get(
            "PRICE_REFRESH_SECONDS", _parse_positive_float, "a positive number of seconds"
        ),
        prometheus=reader.get("LLMGW_PROMETHEUS", parse_bool, "true or false"),
        admin_token=reader.optional(
            "LLMGW_ADMIN_TOKEN", _parse_admin_token, "at least 16 printable characters"
        ),
        trust_forwarded_headers=reader.get("TRUST_FORWARDED_HEADERS", parse_bool, "true or false"),
        **_oidc(reader),
        log_level=reader.get(
            "LOG_LEVEL",
            _parse_choice("DEBUG", "INFO", "WARNING", "ERROR"),
            "DEBUG|INFO|WARNING|ERROR",
        ),
        providers=providers,
        model_aliases=model_aliases,
        prices=prices,
    )


def _oidc(reader: _Reader) -> dict[str, Any]:
    """Single sign-on for the console: all three of issuer, client id and secret, or none."""
    issuer = reader.optional("OIDC_ISSUER", _parse_issuer, "an https:// URL (http:// on loopback)")
    client_id = reader.optional("OIDC_CLIENT_ID", str, "the client id")
    secret = reader.optional("OIDC_CLIENT_SECRET", str, "the client secret")
    given = [value is not None for value in (issuer, client_id, secret)]
    if any(given) and not all(given):
        raise ConfigError(
            "OIDC_ISSUER",
            None,
            "OIDC_ISSUER, OIDC_CLIENT_ID and OIDC_CLIENT_SECRET together (single sign-on)",
        )
    return {
        "oidc_issuer": issuer,
        "oidc_client_id": client_id,
        "oidc_client_secret": secret,
        "oidc_redirect_url": reader.optional(
            "OIDC_REDIRECT_URL", _parse_issuer, "an https:// URL (http:// on loopback)"
        ),
        "oidc_groups_claim": reader.get("OIDC_GROUPS_CLAIM", str, "a claim name"),
        "oidc_admin_groups": reader.optional(
            "OIDC_ADMIN_GROUPS", _parse_names, "comma-separated group names"
        )
        or (),
        "console_token_sign_in": reader.get("CONSOLE_TOKEN_SIGN_IN", parse_bool, "true or false"),
        "console_session_hours": reader.get(
            "CONSOLE_SESSION_HOURS", _parse_positive_float, "a positive number of hours"
        ),
    }


def _parse_issuer(raw: str) -> str:
    """An https:// URL, or http:// on a loopback address (local and test providers)."""
    parsed = urllib.parse.urlsplit(raw)
    if not parsed.hostname or parsed.scheme not in ("https", "http"):
        raise ValueError(raw)
    if parsed.scheme == "http" and not _is_loopback(parsed.hostname):
        raise ValueError(raw)
    return raw.rstrip("/")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _parse_names(raw: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def _max_retries(reader: _Reader) -> int:
    # The deprecated name is still honoured: a deployment set up before the rename keeps its value.
    name = "UPSTREAM_MAX_RETRIES"
    if not reader.env.get(name, "").strip() and reader.env.get("VENICE_MAX_RETRIES", "").strip():
        name = "VENICE_MAX_RETRIES"
    return reader.get(name, _parse_int(0, 10), "an integer 0-10")


def load_bind_addr(environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """BIND_ADDR alone, for commands that talk to a running gateway (``llmgw smoke``)."""
    env = os.environ if environ is None else environ
    return _Reader(env).get("BIND_ADDR", _parse_bind_addr, "HOST:PORT, e.g. 0.0.0.0:3000")


@attrs.frozen
class _Reader:
    env: Mapping[str, str]

    def optional(self, name: str, parse: Callable[[str], T], expected: str) -> T | None:
        raw = self.env.get(name)
        if raw is None or raw.strip() == "":
            default = _BY_NAME[name].default
            if default is None:
                return None
            raw = default
        try:
            return parse(raw.strip())
        except ValueError:
            raise ConfigError(name, raw, expected, secret=_BY_NAME[name].secret) from None

    def get(self, name: str, parse: Callable[[str], T], expected: str) -> T:
        value = self.optional(name, parse, expected)
        if value is None:
            raise ConfigError(name, None, expected)
        return value


def _parse_bind_addr(raw: str) -> tuple[str, int]:
    host, sep, port_text = raw.rpartition(":")
    if not sep or not host:
        raise ValueError(raw)
    host = host.strip("[]")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not host.replace("-", "").replace(".", "").isalnum():
                raise
    return host, _parse_int(0, 65535)(port_text)


def _parse_int(low: int, high: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw, 10)
        if not low <= value <= high:
            raise ValueError(raw)
        return value

    return parse


MAX_WORKERS = 256


def parse_workers(raw: str) -> int:
    """A worker count, or ``auto``: the cores this process may run on (its CPU affinity)."""
    if raw.lower() == "auto":
        return min(len(os.sched_getaffinity(0)), MAX_WORKERS)
    return _parse_int(1, MAX_WORKERS)(raw)


def _parse_positive_float(raw: str) -> float:
    value = float(raw)
    if not 0 < value < float("inf"):
        raise ValueError(raw)
    return value


def _parse_cache_ttl(raw: str) -> float:
    value = _parse_positive_float(raw)
    if value > MAX_CACHE_TTL_SECONDS:
        raise ValueError(raw)
    return value


def _parse_non_negative_float(raw: str) -> float:
    value = float(raw)
    if not 0 <= value < float("inf"):
        raise ValueError(raw)
    return value


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def parse_bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(raw)


def _parse_non_empty(raw: str) -> str:
    if not raw:
        raise ValueError(raw)
    return raw


def _parse_admin_token(raw: str) -> str:
    if len(raw) < 16 or not raw.isprintable() or " " in raw:
        raise ValueError(raw)
    return raw


def _parse_path(raw: str) -> Path:
    return Path(raw).expanduser()


def _parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        for choice in choices:
            if raw.lower() == choice.lower():
                return choice
        raise ValueError(raw)

    return parse
