"""Single sign-on against a small OpenID provider (real RS256 tokens, a real JWKS): the whole
sign-in, and each attack refused with no session, a clear page and a warning line."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from joserfc.jwk import RSAKey

from llmgw.config import ConfigError, load_settings
from tests.conftest import Gateway
from tests.console.conftest import ADMIN_TOKEN, console_csrf
from tests.oidc_provider import OidcProvider, oidc_provider  # noqa: F401  (the provider fixture)

ADMINS = "llm-platform"


StartSso = Callable[..., Awaitable[Gateway]]


@pytest.fixture
def start_sso(start_gateway: Any, provider: OidcProvider) -> StartSso:
    """Starts a gateway signing people in through ``provider`` (``overrides``: more settings)."""

    async def start(**overrides: Any) -> Gateway:
        gateway: Gateway = await start_gateway(
            **{"admin_token": ADMIN_TOKEN, **provider.gateway_settings(ADMINS), **overrides}
        )
        return gateway

    return start


@pytest.fixture
async def sso_gateway(start_sso: StartSso) -> Gateway:
    return await start_sso()


@pytest.fixture
async def browser() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        yield session


async def sign_in_through_provider(
    gateway: Gateway, browser: aiohttp.ClientSession
) -> tuple[int, str, str]:
    """Follow the redirects as a browser does; the callback's status, page and its URL."""
    async with browser.get(gateway.url("/console/login"), allow_redirects=False) as response:
        assert response.status == 303, await response.text()
        to_provider = response.headers["Location"]
    async with browser.get(to_provider, allow_redirects=False) as response:
        assert response.status == 302
        callback = response.headers["Location"]
    async with browser.get(callback, allow_redirects=False) as response:
        return response.status, await response.text(), callback


def session_cookie(browser: aiohttp.ClientSession) -> str | None:
    for cookie in browser.cookie_jar:
        if cookie.key == "llmgw_console" and cookie.value:
            return cookie.value
    return None


async def test_a_complete_sign_in_gives_an_admin_a_session(
    sso_gateway: Gateway, provider: OidcProvider, browser: aiohttp.ClientSession
) -> None:
    provider.person["groups"] = [ADMINS, "other"]
    status, page, _ = await sign_in_through_provider(sso_gateway, browser)
    assert status == 200, page
    assert session_cookie(browser) is not None
    query = provider.authorize_queries[-1]
    assert query["code_challenge_method"] == "S256"
    assert query["redirect_uri"] == sso_gateway.url("/console/oidc/callback")
    assert {"state", "nonce", "code_challenge"} <= set(query)
    async with browser.get(sso_gateway.url("/console/")) as response:
        assert response.status == 200
        assert 'name="console-role" content="admin"' in await response.text()
    async with browser.get(sso_gateway.url("/console/api/keys")) as response:
        assert response.status == 200
    async with browser.get(sso_gateway.url("/console/sign-in")) as response:
        assert "/console/login" in await response.text()  # the sign-in page offers it


