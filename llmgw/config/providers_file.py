"""The providers configuration file named by ``LLMGW_CONFIG`` (TOML), parsed once into frozen classes.

    [[providers]]
    name = "venice"                  # unique; used in "provider/model" names, deployments, telemetry
    kind = "venice"                  # an installed kind: "venice", "openai-compatible",
                                     #   "azure-openai", "anthropic" or a plugin's
                                     #   (llmgw providers lists them)
    base_url = "https://api.venice.ai/api/v1"
    api_key_env = "VENICE_API_KEY"   # optional (a local Ollama needs none); the key stays in the env
    timeout_seconds = 30             # optional: one attempt; default REQUEST_TIMEOUT_SECONDS
    connect_timeout_seconds = 5      # optional: to open a connection; default 5
    first_token_timeout_seconds = 60 # optional: to the first answer byte (a JSON answer's
                                     #   headers, a stream's first event); default 60
    stall_timeout_seconds = 60       # optional: longest silence inside a stream; default 60
    max_retries = 1                  # optional; default UPSTREAM_MAX_RETRIES
    max_connections = 2048           # optional: calls in flight at once (a stream holds one for
                                     # its whole length); past it, a 503 after a short wait
    headers = { "OpenAI-Organization" = "org-..." }   # optional; sent on every call
    responses = "native"             # optional capabilities, each defaulting to the kind's own
    messages = "translate"           #   (ProviderPlugin.capabilities): it serves POST /responses,
    reasoning = false                #   POST /messages itself ("native") or they become chat;
    prefill = false                  #   it accepts reasoning_effort; it continues a trailing
                                     #   assistant message (a broken stream is finished that way)
    circuit_cooldown_seconds = 30    # optional: how long a deployment that keeps failing is
                                     #   skipped before one request probes it again
    circuit_max_failed_probes = 5    # optional: failed probes in a row after which the cooldown
                                     #   doubles with each further one
    circuit_max_cooldown_seconds = 300   # optional: the longest any opening lasts, a Retry-After's
                                     #   too; default 300 (or the cooldown, when longer)
    rpm = 500                        # optional: the account's requests per minute, and
    tpm = 200000                     #   tokens per minute (a request's worst case), counted
                                     #   across replicas; a deployment of a provider at its
                                     #   cap is skipped (llmgw.limits.caps); default: no cap
    input_usd_per_mtok = 0.15        # optional price of every model of this provider, USD per
    output_usd_per_mtok = 0.60       #   million tokens (Venice publishes its own; these win)

    [[models]]
    alias = "fast"                   # what callers send as "model"
    deployments = ["venice:llama-3.2-3b", "local:llama3.2"]   # tried in order
    strategy = "weighted"            # optional: which one goes first; "ordered" (the default),
    weights = [3, 1]                 #   "weighted" (with one weight per deployment),
                                     #   "least-busy" or "least-latency" (llmgw.routing.strategy)

    # kind-specific keys: those of the kind's options spec (llmgw.providers.plugin; llmgw.config.kinds)

The tables are structured into attrs specs by the strict converter of ``llmgw.config.converter``.
Every problem raises :class:`ProviderConfigError`, one line naming the file and the entry, e.g.
``LLMGW_CONFIG /etc/llmgw.toml: providers[1].max_retries: expected an integer 0-10, got 99``.
Entries are counted from 0. Key values and header values are never echoed.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args
from urllib.parse import urlsplit

import attrs
from cattrs.gen import make_dict_structure_fn, override

from llmgw.config.common import (
    DEFAULT_MAX_CONNECTIONS,
    MAX_CACHE_TTL_SECONDS,
    MOST_CONNECTIONS,
    ConfigError,
    is_price,
    parse_url,
    price_expected,
    shown_url,
)
from llmgw.config.converter import CONVERTER, ConfigProblem, Invalid, check, show, structure
from llmgw.config.kinds import Capabilities, InstalledKind, KindError, installed_kinds, load_kind
from llmgw.config.prices import PriceEntry, parse_prices

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_FIRST_TOKEN_TIMEOUT",
    "DEFAULT_STALL_TIMEOUT",
    "MAX_COOLDOWN_SECONDS",
    "ORDERED",
    "STEADY_PROBES",
    "STRATEGIES",
    "TOP_LEVEL_TABLES",
    "Cooldown",
    "DeploymentSpec",
    "ModelAlias",
    "ProviderConfigError",
    "ProviderSpec",
    "ProvidersConfig",
    "Strategy",
    "StrategyName",
    "Timeouts",
    "load_provider_config",
]

# Names appear in "provider/model" and "provider:model", so neither separator may be part of one.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# RFC 9110: a field name is a token; a value has no control character but a tab (a CR or LF would
# end the header, so aiohttp refuses to send it and every request to the provider would fail).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")


class ProviderConfigError(ConfigError):
    """The providers file is unreadable or invalid; the message names the file and the entry."""

    def __init__(self, path: Path, where: str, problem: str) -> None:
        # Not ConfigError's "VARIABLE has invalid value" sentence: the file, not the variable, is bad.
        Exception.__init__(self, f"LLMGW_CONFIG {path}: {where}: {problem}")
        self.variable = "LLMGW_CONFIG"


# Production defaults. A healthy API connects in well under a second; most models start to answer
# within seconds, but a long non-streamed answer sends its headers only when it is whole, and a
# reasoning model may think in silence after its first (role-only) event: a minute for both.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_FIRST_TOKEN_TIMEOUT = 60.0
DEFAULT_STALL_TIMEOUT = 60.0

_seconds = check(lambda n: 0 < n < float("inf"), "a positive number")
_price = check(is_price, price_expected("_per_mtok"))
_per_minute = check(lambda n: n >= 1, "a whole number per minute, at least 1")


@attrs.frozen
class Timeouts:
    """How long one attempt on a provider may take, and may stay silent, phase by phase (seconds).

    A silent provider is given up at the first phase it overruns, and the route moves on.
    """

    attempt: float  # one attempt: a JSON answer whole, a stream up to its first event
    connect: float  # TCP (and TLS) connection
    first_token: float  # to the first answer byte: a JSON answer's headers, a stream's first event
    stall: float  # between two reads of a stream


# The longest any opening lasts by default (``circuit_max_cooldown_seconds``): a deployment down for
# an hour is still probed every five minutes, and a Retry-After of a day is not believed.
MAX_COOLDOWN_SECONDS = 300.0
# Failed probes in a row after which the cooldown starts to double (``circuit_max_failed_probes``).
STEADY_PROBES = 5


@attrs.frozen(slots=True)
class Cooldown:
    """How long a provider's deployments stay open (its ``circuit_*`` settings)."""

    seconds: float = 30.0
    most: float = MAX_COOLDOWN_SECONDS  # never more than the cooldown (see ProviderSpec)
    steady_probes: int = STEADY_PROBES

    def after(self, failed_probes: int) -> float:
        """The opening after ``failed_probes`` probes failed in a row."""
        doublings = min(max(0, failed_probes - self.steady_probes), 32)
        return min(self.most, self.seconds * 2.0**doublings)


