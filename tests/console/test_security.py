"""The console's sign-in, session cookie and CSRF protection, over real HTTP."""

from __future__ import annotations

import json
import logging
from http.cookies import SimpleCookie
from typing import Any

import aiohttp
import pytest
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


async def _status(gateway: Gateway, session: aiohttp.ClientSession, path: str) -> int:
    async with session.get(gateway.url(path), allow_redirects=False) as response:
        return response.status


async def test_a_change_of_the_admin_token_ends_every_console_session(
    start_gateway: Any, browser_session: aiohttp.ClientSession
) -> None:
    before: Gateway = await start_gateway(admin_token=ADMIN_TOKEN)
    await sign_in(before, browser_session)
    value = browser_session.cookie_jar.filter_cookies(URL(before.url("/console/")))
    cookie = {"Cookie": f"llmgw_console={value['llmgw_console'].value}"}
    # The same database behind a gateway restarted with another admin token.
    after: Gateway = await start_gateway(admin_token="a-new-admin-token-after-a-leak-0123")
    async with aiohttp.ClientSession() as replay:
        async with replay.get(after.url("/console/api/keys"), headers=cookie) as response:
            assert response.status == 401
            assert (await response.json())["error"]["code"] == "console_session_required"
        async with replay.get(
            after.url("/console/"), headers=cookie, allow_redirects=False
        ) as response:
            assert response.status == 303
            assert response.headers["Location"] == "/console/sign-in"
    # Under the token it was signed in with, the session still holds.
    assert await _status(before, browser_session, "/console/api/keys") == 200
    fingerprint = await before.db.fetchval("SELECT admin_token_fingerprint FROM console_sessions")
    assert ADMIN_TOKEN.encode() not in fingerprint and len(fingerprint) == 32


async def test_sign_out_everywhere_from_the_console(console_gateway: Gateway) -> None:
    jar = aiohttp.CookieJar
    async with (
        aiohttp.ClientSession(cookie_jar=jar(unsafe=True)) as laptop,
        aiohttp.ClientSession(cookie_jar=jar(unsafe=True)) as phone,
    ):
        csrf = await sign_in(console_gateway, laptop)
        await sign_in(console_gateway, phone)
        async with laptop.get(console_gateway.url("/console/")) as response:
            assert 'name="scope" value="everywhere"' in await response.text()
        everywhere = console_gateway.url("/console/sign-out")
        async with laptop.post(everywhere, data={"scope": "everywhere"}) as response:
            assert response.status == 403  # a state change: the CSRF token is needed
        async with laptop.post(
            everywhere, data={"scope": "everywhere", "csrf": csrf}, allow_redirects=False
        ) as response:
            assert response.status == 303
            assert response.headers["Location"] == "/console/sign-in"
        for browser in (laptop, phone):
            assert await _status(console_gateway, browser, "/console/api/keys") == 401
    assert await console_gateway.db.fetchval("SELECT count(*) FROM console_sessions") == 0
    audit = await console_gateway.db.fetchrow("SELECT actor, action, after FROM admin_audit")
    assert audit["actor"].startswith("console:")
    assert audit["action"] == "console.sign_out_everywhere"
    assert json.loads(audit["after"]) == {"revoked": 2}


async def test_sign_out_everywhere_through_the_admin_api(console_gateway: Gateway) -> None:
    jar = aiohttp.CookieJar
    bearer = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        aiohttp.ClientSession(cookie_jar=jar(unsafe=True)) as laptop,
        aiohttp.ClientSession(cookie_jar=jar(unsafe=True)) as phone,
    ):
        for browser in (laptop, phone):
            await sign_in(console_gateway, browser)
        url = console_gateway.url("/admin/v1/console/sessions")
        async with aiohttp.ClientSession() as api:
            async with api.delete(url) as response:
                assert response.status == 401
            async with api.delete(url, headers=bearer) as response:
                assert response.status == 200
                assert await response.json() == {"object": "console.sessions", "revoked": 2}
        for browser in (laptop, phone):
            assert await _status(console_gateway, browser, "/console/api/keys") == 401


