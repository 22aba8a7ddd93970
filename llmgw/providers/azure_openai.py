"""Azure OpenAI: OpenAI's API under another URL scheme and another key header.

``base_url`` is the resource's endpoint (``https://<resource>.openai.azure.com``); the adapter adds
the rest (shared/azure-openai.md Z0, Z10):

    api_version set (classic)   {base_url}/openai/deployments/{model}/chat/completions?api-version=...
                                (the model is the deployment's name; the body keeps its "model",
                                as the official SDK sends it); an operation not bound to a
                                deployment (/responses) goes to {base_url}/openai/...?api-version=...
    no api_version (v1)         {base_url}/openai/v1/chat/completions, the deployment in "model"

The key goes in ``api-key``, which both schemes accept. Everything else is OpenAI's: the answers,
their ``prompt_filter_results`` / ``content_filter_results`` (passed to the caller as they come),
and the errors, which ``retry.decide`` reads (a ``content_filter`` refusal stops the route; a 429's
``retry-after-ms`` is its wait). ``shared/azure-openai.md``'s sections are cited as Z0-Z12.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import attrs
import orjson

from llmgw.config.converter import check
from llmgw.errors import InvalidRequest
from llmgw.providers.base import UpstreamCall, UpstreamResponse
from llmgw.providers.openai_compatible import (
    OPENAI_COMPATIBLE_CAPABILITIES,
    OpenAICompatibleProvider,
)
from llmgw.providers.plugin import ProviderPlugin, ProviderSetup

__all__ = ["PLUGIN", "AzureOpenAIProvider", "AzureOptions"]

# Azure's api-versions: "2024-10-21", "2025-04-01-preview" (Z1).
_API_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")

# The operations the classic scheme serves per deployment (the official SDK's list, Z10).
_DEPLOYMENT_OPERATIONS = frozenset({"/chat/completions", "/completions", "/embeddings"})
_DEPLOYMENT_PREFIXES = ("/audio/", "/images/")
_NO_MODELS = UpstreamResponse(200, b'{"object":"list","data":[]}', "application/json")
# Azure's "On Your Data": Azure queries the search indexes or databases the request names, with
# credentials it may take from the resource itself (its managed identity), so a caller could
# read the operator's data through it (Z4). Refused rather than dropped: the caller is told.
_DATA_SOURCES = "data_sources"


def _refuse_data_sources(call: UpstreamCall) -> None:
    # The byte search first: a body without the word is not parsed again.
    if f'"{_DATA_SOURCES}"'.encode() not in call.body:
        return
    document = orjson.loads(call.body)
    if isinstance(document, dict) and _DATA_SOURCES in document:
        raise InvalidRequest(
            "data_sources (Azure On Your Data) is not forwarded to Azure by this gateway.",
            param=_DATA_SOURCES,
        )


class AzureOpenAIProvider(OpenAICompatibleProvider):
    def __init__(self, *, api_version: str | None = None, **options: Any) -> None:
        super().__init__(**options)
        self._query = "" if api_version is None else "?" + urlencode({"api-version": api_version})

    def _credentials(self, api_key: str) -> Mapping[str, str]:
        return {"api-key": api_key}

    def _url(self, path: str, model: str | None) -> str:
        if not self._query:
            return f"{self._base_url}/openai/v1{path}"
        if model is None or not (
            path in _DEPLOYMENT_OPERATIONS or path.startswith(_DEPLOYMENT_PREFIXES)
        ):
            return f"{self._base_url}/openai{path}{self._query}"
        if model in (".", ".."):
            # One path segment, quoted below; these two would still move the path up a level.
            raise InvalidRequest(f"{model!r} is not the name of an Azure deployment.")
        return f"{self._base_url}/openai/deployments/{quote(model, safe='')}{path}{self._query}"

    async def _post(
        self, path: str, call: UpstreamCall, *, accept: str, streaming: bool
    ) -> tuple[aiohttp.ClientResponse, int, bytes]:
        if path == "/chat/completions":
            _refuse_data_sources(call)
        return await super()._post(path, call, accept=accept, streaming=streaming)

    async def list_models(self, deadline: float) -> UpstreamResponse:
        # Azure's /models lists the models the resource could deploy, not its deployments, the
        # names requests must use (Z3), and an inference key cannot list those: callers reach
        # an Azure provider through aliases and "provider/deployment" names, so it lists none.
        return _NO_MODELS


@attrs.frozen
class AzureOptions:
    """The keys of a ``kind = "azure-openai"`` entry beyond every provider's."""

    # The classic API's api-version, with the model as the deployment in the URL; None: the v1 API.
    api_version: str | None = attrs.field(
        default=None,
        validator=check(
            lambda version: _API_VERSION.fullmatch(version) is not None,
            'an Azure api-version such as "2024-10-21"',
        ),
    )


def _from_setup(setup: ProviderSetup[AzureOptions]) -> AzureOpenAIProvider:
    return AzureOpenAIProvider.from_setup(setup, api_version=setup.options.api_version)


# Azure serves OpenAI's models with OpenAI's schema, so it refuses reasoning_effort for a
# deployment of a model that does not reason, as OpenAI does (Z4), and answers a trailing
# assistant message with a new turn: an OpenAI-compatible API's defaults.
PLUGIN: ProviderPlugin[AzureOptions] = ProviderPlugin(
    factory=_from_setup,
    options=AzureOptions,
    capabilities=OPENAI_COMPATIBLE_CAPABILITIES,
    summary="Azure OpenAI (classic deployments with api_version, or the v1 API)",
)