# A [[models]] entry's strategy: which deployment goes first (llmgw.routing.strategy applies it).
StrategyName = Literal["ordered", "weighted", "least-busy", "least-latency"]
STRATEGIES: tuple[StrategyName, ...] = get_args(StrategyName)


@attrs.frozen
class Strategy:
    name: StrategyName = "ordered"
    weights: tuple[float, ...] = ()  # weighted: one per deployment of the alias, in its order


ORDERED = Strategy()


def _http_url(value: str) -> str:
    try:
        url = parse_url("http", "https")(value)
    except ValueError:
        raise Invalid(
            "base_url", f"expected an http(s) URL, got {show(shown_url(value))}"
        ) from None
    if "@" in urlsplit(url).netloc:  # the start line would print the password
        raise Invalid(
            "base_url",
            "holds credentials (user:password@); give the key through api_key_env or headers",
        )
    return url


def _headers(_instance: Any, _attribute: Any, headers: Mapping[str, str]) -> None:
    for name, value in headers.items():
        if _HEADER_NAME.fullmatch(name) is None:
            raise Invalid(
                f"headers.{name}",
                "expected a header name (letters, digits and !#$%&'*+-.^_`|~)",
            )
        if _HEADER_VALUE.fullmatch(value) is None:  # the value may be a secret: not shown
            raise Invalid(
                f"headers.{name}",
                "expected a header value without control characters (CR, LF and the like)",
            )


