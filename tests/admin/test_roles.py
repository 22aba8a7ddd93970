"""The role table: admin, team admin, member and nobody against every admin action, first as the
one authorisation function decides it (no network), then through the console's API with people
signed in by single sign-on."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from llmgw.admin.identity import Action, Identity, Target, authorize
from llmgw.errors import Forbidden, NotFound
from tests.conftest import Gateway
from tests.console.conftest import ADMIN_TOKEN, console_csrf
from tests.console.test_oidc import sign_in_through_provider
from tests.oidc_provider import OidcProvider, oidc_provider  # noqa: F401  (the provider fixture)

TEAM, OTHER = uuid.uuid4(), uuid.uuid4()
ME = "user:ada@example.com"
ROLES = {
    "admin": Identity(ME, admin=True),
    "team admin": Identity(ME, admin_teams=frozenset({TEAM})),
    "member": Identity(ME, member_teams=frozenset({TEAM})),
    "nobody": Identity(ME),
}
MINE, THEIRS, ELSEWHERE = Target(TEAM, ME), Target(TEAM, "user:bob"), Target(OTHER, ME)
TEAM_ITSELF, OTHER_TEAM, NO_TEAM = Target(TEAM), Target(OTHER), Target(None, ME)
OK, NO, HIDDEN = 200, 403, 404
# action, target: admin, team admin, member, nobody
TABLE: list[tuple[Action, Target | None, tuple[int, int, int, int]]] = [
    (Action.KEY_CREATE, MINE, (OK, OK, OK, HIDDEN)),
    (Action.KEY_CREATE, ELSEWHERE, (OK, HIDDEN, HIDDEN, HIDDEN)),
    (Action.KEY_CREATE, NO_TEAM, (OK, NO, NO, NO)),  # a key in no team is an admin's
    (Action.KEY_LIST, None, (OK, OK, OK, NO)),
    (Action.KEY_READ, MINE, (OK, OK, OK, HIDDEN)),
    (Action.KEY_READ, THEIRS, (OK, OK, HIDDEN, HIDDEN)),
    (Action.KEY_READ, ELSEWHERE, (OK, HIDDEN, HIDDEN, HIDDEN)),
    (Action.KEY_UPDATE, MINE, (OK, OK, NO, HIDDEN)),
    (Action.KEY_UPDATE, THEIRS, (OK, OK, HIDDEN, HIDDEN)),
    (Action.KEY_REVOKE, MINE, (OK, OK, OK, HIDDEN)),
    (Action.KEY_REVOKE, THEIRS, (OK, OK, HIDDEN, HIDDEN)),
    (Action.KEY_ROTATE, MINE, (OK, OK, OK, HIDDEN)),
    (Action.KEY_ROTATE, ELSEWHERE, (OK, HIDDEN, HIDDEN, HIDDEN)),
    (Action.TEAM_CREATE, None, (OK, NO, NO, NO)),
    (Action.TEAM_LIST, None, (OK, OK, OK, NO)),
    (Action.TEAM_READ, TEAM_ITSELF, (OK, OK, OK, HIDDEN)),
    (Action.TEAM_READ, OTHER_TEAM, (OK, HIDDEN, HIDDEN, HIDDEN)),
    (Action.TEAM_UPDATE, TEAM_ITSELF, (OK, NO, NO, HIDDEN)),  # not the team's own budget
    (Action.TEAM_UPDATE, OTHER_TEAM, (OK, HIDDEN, HIDDEN, HIDDEN)),
    (Action.TEAM_DELETE, TEAM_ITSELF, (OK, NO, NO, HIDDEN)),
    (Action.USAGE_READ, None, (OK, OK, OK, NO)),
    (Action.AUDIT_READ, None, (OK, OK, NO, NO)),
    (Action.AUDIT_READ, TEAM_ITSELF, (OK, OK, NO, HIDDEN)),
    (Action.SUBJECT_READ, None, (OK, NO, NO, NO)),
    (Action.SUBJECT_UPDATE, None, (OK, NO, NO, NO)),
    (Action.OVERVIEW_READ, None, (OK, NO, NO, NO)),
    (Action.ROUTES_READ, None, (OK, NO, NO, NO)),
    (Action.SESSIONS_REVOKE, None, (OK, NO, NO, NO)),
    (Action.CACHE_CLEAR, None, (OK, NO, NO, NO)),
]


def decided(identity: Identity, action: Action, target: Target | None) -> int:
    try:
        authorize(identity, action, target)
    except Forbidden:
        return NO
    except NotFound:
        return HIDDEN
    return OK


def test_the_table_covers_every_action() -> None:
    assert {action for action, _, _ in TABLE} == set(Action)


@pytest.mark.parametrize(("action", "target", "expected"), TABLE)
def test_the_role_table(action: Action, target: Target | None, expected: tuple[int, ...]) -> None:
    got = tuple(decided(identity, action, target) for identity in ROLES.values())
    assert dict(zip(ROLES, got, strict=True)) == dict(zip(ROLES, expected, strict=True))


# Through the console, signed in by the provider -----------------------------------------------


@pytest.fixture
async def setup(start_gateway: Any, provider: OidcProvider) -> dict[str, Any]:
    gateway: Gateway = await start_gateway(
        admin_token=ADMIN_TOKEN, **provider.gateway_settings("platform")
    )
    async with aiohttp.ClientSession() as session:

        async def admin(method: str, path: str, body: Any = None) -> Any:
            async with session.request(
                method,
                gateway.url(f"/admin/v1{path}"),
                json=body,
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Admin-Actor": "user:bob"},
            ) as response:
                assert response.status < 300, await response.text()
                return await response.json()

        team = await admin(
            "POST", "/teams", {"name": "a", "oidc_group": "a", "oidc_admin_group": "a-leads"}
        )
        other = await admin("POST", "/teams", {"name": "b", "oidc_group": "b"})
        theirs = await admin("POST", "/keys", {"name": "bob's", "team_id": team["id"]})
        elsewhere = await admin("POST", "/keys", {"name": "b's", "team_id": other["id"]})
    return {
        "gateway": gateway,
        "team": team["id"],
        "other": other["id"],
        "theirs": theirs["id"],
        "elsewhere": elsewhere["id"],
    }


GROUPS = {"admin": ["platform"], "team admin": ["a-leads"], "member": ["a"]}
Call = Callable[..., Awaitable[tuple[int, Any]]]


@asynccontextmanager
async def signed_in(gateway: Gateway, provider: OidcProvider, role: str) -> AsyncIterator[Call]:
    """Ada, signed in to the console by the provider with ``role``'s groups: a caller of the
    console's API (``call(method, path, body)`` -> status, answer)."""
    provider.person = {"sub": "u-ada", "email": "ada@example.com", "groups": GROUPS[role]}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        assert (await sign_in_through_provider(gateway, browser))[0] == 200
        csrf = await console_csrf(gateway, browser)

        async def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
            async with browser.request(
                method,
                gateway.url(f"/console/api{path}"),
                json=body,
                headers={"X-CSRF-Token": csrf},
            ) as response:
                return response.status, await response.json(content_type=None)

        yield call