@pytest.mark.parametrize(
    ("attack", "why"),
    [
        ("forged signature", "signature does not verify"),
        ("wrong audience", "refused"),
        ("expired token", "refused"),
        ("wrong nonce", "refused"),
        ("wrong issuer", "refused"),
    ],
)
async def test_a_tampered_id_token_gets_no_session(
    sso_gateway: Gateway,
    provider: OidcProvider,
    browser: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    attack: str,
    why: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.console.app")
    provider.person["groups"] = [ADMINS]
    if attack == "forged signature":
        provider.signing_key = RSAKey.generate_key(2048, parameters={"kid": "key-1"})
    else:
        change = {
            "wrong audience": {"aud": "another-client"},
            "expired token": {"exp": 1_000_000_000, "iat": 999_999_000},
            "wrong nonce": {"nonce": "not-the-nonce"},
            "wrong issuer": {"iss": "https://evil.example"},
        }[attack]
        provider.tamper = lambda claims: claims.update(change)
    status, page, _ = await sign_in_through_provider(sso_gateway, browser)
    assert status == 400
    assert why in page
    assert session_cookie(browser) is None
    lines = [r.getMessage() for r in caplog.records if r.name == "llmgw.console.app"]
    assert any(line.startswith("console single sign-on refused") for line in lines)
    async with browser.get(sso_gateway.url("/console/api/keys")) as response:
        assert response.status == 401


async def test_a_replayed_state_is_refused(
    sso_gateway: Gateway, provider: OidcProvider, browser: aiohttp.ClientSession
) -> None:
    provider.person["groups"] = [ADMINS]
    status, _, callback = await sign_in_through_provider(sso_gateway, browser)
    assert status == 200
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as attacker:
        async with attacker.get(callback, allow_redirects=False) as response:
            assert response.status == 400
            assert "already used" in await response.text()
        assert session_cookie(attacker) is None


async def test_an_unknown_kid_fetches_the_jwks_again(
    sso_gateway: Gateway, provider: OidcProvider, browser: aiohttp.ClientSession
) -> None:
    provider.person["groups"] = [ADMINS]
    assert (await sign_in_through_provider(sso_gateway, browser))[0] == 200
    fetched = provider.jwks_fetches
    provider.rotate_key()
    browser.cookie_jar.clear()
    assert (await sign_in_through_provider(sso_gateway, browser))[0] == 200
    assert provider.jwks_fetches == fetched + 1


async def test_a_person_with_no_role_gets_a_no_access_page_and_no_session(
    sso_gateway: Gateway, provider: OidcProvider, browser: aiohttp.ClientSession
) -> None:
    provider.person["groups"] = ["unrelated"]
    status, page, _ = await sign_in_through_provider(sso_gateway, browser)
    assert status == 403
    assert "No access" in page
    assert session_cookie(browser) is None


async def test_roles_are_read_at_every_sign_in(
    sso_gateway: Gateway, provider: OidcProvider, browser: aiohttp.ClientSession
) -> None:
    provider.person["groups"] = [ADMINS]
    assert (await sign_in_through_provider(sso_gateway, browser))[0] == 200
    # Removed from the group at the provider: their next sign-in has no role, and no session.
    provider.person["groups"] = []
    browser.cookie_jar.clear()
    status, page, _ = await sign_in_through_provider(sso_gateway, browser)
    assert (status, "No access" in page, session_cookie(browser)) == (403, True, None)


async def test_a_session_lasts_at_most_console_session_hours(
    start_sso: StartSso, provider: OidcProvider, browser: aiohttp.ClientSession
) -> None:
    gateway = await start_sso(console_session_hours=2.0)
    provider.person["groups"] = [ADMINS]
    assert (await sign_in_through_provider(gateway, browser))[0] == 200
    left = await gateway.db.fetchval(
        "SELECT extract(epoch FROM expires_at - now())::float8 FROM console_sessions"
    )
    assert 2 * 3600 - 60 < left <= 2 * 3600
    # Once that is over, the session no longer signs anyone in.
    await gateway.db.execute("UPDATE console_sessions SET expires_at = now()")
    async with browser.get(gateway.url("/console/api/keys")) as response:
        assert response.status == 401


async def test_groups_come_from_the_configured_claim_and_the_person_is_their_sub_without_email(
    start_sso: StartSso, provider: OidcProvider, browser: aiohttp.ClientSession
) -> None:
    gateway = await start_sso(oidc_groups_claim="roles")
    provider.person = {"sub": "u-2", "groups": [ADMINS]}  # not the claim this gateway reads
    assert (await sign_in_through_provider(gateway, browser))[0] == 403
    provider.person = {"sub": "u-2", "roles": [ADMINS]}
    assert (await sign_in_through_provider(gateway, browser))[0] == 200
    async with browser.post(
        gateway.url("/console/api/keys"),
        json={"name": "k"},
        headers={"X-CSRF-Token": await console_csrf(gateway, browser)},
    ) as response:
        assert response.status == 201
        assert (await response.json())["owner"] == "user:u-2"


async def test_token_sign_in_can_be_turned_off(
    start_sso: StartSso, provider: OidcProvider, browser: aiohttp.ClientSession
) -> None:
    gateway = await start_sso(console_token_sign_in=False)
    async with browser.post(
        gateway.url("/console/sign-in"), data={"token": ADMIN_TOKEN}, allow_redirects=False
    ) as response:
        assert response.status == 403
    assert session_cookie(browser) is None
    # The admin API's bearer token keeps working for automation.
    async with browser.get(
        gateway.url("/admin/v1/keys"), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    ) as response:
        assert response.status == 200


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OIDC_ISSUER": "http://sso.example.com", "OIDC_CLIENT_ID": "c", "OIDC_CLIENT_SECRET": "s"}, "OIDC_ISSUER"),
        ({"OIDC_ISSUER": "https://sso.example.com"}, "OIDC_ISSUER"),
        ({"CONSOLE_SESSION_HOURS": "0"}, "CONSOLE_SESSION_HOURS"),
    ],
)  # fmt: skip
def test_sign_in_settings_are_checked(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    assert named in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_sign_in_settings_are_read() -> None:
    settings = load_settings(
        {
            "OIDC_ISSUER": "http://127.0.0.1:8080/realms/acme/",
            "OIDC_CLIENT_ID": "llmgw",
            "OIDC_CLIENT_SECRET": "s3cret",
            "OIDC_ADMIN_GROUPS": "platform, sre ,",
            "CONSOLE_TOKEN_SIGN_IN": "false",
            "CONSOLE_SESSION_HOURS": "2",
        }
    )
    assert settings.oidc_issuer == "http://127.0.0.1:8080/realms/acme"
    assert settings.oidc_admin_groups == ("platform", "sre")
    assert (settings.console_token_sign_in, settings.console_session_hours) == (False, 2.0)
    assert settings.oidc_groups_claim == "groups"
    assert "s3cret" not in repr(settings)


async def test_the_redirect_url_given_to_the_provider_can_be_set(
    start_sso: StartSso, provider: OidcProvider, browser: aiohttp.ClientSession
) -> None:
    behind_proxy = "https://llmgw.example.com/console/oidc/callback"
    gateway = await start_sso(oidc_redirect_url=behind_proxy)
    async with browser.get(gateway.url("/console/login"), allow_redirects=False) as response:
        to_provider = response.headers["Location"]
    async with browser.get(to_provider, allow_redirects=False) as response:
        assert response.headers["Location"].startswith(behind_proxy + "?code=")
    assert provider.authorize_queries[-1]["redirect_uri"] == behind_proxy