def _kind_capabilities(spec: ProviderSpec) -> Capabilities:
    return load_kind(spec.kind).capabilities


def _kind_options(spec: ProviderSpec) -> Any:
    return load_kind(spec.kind).options()


@attrs.frozen
class ProviderSpec:
    """One upstream API: a ``[[providers]]`` entry. ``api_key`` is read from the environment
    variable ``api_key_env``; ``capabilities`` are the kind's defaults with the entry's overrides;
    ``options`` are the kind's own keys, as its plugin's options spec."""

    name: str = attrs.field(
        validator=check(
            lambda name: _NAME.fullmatch(name) is not None,
            "letters, digits, '.', '_' or '-' (no '/' or ':')",
        )
    )
    kind: str
    base_url: str = attrs.field(converter=_http_url)
    api_key_env: str | None = attrs.field(
        default=None,
        validator=check(
            lambda name: _ENV_NAME.fullmatch(name) is not None,
            "the name of an environment variable",
        ),
    )
    api_key: str | None = attrs.field(default=None, repr=False)
    timeout_seconds: float | None = attrs.field(default=None, validator=_seconds)
    connect_timeout_seconds: float | None = attrs.field(default=None, validator=_seconds)
    first_token_timeout_seconds: float | None = attrs.field(default=None, validator=_seconds)
    stall_timeout_seconds: float | None = attrs.field(default=None, validator=_seconds)
    max_retries: int | None = attrs.field(  # None: UPSTREAM_MAX_RETRIES
        default=None, validator=check(lambda n: 0 <= n <= 10, "an integer 0-10")
    )
    max_connections: int = attrs.field(
        default=DEFAULT_MAX_CONNECTIONS,
        validator=check(lambda n: 1 <= n <= MOST_CONNECTIONS, f"an integer 1-{MOST_CONNECTIONS}"),
    )
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=False, validator=_headers)
    input_usd_per_mtok: float | None = attrs.field(
        default=None, validator=_price
    )  # both or neither
    output_usd_per_mtok: float | None = attrs.field(default=None, validator=_price)
    # A deployment that keeps failing is skipped this long.
    circuit_cooldown_seconds: float = attrs.field(
        default=30.0,
        validator=check(
            lambda n: 0 < n <= 86400, "a number of seconds, more than 0 and at most 86400"
        ),
    )
    circuit_max_failed_probes: int = attrs.field(
        default=STEADY_PROBES, validator=check(lambda n: 0 <= n <= 1000, "an integer 0-1000")
    )
    # None: MAX_COOLDOWN_SECONDS, or the cooldown when that is longer.
    circuit_max_cooldown_seconds: float | None = attrs.field(
        default=None,
        validator=check(
            lambda n: 0 < n <= 86400, "a number of seconds, more than 0 and at most 86400"
        ),
    )
    rpm: int | None = attrs.field(default=None, validator=_per_minute)  # requests per minute
    tpm: int | None = attrs.field(default=None, validator=_per_minute)  # tokens (worst case)
    capabilities: Capabilities = attrs.field(
        default=attrs.Factory(_kind_capabilities, takes_self=True)
    )
    options: Any = attrs.field(default=attrs.Factory(_kind_options, takes_self=True))

    def __attrs_post_init__(self) -> None:
        most = self.circuit_max_cooldown_seconds
        if most is not None and most < self.circuit_cooldown_seconds:
            raise Invalid(
                "circuit_max_cooldown_seconds",
                f"expected at least circuit_cooldown_seconds ({show(self.circuit_cooldown_seconds)}),"
                f" got {show(most)}",
            )

    def cooldown(self) -> Cooldown:
        """How long its deployments' breakers stay open."""
        seconds = self.circuit_cooldown_seconds
        most = self.circuit_max_cooldown_seconds
        return Cooldown(
            seconds=seconds,
            most=max(seconds, MAX_COOLDOWN_SECONDS) if most is None else most,
            steady_probes=self.circuit_max_failed_probes,
        )

    def timeouts(self, request_timeout: float) -> Timeouts:
        """This provider's timeouts; none is longer than one attempt (``request_timeout`` unless
        ``timeout_seconds`` is set)."""
        attempt = self.timeout_seconds or request_timeout

        def phase(configured: float | None, default: float) -> float:
            return min(attempt, default if configured is None else configured)

        return Timeouts(
            attempt=attempt,
            connect=phase(self.connect_timeout_seconds, DEFAULT_CONNECT_TIMEOUT),
            first_token=phase(self.first_token_timeout_seconds, DEFAULT_FIRST_TOKEN_TIMEOUT),
            stall=phase(self.stall_timeout_seconds, DEFAULT_STALL_TIMEOUT),
        )