@pytest.mark.parametrize("role", ["admin", "team admin", "member"])
async def test_the_role_table_through_the_console(
    role: str, setup: dict[str, Any], provider: OidcProvider
) -> None:
    gateway: Gateway = setup["gateway"]
    async with signed_in(gateway, provider, role) as call:
        status, mine = await call("POST", "/keys", {"name": "mine", "team_id": setup["team"]})
        assert status == 201
        assert mine["owner"] == "user:ada@example.com"
        expected = {  # path: admin, team admin, member
            ("POST", "/keys", "other"): (201, 404, 404),
            ("POST", "/keys", "no team"): (201, 403, 403),
            ("GET", f"/keys/{setup['theirs']}", None): (200, 200, 404),
            ("GET", f"/keys/{setup['elsewhere']}", None): (200, 404, 404),
            ("PATCH", f"/keys/{mine['id']}", "rename"): (200, 200, 403),
            ("PATCH", f"/keys/{setup['theirs']}", "rename"): (200, 200, 404),
            ("POST", f"/keys/{mine['id']}/rotate", None): (201, 201, 201),
            ("POST", f"/keys/{setup['elsewhere']}/revoke", None): (200, 404, 404),
            ("POST", "/teams", "team"): (201, 403, 403),
            ("GET", f"/teams/{setup['team']}", None): (200, 200, 200),
            ("GET", f"/teams/{setup['other']}", None): (200, 404, 404),
            ("PATCH", f"/teams/{setup['team']}", "budget"): (200, 403, 403),
            ("DELETE", f"/teams/{setup['other']}", None): (200, 404, 404),
            ("GET", f"/usage?team_id={setup['team']}", None): (200, 200, 403),
            ("GET", f"/usage?key_id={mine['id']}", None): (200, 200, 200),
            ("GET", "/usage", None): (200, 403, 403),
            ("GET", f"/usage/report?by=team&team_id={setup['team']}", None): (200, 200, 403),
            ("GET", "/audit", None): (200, 200, 403),
            ("GET", "/subjects", None): (200, 403, 403),
            ("GET", "/overview", None): (200, 403, 403),
            ("GET", "/routes", None): (200, 403, 403),
            ("DELETE", "/cache", None): (200, 403, 403),
            ("DELETE", "/console/sessions", None): (200, 403, 403),
        }
        bodies = {
            None: None,
            "other": {"name": "x", "team_id": setup["other"]},
            "no team": {"name": "x"},
            "rename": {"name": "renamed"},
            "team": {"name": f"new-{role}"},
            "budget": {"monthly_budget_usd": 1000},
        }
        column = ["admin", "team admin", "member"].index(role)
        got, wanted = {}, {}
        for (method, path, body), statuses in expected.items():
            if method == "DELETE" and path.startswith("/teams") and role == "admin":
                # The team still has keys: the admin may, but the state says 409 until revoked.
                _, in_other = await call("GET", f"/keys?team_id={setup['other']}")
                for key in in_other["data"]:
                    await call("POST", f"/keys/{key['id']}/revoke")
            got[(method, path, body)] = (await call(method, path, bodies[body]))[0]
            wanted[(method, path, body)] = statuses[column]
        assert got == wanted
        _, listed = await call("GET", "/keys") if role != "admin" else (0, None)
        if role == "member":
            assert {k["owner"] for k in listed["data"]} == {"user:ada@example.com"}
        if role == "team admin":
            assert {k["team_id"] for k in listed["data"]} == {setup["team"]}
    rows = await gateway.db.fetch(
        "SELECT DISTINCT actor FROM admin_audit WHERE actor LIKE 'user:%'"
    )
    assert "user:ada@example.com" in {row["actor"] for row in rows}


