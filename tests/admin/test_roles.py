"""The role table: admin, team admin, member and nobody against every admin action, first as the
one authorisation function decides it (no network), then through the console's API with people
signed in by single sign-on."""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp
import pytest

from llmgw.admin.identity import Action, Identity, Target, authorize
from llmgw.errors import Forbidden, NotFound
from tests.conftest import Gateway
from tests.console.conftest import ADMIN_TOKEN
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
TEAM_ITSELF, OTHER_TEAM = Target(TEAM), Target(OTHER)
OK, NO, HIDDEN = 200, 403, 404
# action, target: admin, team admin, member, nobody
TABLE: list[tuple[Action, Target | None, tuple[int, int, int, int]]] = [
    (Action.KEY_CREATE, MINE, (OK, OK, OK, HIDDEN)),
    (Action.KEY_CREATE, ELSEWHERE, (OK, HIDDEN, HIDDEN, HIDDEN)),
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


@pytest.mark.parametrize("role", ["admin", "team admin", "member"])
async def test_the_role_table_through_the_console(
    role: str, setup: dict[str, Any], provider: OidcProvider
) -> None:
    gateway: Gateway = setup["gateway"]
    provider.person = {"sub": "u-ada", "email": "ada@example.com", "groups": GROUPS[role]}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        assert (await sign_in_through_provider(gateway, browser))[0] == 200
        async with browser.get(gateway.url("/console/")) as response:
            page = await response.text()
        marker = 'name="csrf-token" content="'
        start = page.index(marker) + len(marker)
        csrf = page[start : page.index('"', start)]

        async def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
            async with browser.request(
                method,
                gateway.url(f"/console/api{path}"),
                json=body,
                headers={"X-CSRF-Token": csrf},
            ) as response:
                return response.status, await response.json(content_type=None)

        status, mine = await call("POST", "/keys", {"name": "mine", "team_id": setup["team"]})
        assert status == 201
        assert mine["owner"] == "user:ada@example.com"
        expected = {  # path: admin, team admin, member
            ("POST", "/keys", "other"): (201, 404, 404),
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
            got[(method, path)] = (await call(method, path, bodies[body]))[0]
            wanted[(method, path)] = statuses[column]
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