# What the file gives, not what is derived from it: the key comes from the environment, the
# capabilities from keys of their own (the options, structured first, are passed in as they are).
CONVERTER.register_structure_hook(
    ProviderSpec,
    make_dict_structure_fn(
        ProviderSpec,
        CONVERTER,
        api_key=override(omit=True),
        capabilities=override(omit=True),
    ),
)
_PROVIDER_KEYS = tuple(
    field
    for field in attrs.fields_dict(ProviderSpec)
    if field not in ("api_key", "capabilities", "options")
)

NativeOrTranslate = Literal["translate", "native"]


@attrs.frozen
class _CapabilityKeys:
    """A ``[[providers]]`` entry's capability overrides; unset keys keep the kind's defaults."""

    reasoning: bool | None = None
    prefill: bool | None = None
    responses: NativeOrTranslate | None = None  # kept from before capabilities had a class
    messages: NativeOrTranslate | None = None

    def over(self, defaults: Capabilities) -> Capabilities:
        declared = {
            "reasoning": self.reasoning,
            "prefill": self.prefill,
            "native_responses": None if self.responses is None else self.responses == "native",
            "native_messages": None if self.messages is None else self.messages == "native",
        }
        return attrs.evolve(
            defaults, **{key: value for key, value in declared.items() if value is not None}
        )


_CAPABILITY_KEYS = tuple(attrs.fields_dict(_CapabilityKeys))


@attrs.frozen
class DeploymentSpec:
    """``provider:model``: a provider by name and the model id that provider knows."""

    provider: str
    model: str

    @property
    def label(self) -> str:
        return f"{self.provider}:{self.model}"


@attrs.frozen
class ModelAlias:
    alias: str
    deployments: tuple[DeploymentSpec, ...]  # tried in order, after the strategy's first choice
    strategy: Strategy = ORDERED
    cache: bool = True  # False: the response cache is never read or written for this alias
    cache_ttl_seconds: float | None = None  # None: CACHE_TTL_SECONDS


def _strip(name: str) -> str:
    return name.strip()


@attrs.frozen
class _ModelTable:
    """A ``[[models]]`` entry as the file has it."""

    alias: str = attrs.field(converter=_strip, validator=check(bool, "a non-empty model name"))
    deployments: tuple[str, ...] = attrs.field(
        validator=check(bool, 'at least one "provider:model"')
    )
    strategy: StrategyName = "ordered"
    weights: tuple[float, ...] | None = None
    cache: bool = True
    cache_ttl_seconds: float | None = attrs.field(
        default=None,
        validator=check(
            lambda v: v is None or 0 < v <= MAX_CACHE_TTL_SECONDS,
            f"a positive number of seconds, at most {MAX_CACHE_TTL_SECONDS}",
        ),
    )


