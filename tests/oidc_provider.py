"""A small OpenID provider for tests: discovery, an authorization endpoint that signs the person
in at once, a token endpoint that checks the client secret and the PKCE verifier, and a JWKS; ID
tokens are real RS256 JWTs. Tests change ``person`` (who signs in) and ``tamper`` (what is wrong
with the next token) to play an attacker or a misconfigured provider."""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

CLIENT_ID = "llmgw-console"
CLIENT_SECRET = "test-client-secret-0123456789"


@attrs.define
class Grant:
    claims: dict[str, Any]
    redirect_uri: str
    challenge: str
    nonce: str


class OidcProvider:
    def __init__(self) -> None:
        self.key = RSAKey.generate_key(2048, parameters={"kid": "key-1"})
        self.server: TestServer | None = None
        self.person: dict[str, Any] = {"sub": "u-1", "email": "ada@example.com", "groups": []}
        # Changes the next ID token's claims (and so what the gateway sees) in place.
        self.tamper: Callable[[dict[str, Any]], None] = lambda claims: None
        self.signing_key: RSAKey | None = None  # another key: a forged signature
        self.grants: dict[str, Grant] = {}
        self.authorize_queries: list[dict[str, str]] = []
        self.jwks_fetches = 0

    @property
    def issuer(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    def gateway_settings(self, *admin_groups: str) -> dict[str, Any]:
        """The gateway's settings that sign people in through this provider, ``admin_groups``'
        members as admins."""
        return {
            "oidc_issuer": self.issuer,
            "oidc_client_id": CLIENT_ID,
            "oidc_client_secret": CLIENT_SECRET,
            "oidc_admin_groups": admin_groups,
        }

    def rotate_key(self) -> None:
        """A new signing key with a new kid, as providers roll their keys."""
        self.key = RSAKey.generate_key(2048, parameters={"kid": f"key-{secrets.token_hex(4)}"})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", self.discovery)
        app.router.add_get("/authorize", self.authorize)
        app.router.add_post("/token", self.token)
        app.router.add_get("/jwks", self.jwks)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()

    async def discovery(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": self.issuer,
                "authorization_endpoint": f"{self.issuer}/authorize",
                "token_endpoint": f"{self.issuer}/token",
                "jwks_uri": f"{self.issuer}/jwks",
                "response_types_supported": ["code"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "code_challenge_methods_supported": ["S256"],
            }
        )

    async def authorize(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        self.authorize_queries.append(query)
        if query.get("client_id") != CLIENT_ID or query.get("code_challenge_method") != "S256":
            return web.Response(status=400, text="bad request")
        code = secrets.token_urlsafe(16)
        self.grants[code] = Grant(
            dict(self.person), query["redirect_uri"], query["code_challenge"], query["nonce"]
        )
        location = (
            query["redirect_uri"]
            + "?"
            + urllib.parse.urlencode({"code": code, "state": query["state"]})
        )
        return web.Response(status=302, headers={"Location": location})

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        expected = "Basic " + base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        if request.headers.get("Authorization") != expected:
            return web.json_response({"error": "invalid_client"}, status=401)
        grant = self.grants.pop(str(form.get("code")), None)
        if grant is None or form.get("redirect_uri") != grant.redirect_uri:
            return web.json_response({"error": "invalid_grant"}, status=400)
        verifier = str(form.get("code_verifier", ""))
        digest = hashlib.sha256(verifier.encode()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant.challenge:
            return web.json_response({"error": "invalid_grant"}, status=400)
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": grant.nonce,
            **grant.claims,
        }
        self.tamper(claims)
        key = self.signing_key or self.key
        id_token = jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key)
        return web.json_response({"id_token": id_token, "token_type": "Bearer"})

    async def jwks(self, request: web.Request) -> web.Response:
        self.jwks_fetches += 1
        return web.json_response(KeySet([self.key]).as_dict(private=False))


@pytest.fixture(name="provider")
async def oidc_provider() -> AsyncIterator[OidcProvider]:
    """The ``provider`` fixture (a module that imports this has it): a running OpenID provider."""
    provider = OidcProvider()
    await provider.start()
    try:
        yield provider
    finally:
        await provider.close()
