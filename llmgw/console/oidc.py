"""Single sign-on for the console: OpenID Connect, authorization code flow with PKCE (S256),
``state`` and ``nonce``.

The provider is found by discovery (``{issuer}/.well-known/openid-configuration``); the ID token is
verified by joserfc against the provider's JWKS (fetched again when a token names a key id it does
not hold, as providers rotate keys), and its ``iss``, ``aud``, ``exp`` and ``nonce`` are checked.
Anything wrong is an :class:`OidcError` whose message is safe to show: no token or secret in it.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import aiohttp
import attrs
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

__all__ = ["OidcClient", "OidcError", "OidcSettings", "SignInStart"]

_TIMEOUT = aiohttp.ClientTimeout(total=10)
# Asymmetric algorithms only: "none" and HMAC (keyed by the client secret) are not accepted.
_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
_LEEWAY_SECONDS = 60  # clock skew between the provider and this gateway


class OidcError(Exception):
    """A sign-in that cannot go on; the message says why, for the page and the warning line."""


@attrs.frozen
class OidcSettings:
    issuer: str
    client_id: str
    client_secret: str = attrs.field(repr=False)
    redirect_url: str | None = None  # None: this host's /console/oidc/callback
    groups_claim: str = "groups"
    admin_groups: tuple[str, ...] = ()


@attrs.frozen
class SignInStart:
    """A sign-in under way: where to send the browser, and what the callback must match."""

    url: str
    state: str = attrs.field(repr=False)
    nonce: str = attrs.field(repr=False)
    code_verifier: str = attrs.field(repr=False)


def _challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class OidcClient:
    def __init__(self, settings: OidcSettings, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self._metadata: dict[str, Any] | None = None
        self._keys: KeySet | None = None

    async def _get_json(self, url: str) -> dict[str, Any]:
        try:
            async with (
                aiohttp.ClientSession(timeout=_TIMEOUT) as session,
                session.get(url, headers={"Accept": "application/json"}) as response,
            ):
                if response.status != 200:
                    raise OidcError(f"The identity provider answered {response.status} at {url}.")
                found = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise OidcError(
                f"The identity provider cannot be reached at {url} ({type(exc).__name__})."
            ) from None
        if not isinstance(found, dict):
            raise OidcError(f"The identity provider's answer at {url} is not a JSON object.")
        return found

    async def metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            issuer = self.settings.issuer
            found = await self._get_json(f"{issuer}/.well-known/openid-configuration")
            if str(found.get("issuer", "")).rstrip("/") != issuer:
                raise OidcError("The identity provider's discovery document names another issuer.")
            for needed in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                if not isinstance(found.get(needed), str):
                    raise OidcError(f"The identity provider's discovery document lacks {needed}.")
            self._metadata = found
        return self._metadata

    async def _key_set(self, *, refresh: bool = False) -> KeySet:
        if self._keys is None or refresh:
            jwks = await self._get_json((await self.metadata())["jwks_uri"])
            try:
                self._keys = KeySet.import_key_set(jwks)  # type: ignore[arg-type]
            except (JoseError, ValueError, TypeError, KeyError):
                raise OidcError("The identity provider's JWKS cannot be read.") from None
        return self._keys

    async def start(self, redirect_uri: str) -> SignInStart:
        state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(64)
        query = urllib.parse.urlencode(
            {
                "response_type": "code",
                "client_id": self.settings.client_id,
                "redirect_uri": redirect_uri,
                "scope": "openid email profile",
                "state": state,
                "nonce": nonce,
                "code_challenge": _challenge(verifier),
                "code_challenge_method": "S256",
            }
        )
        endpoint = (await self.metadata())["authorization_endpoint"]
        separator = "&" if "?" in endpoint else "?"
        return SignInStart(f"{endpoint}{separator}{query}", state, nonce, verifier)

    async def exchange(self, code: str, code_verifier: str, redirect_uri: str) -> str:
        """The authorization code for the ID token (the client authenticates with its secret)."""
        endpoint = (await self.metadata())["token_endpoint"]
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": code_verifier,
        }
        # client_secret_basic, each part form-encoded first (RFC 6749 section 2.3.1).
        credentials = (
            f"{urllib.parse.quote(self.settings.client_id, safe='')}:"
            f"{urllib.parse.quote(self.settings.client_secret, safe='')}"
        )
        auth = "Basic " + base64.b64encode(credentials.encode()).decode()
        try:
            async with (
                aiohttp.ClientSession(timeout=_TIMEOUT) as session,
                session.post(endpoint, data=form, headers={"Authorization": auth}) as response,
            ):
                answer = await response.json(content_type=None)
                status = response.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise OidcError(
                f"The identity provider's token endpoint cannot be reached ({type(exc).__name__})."
            ) from None
        if status != 200 or not isinstance(answer, dict):
            error = answer.get("error") if isinstance(answer, dict) else None
            raise OidcError(
                f"The identity provider refused the sign-in code ({status}"
                f"{', ' + str(error)[:80] if error else ''})."
            )
        id_token = answer.get("id_token")
        if not isinstance(id_token, str):
            raise OidcError("The identity provider's answer has no ID token.")
        return id_token

    async def verify(self, id_token: str, nonce: str) -> dict[str, Any]:
        """The ID token's claims, once its signature, issuer, audience, expiry and nonce hold."""
        try:
            kid = jws.extract_compact(id_token.encode()).protected.get("kid")
        except (JoseError, ValueError):
            raise OidcError("The ID token is not a signed JWT.") from None
        keys = await self._key_set()
        if kid is not None and all(key.kid != kid for key in keys):
            keys = await self._key_set(refresh=True)  # the provider rotated its keys
        try:
            token = jwt.decode(id_token, keys, algorithms=list(_ALGORITHMS))
        except (JoseError, ValueError):
            raise OidcError("The ID token's signature does not verify.") from None
        registry = jwt.JWTClaimsRegistry(
            now=int(self._clock()),
            leeway=_LEEWAY_SECONDS,
            iss={"essential": True, "value": self.settings.issuer},
            aud={"essential": True, "value": self.settings.client_id},
            exp={"essential": True},
            nonce={"essential": True, "value": nonce},
        )
        try:
            registry.validate(token.claims)
        except JoseError as exc:
            raise OidcError(f"The ID token was refused ({exc.error}).") from None
        if not isinstance(token.claims.get("sub"), str):
            raise OidcError("The ID token names no subject.")
        return dict(token.claims)

    def groups(self, claims: dict[str, Any]) -> frozenset[str]:
        found = claims.get(self.settings.groups_claim, ())
        if isinstance(found, str):
            found = [found]
        if not isinstance(found, list):
            return frozenset()
        return frozenset(group for group in found if isinstance(group, str))
