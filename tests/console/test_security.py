"""The console's sign-in, session cookie and CSRF protection, over real HTTP."""

from __future__ import annotations

from http.cookies import SimpleCookie
from typing import Any

import aiohttp
from yarl import URL

from tests.conftest import Gateway
from tests.console.conftest import ADMIN_TOKEN, sign_in


async def test_without_an_admin_token_there_is_no_console(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway()
    async with aiohttp.ClientSession() as session:
        for path in ("/console", "/console/", "/console/sign-in", "/console/api/keys"):
            async with session.get(gateway.url(path), allow_redirects=False) as response:
                assert response.status == 404, path


async def test_no_cookie_is_sent_to_sign_in(
    console_gateway: Gateway, browser_session: aiohttp.ClientSession
) -> None:
    for path in ("/console", "/console/"):
        async with browser_session.get(console_gateway.url(path)) as response:
            assert response.status == 200
            assert response.url.path == "/console/sign-in"
            page = await response.text()
    assert 'for="token">Admin token</label>' in page
    assert ">Sign in</button>" in page
    async with browser_session.get(console_gateway.url("/console/api/keys")) as response:
        assert response.status == 401
        assert (await response.json())["error"]["code"] == "console_session_required"


async def test_a_wrong_token_is_refused(
    console_gateway: Gateway, browser_session: aiohttp.ClientSession
) -> None:
    for wrong in ("", "nope", ADMIN_TOKEN + "x", ADMIN_TOKEN[:-1]):
        async with browser_session.post(
            console_gateway.url("/console/sign-in"), data={"token": wrong}, allow_redirects=False
        ) as response:
            assert response.status == 401
            assert "That is not the admin token." in await response.text()
            assert "Set-Cookie" not in response.headers
    async with browser_session.get(console_gateway.url("/console/api/keys")) as response:
        assert response.status == 401


async def test_session_cookie_flags_and_no_token_in_the_clear(
    console_gateway: Gateway, browser_session: aiohttp.ClientSession
) -> None:
    async with browser_session.post(
        console_gateway.url("/console/sign-in"), data={"token": ADMIN_TOKEN}, allow_redirects=False
    ) as response:
        assert response.status == 303
        assert response.headers["Location"] == "/console/"
        header = response.headers["Set-Cookie"]
    cookie = SimpleCookie()
    cookie.load(header)
    morsel = cookie["llmgw_console"]
    assert morsel["httponly"] is True
    assert morsel["samesite"] == "Strict"
    assert morsel["path"] == "/console"
    assert 0 < int(morsel["max-age"]) <= 12 * 3600
    assert morsel["expires"]
    assert ADMIN_TOKEN not in morsel.value
    async with browser_session.get(console_gateway.url("/console/")) as response:
        page = await response.text()
        assert response.headers["Cache-Control"] == "no-store"
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert ADMIN_TOKEN not in page
    rows = await console_gateway.db.fetch("SELECT token_hash FROM console_sessions")
    assert len(rows) == 1
    assert morsel.value.encode() not in rows[0]["token_hash"]


async def test_state_changes_need_the_csrf_token_and_this_origin(
    console_gateway: Gateway, browser_session: aiohttp.ClientSession
) -> None:
    csrf = await sign_in(console_gateway, browser_session)
    create = console_gateway.url("/console/api/keys")
    body = {"name": "from-the-console"}
    # A cross-site form or fetch has the cookie but not the token.
    async with browser_session.post(create, json=body) as response:
        assert response.status == 403
        assert (await response.json())["error"]["code"] == "csrf_check_failed"
    async with browser_session.post(create, json=body, headers={"X-CSRF-Token": "0" * 64}) as r:
        assert r.status == 403
    async with browser_session.post(
        create, json=body, headers={"X-CSRF-Token": csrf, "Origin": "https://evil.example"}
    ) as response:
        assert response.status == 403
    assert await console_gateway.db.fetchval("SELECT count(*) FROM api_keys") == 0
    async with browser_session.post(
        create,
        json=body,
        headers={"X-CSRF-Token": csrf, "Origin": str(URL(console_gateway.url("/")).origin())},
    ) as response:
        assert response.status == 201, await response.text()
    # Reads need no token.
    async with browser_session.get(create) as response:
        assert response.status == 200
    # Sign-in from another site is refused too (login CSRF).
    async with browser_session.post(
        console_gateway.url("/console/sign-in"),
        data={"token": ADMIN_TOKEN},
        headers={"Origin": "https://evil.example"},
        allow_redirects=False,
    ) as response:
        assert response.status == 403


async def test_the_plaintext_key_is_only_in_the_create_response(
    console_gateway: Gateway, browser_session: aiohttp.ClientSession
) -> None:
    csrf = await sign_in(console_gateway, browser_session)
    headers = {"X-CSRF-Token": csrf}
    async with browser_session.post(
        console_gateway.url("/console/api/keys"), json={"name": "once"}, headers=headers
    ) as response:
        created = await response.json()
    plaintext = created["key"]
    seen = []
    for path in ("/keys", f"/keys/{created['id']}", "/audit", "/overview", "/subjects"):
        async with browser_session.get(console_gateway.url(f"/console/api{path}")) as response:
            assert response.status == 200, path
            seen.append(await response.text())
    async with browser_session.get(console_gateway.url("/console/")) as response:
        seen.append(await response.text())
    assert all(plaintext not in text for text in seen)
    assert created["prefix"] in seen[0]
    audit = await console_gateway.db.fetch("SELECT actor, after::text FROM admin_audit")
    assert [row["actor"][:8] for row in audit] == ["console:"]
    assert plaintext not in audit[0]["after"]


async def test_sign_out_ends_the_session_everywhere(
    console_gateway: Gateway, browser_session: aiohttp.ClientSession
) -> None:
    csrf = await sign_in(console_gateway, browser_session)
    stolen = browser_session.cookie_jar.filter_cookies(URL(console_gateway.url("/console/")))
    value = stolen["llmgw_console"].value
    # Without the CSRF token a sign-out is refused (it is a state change too).
    async with browser_session.post(
        console_gateway.url("/console/sign-out"), data={}, allow_redirects=False
    ) as response:
        assert response.status == 403
    async with browser_session.post(
        console_gateway.url("/console/sign-out"), data={"csrf": csrf}, allow_redirects=False
    ) as response:
        assert response.status == 303
        assert response.headers["Location"] == "/console/sign-in"
    async with aiohttp.ClientSession() as replay:
        async with replay.get(
            console_gateway.url("/console/api/keys"), headers={"Cookie": f"llmgw_console={value}"}
        ) as response:
            assert response.status == 401
    assert await console_gateway.db.fetchval("SELECT count(*) FROM console_sessions") == 0
