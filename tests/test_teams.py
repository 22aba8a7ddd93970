"""Teams through the admin API: created, listed, changed and deleted; keys join them; a key reaches
only the models both it and its team allow; every change audited."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from llmgw import app_keys
from llmgw.clocks import Clocks
from tests.processes import Clock, eventually
from tests.test_admin_api import ADMIN_TOKEN, Admin
from tests.test_exact_admission import ACTUAL_COST, BODY, WORST_COST

MODEL = "qwen3-5-9b"


@pytest.fixture
async def admin(start_gateway: Any) -> AsyncIterator[Admin]:
    clock = Clock(time.time())
    gateway = await start_gateway(admin_token=ADMIN_TOKEN, clocks=Clocks(wall=clock))
    async with aiohttp.ClientSession() as session:
        yield Admin(gateway, session, clock)


async def _team(admin: Admin, **fields: Any) -> dict[str, Any]:
    status, team = await admin.call(
        "POST", "/teams", {"name": f"t-{uuid.uuid4().hex[:8]}", **fields}
    )
    assert status == 201, team
    return team  # type: ignore[no-any-return]


async def test_team_lifecycle(admin: Admin) -> None:
    status, team = await admin.call(
        "POST",
        "/teams",
        {
            "name": "research",
            "monthly_budget_usd": 250,
            "rate_limit_requests": 100,
            "rate_limit_window_seconds": 60,
            "tokens_per_minute": 50_000,
            "max_concurrent_requests": 8,
            "allowed_models": [MODEL],
            "oidc_group": "research",
            "oidc_admin_group": "research-leads",
        },
    )
    assert status == 201
    assert set(team) == {
        "id", "name", "monthly_budget_usd", "rate_limit_requests", "rate_limit_window_seconds",
        "tokens_per_minute", "max_concurrent_requests", "allowed_models", "oidc_group",
        "oidc_admin_group", "created_at", "spend_month_usd",
    }  # fmt: skip
    assert (team["monthly_budget_usd"], team["spend_month_usd"]) == (250, 0)

    status, fetched = await admin.call("GET", f"/teams/{team['id']}")
    assert (status, fetched) == (200, team)

    status, patched = await admin.call(
        "PATCH", f"/teams/{team['id']}", {"name": "research-2", "monthly_budget_usd": None}
    )
    assert status == 200
    assert (patched["name"], patched["monthly_budget_usd"]) == ("research-2", None)
    assert patched["allowed_models"] == [MODEL]

    status, listed = await admin.call("GET", "/teams")
    assert [t["id"] for t in listed["data"]] == [team["id"]]

    status, deleted = await admin.call("DELETE", f"/teams/{team['id']}")
    assert (status, deleted["deleted"]) == (200, True)
    status, _ = await admin.call("GET", f"/teams/{team['id']}")
    assert status == 404
    rows = await admin.gateway.db.fetch("SELECT action, target FROM admin_audit ORDER BY id")
    assert [(r["action"], r["target"]) for r in rows] == [
        ("team.create", team["id"]), ("team.update", team["id"]), ("team.delete", team["id"]),
    ]  # fmt: skip


async def test_teams_are_paginated_like_keys(admin: Admin) -> None:
    for index in range(5):
        await admin.call("POST", "/teams", {"name": f"t{index}"})
    _, first = await admin.call("GET", "/teams?limit=2")
    _, second = await admin.call("GET", f"/teams?limit=2&offset={first['next_offset']}")
    _, last = await admin.call("GET", "/teams?limit=2&offset=4")
    assert [t["name"] for t in first["data"] + second["data"] + last["data"]] == [
        "t0", "t1", "t2", "t3", "t4",
    ]  # fmt: skip
    assert (first["has_more"], last["has_more"], last["next_offset"]) == (True, False, None)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": ""},
        {"name": "x", "rate_limit_requests": 5},  # a window needs both halves
        {"name": "x", "monthly_budget_usd": -1},
        {"name": "x", "allowed_models": "abc"},
        {"name": "x", "oidc_group": " "},
        {"name": "x", "colour": "blue"},
        {"name": "x", "max_concurrent_requests": 0},
    ],
)
async def test_invalid_team_bodies_are_400(admin: Admin, body: Any) -> None:
    status, answer = await admin.call("POST", "/teams", body)
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"


async def test_duplicate_names_and_unknown_fields_are_refused(admin: Admin) -> None:
    team = await _team(admin, name="dup")
    status, answer = await admin.call("POST", "/teams", {"name": "dup"})
    assert (status, answer["error"]["code"]) == (409, "conflict")
    status, _ = await admin.call("PATCH", f"/teams/{team['id']}", {"id": str(uuid.uuid4())})
    assert status == 400
    status, _ = await admin.call("PATCH", f"/teams/{uuid.uuid4()}", {"name": "x"})
    assert status == 404
    status, _ = await admin.call("GET", "/teams/not-a-uuid")
    assert status == 400


async def test_a_team_with_active_keys_cannot_be_deleted(admin: Admin) -> None:
    team = await _team(admin)
    status, key = await admin.call("POST", "/keys", {"name": "k", "team_id": team["id"]})
    assert status == 201
    assert key["team_id"] == team["id"]
    assert key["owner"].startswith("token:")
    status, answer = await admin.call("DELETE", f"/teams/{team['id']}")
    assert (status, answer["error"]["code"]) == (409, "conflict")
    await admin.call("POST", f"/keys/{key['id']}/revoke")
    status, _ = await admin.call("DELETE", f"/teams/{team['id']}")
    assert status == 200
    _, revoked = await admin.call("GET", f"/keys/{key['id']}")
    assert revoked["team_id"] is None


async def test_keys_join_move_and_list_by_team(admin: Admin) -> None:
    one, two = await _team(admin), await _team(admin)
    _, key = await admin.call("POST", "/keys", {"name": "k", "team_id": one["id"]})
    status, moved = await admin.call("PATCH", f"/keys/{key['id']}", {"team_id": two["id"]})
    assert (status, moved["team_id"]) == (200, two["id"])
    _, listed = await admin.call("GET", f"/keys?team_id={two['id']}")
    assert [k["id"] for k in listed["data"]] == [key["id"]]
    _, listed = await admin.call("GET", f"/keys?team_id={one['id']}")
    assert listed["data"] == []
    status, answer = await admin.call("POST", "/keys", {"name": "k", "team_id": str(uuid.uuid4())})
    assert (status, answer["error"]["param"]) == (422, "team_id")


async def test_a_key_cannot_name_a_model_its_team_does_not_allow(admin: Admin) -> None:
    team = await _team(admin, allowed_models=[MODEL, "other-model"])
    status, answer = await admin.call(
        "POST", "/keys", {"name": "k", "team_id": team["id"], "allowed_models": ["gpt-9"]}
    )
    assert (status, answer["error"]["code"], answer["error"]["param"]) == (
        422, "unprocessable", "allowed_models",
    )  # fmt: skip
    assert "gpt-9" in answer["error"]["message"]
    _, key = await admin.call(
        "POST", "/keys", {"name": "k", "team_id": team["id"], "allowed_models": [MODEL]}
    )
    status, _ = await admin.call("PATCH", f"/keys/{key['id']}", {"allowed_models": ["gpt-9"]})
    assert status == 422
    # A key allowed everything, patched into a team that allows less, names nothing outside it.
    _, free = await admin.call("POST", "/keys", {"name": "free", "allowed_models": ["gpt-9"]})
    status, _ = await admin.call("PATCH", f"/keys/{free['id']}", {"team_id": team["id"]})
    assert status == 422


async def test_requests_reach_only_the_intersection_of_key_and_team_models(admin: Admin) -> None:
    team = await _team(admin, allowed_models=["other-model"])
    status, key = await admin.call("POST", "/keys", {"name": "k", "team_id": team["id"]})
    assert status == 201
    assert await admin.chat(key["key"]) == 403  # the key allows every model, its team does not
    await admin.call("PATCH", f"/teams/{team['id']}", {"allowed_models": [MODEL]})
    # The team's change reaches the cached key on every replica (the key channel announces it).
    await eventually(lambda: _chat_is(admin, key["key"], 200), within=1.0)
    await admin.call("PATCH", f"/teams/{team['id']}", {"allowed_models": []})
    assert await admin.chat(key["key"]) == 200


async def _chat_is(admin: Admin, key: str, status: int) -> bool:
    return await admin.chat(key) == status


async def test_the_audit_log_names_the_key_team(admin: Admin) -> None:
    team = await _team(admin)
    await admin.call("POST", "/keys", {"name": "k", "team_id": team["id"]})
    after = await admin.gateway.db.fetchval(
        "SELECT after FROM admin_audit WHERE action = 'key.create'"
    )
    assert json.loads(after)["team_id"] == team["id"]


async def test_usage_by_team_in_the_api_report_and_csv(admin: Admin) -> None:
    team = await _team(admin, name="ml")
    _, in_team = await admin.call("POST", "/keys", {"name": "a", "team_id": team["id"]})
    _, alone = await admin.call("POST", "/keys", {"name": "b"})
    for key in (in_team["key"], in_team["key"], alone["key"]):
        assert await admin.chat(key) == 200
    assert await admin.gateway.server.app[app_keys.LEDGER].flush()

    _, usage = await admin.call("GET", "/usage?group_by=team")
    assert (usage["group_by"], [(r["team"], r["requests"]) for r in usage["data"]]) == (
        "team", [(team["id"], 2), (None, 1)],
    )  # fmt: skip
    _, only = await admin.call("GET", f"/usage?group_by=key&team_id={team['id']}")
    assert [r["key"] for r in only["data"]] == [in_team["id"]]

    _, report = await admin.call("GET", "/usage/report?by=team")
    assert [(r["team"], r["name"], r["requests"]) for r in report["data"]] == [
        (None, None, 1), (team["id"], "ml", 2),
    ]  # fmt: skip
    _, filtered = await admin.call("GET", f"/usage/report?by=model&team_id={team['id']}")
    assert [r["requests"] for r in filtered["data"]] == [2]
    async with admin.session.get(
        admin.gateway.url("/admin/v1/usage/report?by=team&format=csv"),
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        lines = (await response.text()).splitlines()
    assert lines[0].split(",")[0] == "team"
    assert lines[1].startswith(",1,")
    assert lines[2].startswith(team["id"] + ",2,")
    _, spent = await admin.call("GET", f"/teams/{team['id']}")
    assert spent["spend_month_usd"] > 0


async def _chat_code(admin: Admin, key: str) -> str | None:
    """The refusal's code of a chat with ``BODY`` (None: admitted)."""
    async with admin.session.post(
        admin.gateway.url("/v1/chat/completions"),
        json=BODY,
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        answer = await response.json()
        return None if response.status == 200 else answer["error"]["code"]  # type: ignore[no-any-return]


async def _admitted_within_a_second(admin: Admin, key: str) -> None:
    async def admitted() -> bool:
        return await _chat_code(admin, key) is None

    await eventually(admitted, within=1.0, what="admitted")


async def test_a_key_brings_its_spend_this_month_to_a_team_it_joins_and_takes_it_when_it_leaves(
    admin: Admin,
) -> None:
    # The team's spend is the sum over the keys it has now, and its budget is enforced on that.
    _, mover = await admin.call("POST", "/keys", {"name": "mover"})
    assert await _chat_code(admin, mover["key"]) is None
    assert await admin.gateway.server.app[app_keys.LEDGER].flush()
    team = await _team(admin, monthly_budget_usd=WORST_COST)  # one worst case
    _, member = await admin.call("POST", "/keys", {"name": "member", "team_id": team["id"]})

    status, _ = await admin.call("PATCH", f"/keys/{mover['id']}", {"team_id": team["id"]})
    assert status == 200
    _, shown = await admin.call("GET", f"/teams/{team['id']}")
    assert shown["spend_month_usd"] == pytest.approx(ACTUAL_COST)
    # What the mover spent before it joined leaves less than a worst case of the budget.
    assert await _chat_code(admin, member["key"]) == "team_budget_exceeded"

    status, _ = await admin.call("PATCH", f"/keys/{mover['id']}", {"team_id": None})
    assert status == 200
    _, shown = await admin.call("GET", f"/teams/{team['id']}")
    assert shown["spend_month_usd"] == 0

    await _admitted_within_a_second(admin, member["key"])  # the team's change reaches its keys


async def test_spend_made_in_a_team_leaves_with_the_key(admin: Admin) -> None:
    team = await _team(admin, monthly_budget_usd=WORST_COST)
    _, mover = await admin.call("POST", "/keys", {"name": "mover", "team_id": team["id"]})
    _, member = await admin.call("POST", "/keys", {"name": "member", "team_id": team["id"]})
    assert await _chat_code(admin, mover["key"]) is None
    assert await admin.gateway.server.app[app_keys.LEDGER].flush()
    assert await _chat_code(admin, member["key"]) == "team_budget_exceeded"
    await admin.call("PATCH", f"/keys/{mover['id']}", {"team_id": None})

    await _admitted_within_a_second(admin, member["key"])


async def test_a_team_change_reaches_every_replica_within_a_second(
    admin: Admin, start_gateway: Any
) -> None:
    other = await start_gateway(admin_token=ADMIN_TOKEN)  # a second replica on the same database
    team = await _team(admin)
    _, key = await admin.call("POST", "/keys", {"name": "k", "team_id": team["id"]})

    async def chat_on(gateway: Any) -> int:
        async with admin.session.post(
            gateway.url("/v1/chat/completions"),
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key['key']}"},
        ) as response:
            await response.read()
            return response.status

    for gateway in (admin.gateway, other):
        assert await chat_on(gateway) == 200  # the key (and its team) is cached on both
    await admin.call("PATCH", f"/teams/{team['id']}", {"max_concurrent_requests": 1,
                                                      "allowed_models": ["other-model"]})  # fmt: skip

    async def refused_on_both() -> bool:
        return [await chat_on(g) for g in (admin.gateway, other)] == [403, 403]

    assert await eventually(refused_on_both, within=1.0) < 1.0
