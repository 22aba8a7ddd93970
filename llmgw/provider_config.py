"""The providers configuration file named by ``LLMGW_CONFIG`` (TOML), parsed once into frozen classes.

    [[providers]]
    name = "venice"                  # unique; used in "provider/model" names, deployments, telemetry
    kind = "venice"                  # or "openai-compatible", "anthropic"
    base_url = "https://api.venice.ai/api/v1"
    api_key_env = "VENICE_API_KEY"   # optional (a local Ollama needs none); the key stays in the env
    timeout_seconds = 30             # optional: one attempt; default REQUEST_TIMEOUT_SECONDS
    connect_timeout_seconds = 5      # optional: to open a connection; default 5
    first_token_timeout_seconds = 60 # optional: to the first answer byte (a JSON answer's
                                     #   headers, a stream's first event); default 60
    stall_timeout_seconds = 60       # optional: longest silence inside a stream; default 60
    max_retries = 1                  # optional; default VENICE_MAX_RETRIES
    max_connections = 2048           # optional: calls in flight at once (a stream holds one for
                                     # its whole length); past it, a 503 after a short wait
    headers = { "OpenAI-Organization" = "org-..." }   # optional; sent on every call
    responses = "native"             # optional: it serves POST /responses itself; default
                                     # "translate" (Responses requests become chat completions)
    reasoning = false                # optional: it accepts reasoning_effort (Claude Code's
                                     # thinking, Codex's reasoning); default per kind, see
                                     # DEFAULT_CAPABILITIES
    prefill = false                  # optional: it continues a trailing assistant message
                                     # (a broken stream is finished that way); default false
    circuit_cooldown_seconds = 30    # optional: how long a deployment that keeps failing is
                                     #   skipped (doubles while it keeps failing, up to 300 s)
    rpm = 500                        # optional: the account's requests per minute, and
    tpm = 200000                     #   tokens per minute (a request's worst case), counted
                                     #   across replicas; a deployment of a provider at its
                                     #   cap is skipped (llmgw.routing.caps); default: no cap
    input_usd_per_mtok = 0.15        # optional price of every model of this provider, USD per
    output_usd_per_mtok = 0.60       #   million tokens (Venice publishes its own; these win)

    [[models]]
    alias = "fast"                   # what callers send as "model"
    deployments = ["venice:llama-3.2-3b", "local:llama3.2"]   # tried in order
    strategy = "weighted"            # optional: which one goes first; "ordered" (the default),
    weights = [3, 1]                 #   "weighted" (with one weight per deployment),
                                     #   "least-busy" or "least-latency" (llmgw.routing.strategy)

Every problem raises :class:`ProviderConfigError`, one line naming the file and the entry, e.g.
``LLMGW_CONFIG /etc/llmgw.toml: providers[1].kind: expected "venice" or "openai-compatible", got
"foo"``. Entries are counted from 0. Key values and header values are never echoed.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeAlias, cast, get_args

import attrs

from llmgw.accounting.price import PriceRule
from llmgw.accounting.price_config import parse_prices
from llmgw.config import DEFAULT_MAX_CONNECTIONS, MOST_CONNECTIONS, ConfigError, _parse_url
from llmgw.routing.strategy import ORDERED, STRATEGIES, Strategy, StrategyName

__all__ = [
    "DEFAULT_CAPABILITIES",
    "PROVIDER_KINDS",
    "Capabilities",
    "DeploymentSpec",
    "ModelAlias",
    "ProviderConfigError",
    "ProviderKind",
    "ProviderSpec",
    "ProvidersConfig",
    "ResponsesMode",
    "Timeouts",
    "load_provider_config",
]

ProviderKind = Literal["venice", "openai-compatible", "anthropic"]
PROVIDER_KINDS: tuple[ProviderKind, ...] = get_args(ProviderKind)
ResponsesMode = Literal["translate", "native"]
RESPONSES_MODES: tuple[ResponsesMode, ...] = get_args(ResponsesMode)

# Names appear in "provider/model" and "provider:model", so neither separator may be part of one.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ProviderConfigError(ConfigError):
    """The providers file is unreadable or invalid; the message names the file and the entry."""

    def __init__(self, path: Path, where: str, problem: str) -> None:
        # Not ConfigError's "VARIABLE has invalid value" sentence: the file, not the variable, is bad.
        Exception.__init__(self, f"LLMGW_CONFIG {path}: {where}: {problem}")
        self.variable = "LLMGW_CONFIG"


@attrs.frozen
class Capabilities:
    """What a provider's deployments accept beyond plain chat completions. The gateway sends a
    feature only to a deployment declared to have it (and says what it left out), because an
    upstream that refuses a parameter fails every request that carries it."""

    reasoning: bool  # reasoning_effort / reasoning: chat's effort, Anthropic's thinking mapped
    # A trailing assistant message is continued, not answered with a new turn: a stream broken
    # mid-answer is finished by sending the text already relayed as that message.
    prefill: bool = False
    # POST /messages (the Anthropic Messages API) is served natively: a /v1/messages request
    # routed only to such deployments is forwarded as the caller sent it, not translated to chat.
    messages: bool = False

    @classmethod
    def common_to(cls, every: Iterable[Capabilities]) -> Capabilities:
        """What all of ``every`` accept (a route that may fall back to any of them)."""
        every = tuple(every)
        return cls(
            reasoning=all(c.reasoning for c in every),
            prefill=all(c.prefill for c in every),
            messages=all(c.messages for c in every),
        )


# Venice documents reasoning_effort on every chat model (non-reasoning ones ignore it). An
# openai-compatible server may not: OpenAI refuses it for non-reasoning models, vLLM and
# LiteLLM for many, with a 400 on every request; so it is sent there only when declared.
# Prefill is off for both kinds: Venice does not document it, OpenAI and Azure answer a trailing
# assistant message with a new turn, and vLLM and Ollama continue it only for some models or
# templates (shared/provider-failures.md F3). Declare ``prefill = true`` for one that does.
DEFAULT_CAPABILITIES: Mapping[ProviderKind, Capabilities] = {
    "venice": Capabilities(reasoning=True, prefill=False),
    "openai-compatible": Capabilities(reasoning=False, prefill=False),
    # Every current Claude model thinks and continues a trailing assistant message
    # (shared/provider-failures.md F3), and Messages is the API itself.
    "anthropic": Capabilities(reasoning=True, prefill=True, messages=True),
}


def _default_capabilities(spec: ProviderSpec) -> Capabilities:
    return DEFAULT_CAPABILITIES[spec.kind]


@attrs.frozen
class Timeouts:
    """How long one attempt on a provider may take, and may stay silent, phase by phase (seconds).

    A silent provider is given up at the first phase it overruns, and the route moves on.
    """

    attempt: float  # one attempt: a JSON answer whole, a stream up to its first event
    connect: float  # TCP (and TLS) connection
    first_token: float  # to the first answer byte: a JSON answer's headers, a stream's first event
    stall: float  # between two reads of a stream


# Production defaults. A healthy API connects in well under a second; most models start to answer
# within seconds, but a long non-streamed answer sends its headers only when it is whole, and a
# reasoning model may think in silence after its first (role-only) event: a minute for both.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_FIRST_TOKEN_TIMEOUT = 60.0
DEFAULT_STALL_TIMEOUT = 60.0


@attrs.frozen
class ProviderSpec:
    """One upstream API. ``api_key`` is read from the environment variable ``api_key_env``."""

    name: str
    kind: ProviderKind
    base_url: str
    api_key_env: str | None = None
    api_key: str | None = attrs.field(default=None, repr=False)
    timeout_seconds: float | None = None  # None: REQUEST_TIMEOUT_SECONDS
    connect_timeout_seconds: float | None = None  # None: DEFAULT_CONNECT_TIMEOUT
    first_token_timeout_seconds: float | None = None  # None: DEFAULT_FIRST_TOKEN_TIMEOUT
    stall_timeout_seconds: float | None = None  # None: DEFAULT_STALL_TIMEOUT
    max_retries: int | None = None  # None: VENICE_MAX_RETRIES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    responses: ResponsesMode = "translate"  # how POST /v1/responses reaches it
    input_usd_per_mtok: float | None = None  # both or neither
    output_usd_per_mtok: float | None = None
    circuit_cooldown_seconds: float = 30.0  # a deployment that keeps failing is skipped this long
    rpm: int | None = None  # the account's requests per minute, across replicas; None: no cap
    tpm: int | None = None  # its tokens per minute (a request's worst case); None: no cap
    capabilities: Capabilities = attrs.field(
        default=attrs.Factory(_default_capabilities, takes_self=True)
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


@attrs.frozen
class ProvidersConfig:
    providers: tuple[ProviderSpec, ...]
    model_aliases: tuple[ModelAlias, ...]
    prices: tuple[PriceRule, ...] = ()  # [[prices]] (llmgw.accounting.price_config)


def load_provider_config(path: Path, environ: Mapping[str, str]) -> ProvidersConfig:
    """Read and validate the file; provider keys come from ``environ``. Raises ProviderConfigError."""
    return _Parser(path, environ).parse()


def _show(value: object) -> str:
    """A value from the file, quoted like TOML would write it, on one line."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return type(value).__name__


