"""AWS credentials, request signing and the event stream's parser, for an adapter whose transport
is aiohttp (Bedrock's): botocore's, imported here once, with one message when it is missing.

Credentials come from botocore's standard chain, the one the AWS SDKs and CLI read: the
environment, a shared profile (``profile``), web identity (IRSA on EKS), the container endpoint
(ECS, EKS Pod Identity) and EC2 instance metadata. Temporary ones are refreshed by botocore
before they expire (from 15 minutes before, and always within 10): the refresh does blocking I/O,
so it runs in a thread, and only when it is due; between refreshes a signature costs no I/O.
Requests are signed with botocore's SigV4 signer, never by hand.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from llmgw.errors import UpstreamAuthFailed

try:
    import botocore.session
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import ReadOnlyCredentials, RefreshableCredentials
    from botocore.eventstream import EventStreamBuffer, ParserError
    from botocore.exceptions import BotoCoreError, ClientError
except ImportError as exc:  # an optional dependency: say how to install it
    raise ImportError(
        "the bedrock provider kind needs botocore: pip install 'llmgw[bedrock]'"
    ) from exc

__all__ = ["AwsSigner", "EventStreamBuffer", "ParserError"]

log = logging.getLogger(__name__)


class AwsSigner:
    """Signs requests for one service and region with the credentials the chain resolves."""

    def __init__(self, *, provider: str, service: str, region: str, profile: str | None) -> None:
        self._provider = provider
        self._service = service
        self.region = region
        self._profile = profile
        self._credentials: Any = None  # botocore's Credentials, resolved at the first request
        self._lock = asyncio.Lock()

    async def sign(self, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        """``headers`` with the SigV4 ones added (Authorization, X-Amz-Date, and
        X-Amz-Security-Token for temporary credentials) for a POST of ``body`` to ``url``."""
        request = AWSRequest(method="POST", url=url, data=body, headers=dict(headers))
        SigV4Auth(await self._frozen(), self._service, self.region).add_auth(request)
        return dict(request.headers.items())

    async def _frozen(self) -> ReadOnlyCredentials:
        credentials = self._credentials
        if credentials is not None and not _refresh_due(credentials):
            return credentials.get_frozen_credentials()
        async with self._lock:  # one resolution or refresh at a time; the others wait for it
            return await asyncio.to_thread(self._resolve)

    def _resolve(self) -> ReadOnlyCredentials:
        """In a thread: the chain's credentials, resolved or refreshed (both may do network I/O)."""
        try:
            if self._credentials is None:
                session = botocore.session.Session(profile=self._profile)
                if session.get_config_variable("region") is None:
                    # STS (web identity, assumed roles) in the provider's region, not the global one.
                    session.set_config_variable("region", self.region)
                self._credentials = session.get_credentials()
            if self._credentials is None:
                raise self._refused("found no AWS credentials in its environment")
            frozen: ReadOnlyCredentials = self._credentials.get_frozen_credentials()
        except (BotoCoreError, ClientError) as exc:  # messages name files and roles, no secret
            raise self._refused(f"could not get AWS credentials ({exc})") from None
        return frozen

    def _refused(self, problem: str) -> UpstreamAuthFailed:
        log.warning("provider %s: %s", self._provider, problem)
        return UpstreamAuthFailed.gateway_credentials(self._provider, problem)


def _refresh_due(credentials: Any) -> bool:
    return isinstance(credentials, RefreshableCredentials) and bool(credentials.refresh_needed())