TEAM_LIMITS = {
    "tokens_per_minute": 1000,
    "max_concurrent_requests": 4,
    "rate_limit_requests": 100,
    "rate_limit_window_seconds": 60,
}


@pytest.mark.parametrize("role", ["admin", "team admin", "member"])
async def test_team_admins_and_members_set_key_limits_only_within_the_teams(
    role: str, setup: dict[str, Any], provider: OidcProvider
) -> None:
    gateway: Gateway = setup["gateway"]
    team = setup["team"]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as session:
        async with session.patch(
            gateway.url(f"/admin/v1/teams/{team}"), json=TEAM_LIMITS
        ) as response:
            assert response.status == 200
        # The admin token may give a key in the team more than the team's.
        async with session.post(
            gateway.url("/admin/v1/keys"),
            json={"name": "wide", "team_id": team, "tokens_per_minute": 5000},
        ) as response:
            assert response.status == 201
            wide = await response.json()
    above = {  # each field alone, above the team's (a window the team's 100 per 60s cannot hold)
        "tokens_per_minute": {"tokens_per_minute": 1001},
        "max_concurrent_requests": {"max_concurrent_requests": 5},
        "rate_limit_requests": {"rate_limit_requests": 101},
        "rate_limit_window_seconds": {"rate_limit_window_seconds": 30},  # 60 (default) per 30s
    }
    async with signed_in(gateway, provider, role) as call:
        got = {}
        for field, limits in above.items():
            status, answer = await call("POST", "/keys", {"name": "k", "team_id": team, **limits})
            got[field] = (status, answer["error"]["param"] if status == 422 else None)
        # Admins are not held to the team's limits; team admins and members are.
        assert got == {field: (201, None) if role == "admin" else (422, field) for field in above}
        within = {"name": "k", "team_id": team, **TEAM_LIMITS, "rate_limit_requests": 50,
                  "rate_limit_window_seconds": 30}  # fmt: skip
        status, key = await call("POST", "/keys", within)
        assert status == 201, key
        # Only an admin charges a key to a subject (and its budget).
        status, _ = await call("POST", "/keys", {**within, "subject_id": str(uuid.uuid4())})
        assert status == (201 if role == "admin" else 403)
        if role != "team admin":
            return  # only a team admin (or an admin) changes a key
        status, answer = await call("PATCH", f"/keys/{key['id']}", {"tokens_per_minute": 2000})
        assert (status, answer["error"]["param"]) == (422, "tokens_per_minute")
        # A key the admin gave more than the team's: what the team admin changes is within it.
        status, _ = await call("PATCH", f"/keys/{wide['id']}", {"max_concurrent_requests": 2})
        assert status == 200
        status, answer = await call("PATCH", f"/keys/{wide['id']}", {"tokens_per_minute": 4000})
        assert (status, answer["error"]["param"]) == (422, "tokens_per_minute")