@attrs.frozen
class ProvidersConfig:
    providers: tuple[ProviderSpec, ...]
    model_aliases: tuple[ModelAlias, ...]
    prices: tuple[PriceEntry, ...] = ()  # [[prices]] (llmgw.config.prices)


# A new top-level table: its key here, a field in ProvidersConfig, one line in _Parser.parse.
TOP_LEVEL_TABLES = ("providers", "models", "prices")


def load_provider_config(path: Path, environ: Mapping[str, str]) -> ProvidersConfig:
    """Read and validate the file; provider keys come from ``environ``. Raises ProviderConfigError."""
    parser = _Parser(path, environ)
    try:
        return parser.parse()
    except ConfigProblem as problem:
        raise ProviderConfigError(path, problem.where, problem.problem) from None


@attrs.frozen
class _Parser:
    path: Path
    environ: Mapping[str, str]

    def parse(self) -> ProvidersConfig:
        document = self.read()
        for key in document:
            if key not in TOP_LEVEL_TABLES:
                raise ConfigProblem(
                    key, f"unknown key; expected one of {', '.join(TOP_LEVEL_TABLES)}"
                )
        provider_tables = self.tables(document, "providers")
        if not provider_tables:
            raise ConfigProblem("providers", "at least one [[providers]] entry is required")
        providers = tuple(
            self.provider(table, f"providers[{index}]")
            for index, table in enumerate(provider_tables)
        )
        _check_unique([p.name for p in providers], "providers", "name")
        aliases = tuple(
            _model_alias(table, f"models[{index}]", providers)
            for index, table in enumerate(self.tables(document, "models"))
        )
        _check_unique([a.alias for a in aliases], "models", "alias")
        prices = parse_prices(self.tables(document, "prices"), _fail, [p.name for p in providers])
        return ProvidersConfig(providers, aliases, prices)

    def read(self) -> dict[str, Any]:
        try:
            return tomllib.loads(self.path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigProblem(
                "file", f"cannot be read ({exc.strerror or type(exc).__name__})"
            ) from None
        except UnicodeDecodeError:
            raise ConfigProblem("file", "is not UTF-8 text") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigProblem("file", f"is not valid TOML: {exc}") from None

    def provider(self, table: dict[str, Any], where: str) -> ProviderSpec:
        # Read first: the kind says which other keys the entry may have.
        kind = table.get("kind")
        if not isinstance(kind, str):
            problem = "is required" if kind is None else f"expected a string, got {show(kind)}"
            raise ConfigProblem(f"{where}.kind", problem)
        try:
            plugin = load_kind(kind)
        except KindError as exc:
            raise ConfigProblem(f"{where}.kind", str(exc)) from None
        option_keys = tuple(attrs.fields_dict(plugin.options))
        known = (*_PROVIDER_KEYS, *_CAPABILITY_KEYS, *option_keys)
        for key in table:
            if key not in known:
                raise ConfigProblem(f"{where}.{key}", _unknown_key(key, kind, known))
        options = structure(_only(table, option_keys), plugin.options, where)
        if "base_url" not in table and plugin.default_base_url is not None:
            table = {**table, "base_url": plugin.default_base_url(options)}
        # The options in, not their default: a kind's options may have keys that are required.
        spec = structure({**_only(table, _PROVIDER_KEYS), "options": options}, ProviderSpec, where)
        declared = structure(_only(table, _CAPABILITY_KEYS), _CapabilityKeys, where)
        if (spec.input_usd_per_mtok is None) != (spec.output_usd_per_mtok is None):
            raise ConfigProblem(
                f"{where}.input_usd_per_mtok",
                "input_usd_per_mtok and output_usd_per_mtok go together; set both or neither",
            )
        return attrs.evolve(
            spec,
            api_key=self.api_key(spec, where),
            capabilities=declared.over(plugin.capabilities),
        )

    def api_key(self, spec: ProviderSpec, where: str) -> str | None:
        if spec.api_key_env is None:
            return None
        api_key = self.environ.get(spec.api_key_env, "").strip() or None
        if api_key is None:
            raise ConfigProblem(
                f"{where}.api_key_env",
                f"environment variable {spec.api_key_env} is not set "
                f"(it holds {spec.name}'s API key)",
            )
        return api_key

    @staticmethod
    def tables(document: dict[str, Any], key: str) -> list[dict[str, Any]]:
        value = document.get(key, [])
        if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
            raise ConfigProblem(key, f"expected [[{key}]] tables")
        return value


def _unknown_key(key: str, kind: str, known: tuple[str, ...]) -> str:
    # A key of another kind's options (azure-openai's api_version on a venice entry) is named as
    # such: the entry is more likely of the wrong kind than the key misspelt.
    owners = [
        f'kind = "{installed.name}"'
        for installed in installed_kinds()
        if installed.name != kind and key in _option_keys(installed)
    ]
    if owners:
        return f"applies only to {' or '.join(owners)} (this provider is {show(kind)})"
    return f"unknown key; expected one of {', '.join(known)}"


def _option_keys(installed: InstalledKind) -> tuple[str, ...]:
    try:
        return tuple(attrs.fields_dict(installed.load().options))
    except KindError:  # a broken plugin owns no key; it is refused where an entry names it
        return ()


def _fail(where: str, problem: str) -> NoReturn:
    raise ConfigProblem(where, problem)


def _only(table: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: value for key, value in table.items() if key in keys}


def _model_alias(
    table: dict[str, Any], where: str, providers: tuple[ProviderSpec, ...]
) -> ModelAlias:
    entry = structure(table, _ModelTable, where)
    known = [p.name for p in providers]
    deployments = []
    for index, deployment in enumerate(entry.deployments):
        at = f"{where}.deployments[{index}]"
        provider, sep, model = deployment.partition(":")
        if not sep or not provider or not model.strip():
            raise ConfigProblem(at, f'expected "provider:model", got {show(deployment)}')
        if provider not in known:
            raise ConfigProblem(
                at,
                f"unknown provider {show(provider)} in {show(deployment)}; "
                f"providers are {', '.join(show(k) for k in known)}",
            )
        deployments.append(DeploymentSpec(provider, model.strip()))
    return ModelAlias(
        entry.alias,
        tuple(deployments),
        _strategy(entry, table, where),
        cache=entry.cache,
        cache_ttl_seconds=entry.cache_ttl_seconds,
    )


def _strategy(entry: _ModelTable, table: dict[str, Any], where: str) -> Strategy:
    weights = entry.weights
    if entry.strategy != "weighted":
        if weights is not None:
            raise ConfigProblem(f"{where}.weights", 'weights go with strategy = "weighted"')
        return Strategy(entry.strategy)
    if weights is None:
        raise ConfigProblem(
            f"{where}.weights", 'strategy = "weighted" needs one weight per deployment'
        )
    count = len(entry.deployments)
    if len(weights) != count or not all(0 <= w < float("inf") for w in weights):
        raise ConfigProblem(
            f"{where}.weights",
            f"expected {count} numbers >= 0 (one per deployment), got {show(table['weights'])}",
        )
    if not any(weights):
        raise ConfigProblem(f"{where}.weights", "at least one weight must be more than 0")
    return Strategy("weighted", weights)


def _check_unique(values: list[str], section: str, key: str) -> None:
    first_seen: dict[str, int] = {}
    for index, value in enumerate(values):
        if value in first_seen:
            raise ConfigProblem(
                f"{section}[{index}].{key}",
                f"{show(value)} is already used by {section}[{first_seen[value]}]",
            )
        first_seen[value] = index
