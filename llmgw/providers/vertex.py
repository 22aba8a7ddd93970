"""Google Vertex AI's Gemini models as an upstream (``kind = "vertex"``).

The API is the Gemini API's (``providers.gemini``, ``translation.gemini``) under another URL,
``{endpoint}/v1/projects/{project}/locations/{location}/publishers/google/models/{model}:...``,
where the endpoint is ``https://{location}-aiplatform.googleapis.com`` (``aiplatform.googleapis.com``
for ``location = "global"``) unless ``endpoint_url`` names another (Private Service Connect; a
test's fake). Each attempt carries ``Authorization: Bearer`` a token of google-auth's
(``providers.google_auth``), fetched again before it expires; a 401 (a token revoked or expired
early) fetches a new one and sends the request once more.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
import attrs
from aiohttp.typedefs import StrOrURL

from llmgw.config_converter import check
from llmgw.providers.base import UpstreamCall
from llmgw.providers.gemini import GEMINI_CAPABILITIES, GeminiProvider, model_segment
from llmgw.providers.google_auth import GoogleToken
from llmgw.providers.plugin import ProviderPlugin, ProviderSetup

__all__ = ["PLUGIN", "VertexOptions", "VertexProvider"]

_PROJECT: Final = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
_LOCATION: Final = re.compile(r"global|[a-z]+-[a-z]+\d+")


def _endpoint(options: VertexOptions) -> str:
    if options.endpoint_url is not None:
        return options.endpoint_url
    if options.location == "global":
        return "https://aiplatform.googleapis.com"
    return f"https://{options.location}-aiplatform.googleapis.com"


@attrs.frozen
class VertexOptions:
    """The keys of a ``kind = "vertex"`` entry beyond every provider's."""

    project: str = attrs.field(
        validator=check(lambda p: _PROJECT.fullmatch(p) is not None, "a Google Cloud project id")
    )
    location: str = attrs.field(
        default="global",
        validator=check(
            lambda loc: _LOCATION.fullmatch(loc) is not None,
            'a location, "us-central1" or "global"',
        ),
    )
    endpoint_url: str | None = attrs.field(
        default=None,
        validator=check(
            lambda u: u is None or u.startswith(("https://", "http://")), "an http(s) URL"
        ),
    )
    # A service-account key file; Application Default Credentials when not set.
    credentials_file: str | None = None


class VertexProvider(GeminiProvider):
    def __init__(self, *, token: GoogleToken, project: str, location: str, **options: Any) -> None:
        super().__init__(**options)
        self._token = token
        self._prefix = f"/v1/projects/{project}/locations/{location}/publishers/google/models/"

    def _url(self, path: str, model: str | None) -> str:
        return f"{self._base_url}{self._prefix}{model_segment(model)}{path}"

    async def _attempt(
        self,
        url: StrOrURL,
        call: UpstreamCall,
        headers: Mapping[str, str],
        answer_by: float,
        streaming: bool,
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        bearer = {**headers, "Authorization": f"Bearer {await self._token.token()}"}
        response, first = await super()._attempt(url, call, bearer, answer_by, streaming)
        if response.status != 401:
            return response, first
        # Refused before its expiry (revoked, or the clocks disagree): a new token, once.
        response.release()
        bearer["Authorization"] = f"Bearer {await self._token.token(renew=True)}"
        return await super()._attempt(url, call, bearer, answer_by, streaming)


def _from_setup(setup: ProviderSetup[VertexOptions]) -> VertexProvider:
    options = setup.options
    token = GoogleToken(provider=setup.name, credentials_file=options.credentials_file)
    return VertexProvider.from_setup(
        setup, token=token, project=options.project, location=options.location
    )


PLUGIN: Final[ProviderPlugin[VertexOptions]] = ProviderPlugin(
    factory=_from_setup,
    options=VertexOptions,
    capabilities=GEMINI_CAPABILITIES,
    summary="Google Vertex AI's Gemini models (google-auth credentials, tokens refreshed)",
    default_base_url=_endpoint,
)