# The file's keys are the spec's fields, but the key itself (it comes from the environment);
# each capability is a key of its own next to them.
_CAPABILITY_KEYS = tuple(attrs.fields_dict(Capabilities))
_PROVIDER_KEYS = (
    *(
        field
        for field in attrs.fields_dict(ProviderSpec)
        if field not in ("api_key", "capabilities")
    ),
    *_CAPABILITY_KEYS,
)
_MODEL_KEYS = ("alias", "deployments", "strategy", "weights")

_Kind: TypeAlias = type | tuple[type, ...]
_NUMBER = (int, float)
_KIND_NAMES: dict[_Kind, str] = {
    str: "a string",
    int: "an integer",
    _NUMBER: "a number",
    bool: "true or false",
    list: "an array",
    dict: "a table",
}


@attrs.frozen
class _Parser:
    path: Path
    environ: Mapping[str, str]

    def fail(self, where: str, problem: str) -> NoReturn:
        raise ProviderConfigError(self.path, where, problem)

    def parse(self) -> ProvidersConfig:
        try:
            document = tomllib.loads(self.path.read_text(encoding="utf-8"))
        except OSError as exc:
            self.fail("file", f"cannot be read ({exc.strerror or type(exc).__name__})")
        except UnicodeDecodeError:
            self.fail("file", "is not UTF-8 text")
        except tomllib.TOMLDecodeError as exc:
            self.fail("file", f"is not valid TOML: {exc}")
        self.reject_unknown_keys(document, "", ("providers", "models", "prices"))
        provider_tables = self.tables(document, "providers")
        if not provider_tables:
            self.fail("providers", "at least one [[providers]] entry is required")
        providers = tuple(
            self.provider(table, f"providers[{index}]")
            for index, table in enumerate(provider_tables)
        )
        self.check_unique([p.name for p in providers], "providers", "name")
        aliases = tuple(
            self.model_alias(table, f"models[{index}]", providers)
            for index, table in enumerate(self.tables(document, "models"))
        )
        self.check_unique([a.alias for a in aliases], "models", "alias")
        prices = parse_prices(
            self.tables(document, "prices"), self.fail, [p.name for p in providers]
        )
        return ProvidersConfig(providers, aliases, prices)

    # Entries ---------------------------------------------------------------------------------

    def provider(self, table: dict[str, Any], where: str) -> ProviderSpec:
        self.reject_unknown_keys(table, where + ".", _PROVIDER_KEYS)
        name = self.name(table, where, "name")
        kind = self.required(table, where, "kind", str)
        if kind not in PROVIDER_KINDS:
            expected = " or ".join(_show(k) for k in PROVIDER_KINDS)
            self.fail(f"{where}.kind", f"expected {expected}, got {_show(kind)}")
        base_url = self.required(table, where, "base_url", str)
        try:
            base_url = _parse_url("http", "https")(base_url)
        except ValueError:
            self.fail(f"{where}.base_url", f"expected an http(s) URL, got {_show(base_url)}")
        api_key_env = self.optional(table, where, "api_key_env", str)
        api_key = None
        if api_key_env is not None:
            if not _ENV_NAME.fullmatch(api_key_env):
                self.fail(
                    f"{where}.api_key_env",
                    f"expected the name of an environment variable, got {_show(api_key_env)}",
                )
            api_key = self.environ.get(api_key_env, "").strip() or None
            if api_key is None:
                self.fail(
                    f"{where}.api_key_env",
                    f"environment variable {api_key_env} is not set (it holds {name}'s API key)",
                )
        timeout = self.seconds(table, where, "timeout_seconds")
        connect = self.seconds(table, where, "connect_timeout_seconds")
        first_token = self.seconds(table, where, "first_token_timeout_seconds")
        stall = self.seconds(table, where, "stall_timeout_seconds")
        retries = self.optional(table, where, "max_retries", int)
        if retries is not None and not 0 <= retries <= 10:
            self.fail(f"{where}.max_retries", f"expected an integer 0-10, got {_show(retries)}")
        connections = self.optional(table, where, "max_connections", int)
        if connections is not None and not 1 <= connections <= MOST_CONNECTIONS:
            self.fail(
                f"{where}.max_connections",
                f"expected an integer 1-{MOST_CONNECTIONS}, got {_show(connections)}",
            )
        price_keys = ("input_usd_per_mtok", "output_usd_per_mtok")
        prices = [self.optional(table, where, price_key, _NUMBER) for price_key in price_keys]
        for price_key, value in zip(price_keys, prices, strict=True):
            if value is not None and not 0 <= value < float("inf"):
                self.fail(f"{where}.{price_key}", f"expected a number >= 0, got {_show(value)}")
        if (prices[0] is None) != (prices[1] is None):
            self.fail(
                f"{where}.input_usd_per_mtok",
                "input_usd_per_mtok and output_usd_per_mtok go together; set both or neither",
            )
        cooldown = self.optional(table, where, "circuit_cooldown_seconds", _NUMBER)
        if cooldown is not None and not 0 < cooldown <= 86400:
            self.fail(
                f"{where}.circuit_cooldown_seconds",
                f"expected a number of seconds, more than 0 and at most 86400, got {_show(cooldown)}",
            )
        rpm, tpm = (self.per_minute(table, where, key) for key in ("rpm", "tpm"))
        headers = self.optional(table, where, "headers", dict) or {}
        for header, value in headers.items():
            if not isinstance(value, str):
                self.fail(f"{where}.headers.{header}", "expected a string")
        responses = self.optional(table, where, "responses", str) or "translate"
        if responses not in RESPONSES_MODES:
            expected = " or ".join(_show(m) for m in RESPONSES_MODES)
            self.fail(f"{where}.responses", f"expected {expected}, got {_show(responses)}")
        defaults = DEFAULT_CAPABILITIES[cast(ProviderKind, kind)]
        declared = {key: self.optional(table, where, key, bool) for key in _CAPABILITY_KEYS}
        capabilities = attrs.evolve(
            defaults, **{key: value for key, value in declared.items() if value is not None}
        )
        return ProviderSpec(
            name=name,
            kind=cast(ProviderKind, kind),
            base_url=base_url,
            api_key_env=api_key_env,
            api_key=api_key,
            timeout_seconds=timeout,
            connect_timeout_seconds=connect,
            first_token_timeout_seconds=first_token,
            stall_timeout_seconds=stall,
            max_retries=retries,
            max_connections=DEFAULT_MAX_CONNECTIONS if connections is None else connections,
            headers=dict(headers),
            responses=cast(ResponsesMode, responses),
            input_usd_per_mtok=None if prices[0] is None else float(prices[0]),
            output_usd_per_mtok=None if prices[1] is None else float(prices[1]),
            circuit_cooldown_seconds=30.0 if cooldown is None else float(cooldown),
            rpm=rpm,
            tpm=tpm,
            capabilities=capabilities,
        )

    def model_alias(
        self, table: dict[str, Any], where: str, providers: tuple[ProviderSpec, ...]
    ) -> ModelAlias:
        self.reject_unknown_keys(table, where + ".", _MODEL_KEYS)
        alias = self.required(table, where, "alias", str).strip()
        if not alias:
            self.fail(f"{where}.alias", "expected a non-empty model name")
        entries = self.required(table, where, "deployments", list)
        if not entries:
            self.fail(f"{where}.deployments", 'expected at least one "provider:model"')
        known = [p.name for p in providers]
        deployments = []
        for index, entry in enumerate(entries):
            at = f"{where}.deployments[{index}]"
            provider, sep, model = entry.partition(":") if isinstance(entry, str) else ("", "", "")
            if not sep or not provider or not model.strip():
                self.fail(at, f'expected "provider:model", got {_show(entry)}')
            if provider not in known:
                self.fail(
                    at,
                    f"unknown provider {_show(provider)} in {_show(entry)}; "
                    f"providers are {', '.join(_show(k) for k in known)}",
                )
            deployments.append(DeploymentSpec(provider, model.strip()))
        return ModelAlias(alias, tuple(deployments), self.strategy(table, where, len(deployments)))

    def strategy(self, table: dict[str, Any], where: str, deployments: int) -> Strategy:
        name = self.optional(table, where, "strategy", str) or "ordered"
        if name not in STRATEGIES:
            expected = ", ".join(_show(s) for s in STRATEGIES)
            self.fail(f"{where}.strategy", f"expected one of {expected}, got {_show(name)}")
        weights = self.optional(table, where, "weights", list)
        if name != "weighted":
            if weights is not None:
                self.fail(f"{where}.weights", 'weights go with strategy = "weighted"')
            return Strategy(cast(StrategyName, name))
        if weights is None:
            self.fail(f"{where}.weights", 'strategy = "weighted" needs one weight per deployment')
        if len(weights) != deployments or not all(
            isinstance(w, _NUMBER) and not isinstance(w, bool) and 0 <= w < float("inf")
            for w in weights
        ):
            self.fail(
                f"{where}.weights",
                f"expected {deployments} numbers >= 0 (one per deployment), got {_show(weights)}",
            )
        if not any(weights):
            self.fail(f"{where}.weights", "at least one weight must be more than 0")
        return Strategy("weighted", tuple(float(w) for w in weights))

    # Values ----------------------------------------------------------------------------------

    def seconds(self, table: dict[str, Any], where: str, key: str) -> float | None:
        value = self.optional(table, where, key, _NUMBER)
        if value is not None and not 0 < value < float("inf"):
            self.fail(f"{where}.{key}", f"expected a positive number, got {_show(value)}")
        return None if value is None else float(value)

    def per_minute(self, table: dict[str, Any], where: str, key: str) -> int | None:
        value: int | None = self.optional(table, where, key, int)
        if value is not None and value < 1:
            self.fail(
                f"{where}.{key}",
                f"expected a whole number per minute, at least 1, got {_show(value)}",
            )
        return value

    def name(self, table: dict[str, Any], where: str, key: str) -> str:
        value: str = self.required(table, where, key, str)
        if not _NAME.fullmatch(value):
            self.fail(
                f"{where}.{key}",
                f"expected letters, digits, '.', '_' or '-' (no '/' or ':'), got {_show(value)}",
            )
        return value

    def required(self, table: dict[str, Any], where: str, key: str, kind: _Kind) -> Any:
        value = self.optional(table, where, key, kind)
        if value is None:
            self.fail(f"{where}.{key}", "is required")
        return value

    def optional(self, table: dict[str, Any], where: str, key: str, kind: _Kind) -> Any:
        value = table.get(key)
        # bool is an int to Python, not to TOML: true is no number, 1 no boolean.
        if value is not None and (
            isinstance(value, bool) != (kind is bool) or not isinstance(value, kind)
        ):
            self.fail(f"{where}.{key}", f"expected {_KIND_NAMES[kind]}, got {_show(value)}")
        return value

    def tables(self, document: dict[str, Any], key: str) -> list[dict[str, Any]]:
        value = document.get(key, [])
        if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
            self.fail(key, f"expected [[{key}]] tables")
        return value

    def reject_unknown_keys(
        self, table: dict[str, Any], prefix: str, known: tuple[str, ...]
    ) -> None:
        for key in table:
            if key not in known:
                self.fail(f"{prefix}{key}", f"unknown key; expected one of {', '.join(known)}")

    def check_unique(self, values: list[str], section: str, key: str) -> None:
        first_seen: dict[str, int] = {}
        for index, value in enumerate(values):
            if value in first_seen:
                self.fail(
                    f"{section}[{index}].{key}",
                    f"{_show(value)} is already used by {section}[{first_seen[value]}]",
                )
            first_seen[value] = index