def _sign_in_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "llmgw.admin.sign_in_guard"]


async def test_failed_sign_ins_are_throttled_per_address_and_logged(
    console_gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.admin.sign_in_guard")
    statuses = []
    async with aiohttp.ClientSession() as session:
        for attempt in range(40):
            async with session.post(
                console_gateway.url("/console/sign-in"),
                data={"token": f"guess-{attempt:04d}-0123456789"},
                allow_redirects=False,
            ) as response:
                statuses.append(response.status)
                page = await response.text()
        assert statuses == [401] * 10 + [429] * 30
        assert 1 <= int(response.headers["Retry-After"]) <= 6
        assert "Too many failed admin sign-ins" in page
        # Throttled before the token is compared: the right one waits too, on both ways in.
        async with session.post(
            console_gateway.url("/console/sign-in"),
            data={"token": ADMIN_TOKEN},
            allow_redirects=False,
        ) as response:
            assert response.status == 429
        async with session.get(
            console_gateway.url("/admin/v1/keys"),
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response:
            assert response.status == 429
            assert (await response.json())["error"]["type"] == "rate_limit_error"
    lines = _sign_in_lines(caplog)
    failed = [r for r in lines if r.getMessage() == "admin sign-in failed"]
    assert len(failed) == 10 and len(lines) <= 12  # 32 refusals: one line, counted
    assert {(r.levelname, r.client_address, r.route) for r in failed} == {  # type: ignore[attr-defined]
        ("WARNING", "127.0.0.1", "/console/sign-in")
    }
    logged = " ".join(str(vars(record)) for record in lines)
    assert "guess-" not in logged and ADMIN_TOKEN not in logged


async def test_behind_a_trusted_proxy_the_cookie_is_secure_and_addresses_forwarded(
    start_gateway: Any,
) -> None:
    gateway: Gateway = await start_gateway(admin_token=ADMIN_TOKEN, trust_forwarded_headers=True)
    sign_in_url = gateway.url("/console/sign-in")
    async with aiohttp.ClientSession() as session:
        for proto in ({"X-Forwarded-Proto": "https"}, {"Forwarded": "for=203.0.113.9;proto=https"}):
            async with session.post(
                sign_in_url, data={"token": ADMIN_TOKEN}, headers=proto, allow_redirects=False
            ) as response:
                assert response.status == 303
                cookie = SimpleCookie()
                cookie.load(response.headers["Set-Cookie"])
                assert cookie["llmgw_console"]["secure"] is True, proto

        async def wrong(client: str) -> int:
            async with session.post(
                sign_in_url,
                data={"token": "wrong-token-0123456789"},
                headers={"X-Forwarded-For": f"10.6.6.6, {client}"},
                allow_redirects=False,
            ) as response:
                return response.status

        assert [await wrong("203.0.113.7") for _ in range(11)] == [401] * 10 + [429]
        assert await wrong("203.0.113.8") == 401  # another client behind the same proxy


async def test_without_trust_forwarded_headers_are_ignored(console_gateway: Gateway) -> None:
    sign_in_url = console_gateway.url("/console/sign-in")
    async with aiohttp.ClientSession() as session:
        async with session.post(
            sign_in_url,
            data={"token": ADMIN_TOKEN},
            headers={"X-Forwarded-Proto": "https"},
            allow_redirects=False,
        ) as response:
            assert response.status == 303
            assert "secure" not in response.headers["Set-Cookie"].lower()
        for index in range(11):  # a new X-Forwarded-For each time does not escape the throttle
            async with session.post(
                sign_in_url,
                data={"token": "wrong-token-0123456789"},
                headers={"X-Forwarded-For": f"203.0.113.{index}"},
                allow_redirects=False,
            ) as response:
                assert response.status == (401 if index < 10 else 429)
