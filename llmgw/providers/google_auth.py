"""Google OAuth access tokens for an adapter whose transport is aiohttp (Vertex AI's).

Credentials come from google-auth, the maintained implementation: a service-account file when the
provider names one, else Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``,
gcloud's user credentials, or the metadata server: GKE Workload Identity, Compute Engine). A token
is fetched again before it expires: google-auth counts one as invalid from 3 min 45 s before its
expiry, and such a token is never sent. Fetching is blocking I/O, so it runs in a thread, only
when it is due, one at a time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from llmgw.errors import UpstreamAuthFailed

try:
    import google.auth
    import google.auth.transport.requests
    from google.auth.exceptions import GoogleAuthError
    from google.oauth2 import service_account
except ImportError as exc:  # an optional dependency: say how to install it
    raise ImportError(
        "the vertex provider kind needs google-auth: pip install 'llmgw[vertex]'"
    ) from exc

__all__ = ["SCOPES", "GoogleToken"]

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)

log = logging.getLogger(__name__)


class GoogleToken:
    """The current access token of one provider's credentials."""

    def __init__(self, *, provider: str, credentials_file: str | None) -> None:
        self._provider = provider
        self._file = credentials_file
        self._credentials: Any = None  # google-auth's Credentials, made at the first request
        self._lock = asyncio.Lock()

    async def token(self, *, renew: bool = False) -> str:
        """A token valid for a while yet; ``renew``: a new one whatever the old one's expiry (the
        API refused it)."""
        credentials = self._credentials
        if credentials is not None and credentials.valid and not renew:
            return str(credentials.token)
        async with self._lock:  # one fetch at a time; the others wait for it and reuse it
            credentials = self._credentials
            if credentials is not None and credentials.valid and not renew:
                return str(credentials.token)
            return await asyncio.to_thread(self._fetch)

    def _fetch(self) -> str:
        """In a thread: the credentials made if need be, and a new token (both may do I/O)."""
        try:
            if self._credentials is None:
                if self._file is not None:
                    # google-auth leaves this constructor untyped.
                    self._credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                        self._file, scopes=SCOPES
                    )
                else:
                    self._credentials, _ = google.auth.default(scopes=SCOPES)
            self._credentials.refresh(google.auth.transport.requests.Request())
        except (GoogleAuthError, OSError, ValueError) as exc:  # messages name files, never a key
            problem = f"could not get a Google access token ({type(exc).__name__}: {exc})"
            log.warning("provider %s: %s", self._provider, problem)
            raise UpstreamAuthFailed.gateway_credentials(self._provider, problem) from None
        return str(self._credentials.token)
