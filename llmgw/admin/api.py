"""The admin API, a sub-application mounted at /admin/v1 when LLMGW_ADMIN_TOKEN is set.

Every change is written to ``admin_audit`` in the same transaction as the change itself.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import hmac
import io
import math
import re
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

import asyncpg
import attrs
import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw import app_keys
from llmgw.admin.identity import IDENTITY, Action, Identity, Target, authorize
from llmgw.admin.schemas import (
    KeyCreate,
    ReportRange,
    Rotate,
    SubjectBudgetUpdate,
    TeamCreate,
    parse,
    to_json,
)
from llmgw.admin.sign_in_guard import SignInGuard
from llmgw.api.body import parse_json
from llmgw.cache.store import CacheUnavailable
from llmgw.errors import (
    AuthenticationFailed,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
    Unprocessable,
)
from llmgw.route_table import JSON, Doc, Route, add_routes
from llmgw.routing.views import routes_view
from llmgw.storage import api_keys, bounds, console_sessions, rollup, subjects, teams
from llmgw.storage.audit import list_audit, write_audit
from llmgw.storage.database import database_errors
from llmgw.storage.usage import GROUPINGS, UsageQuery, request_usage, summarize_usage

__all__ = [
    "ADMIN_PREFIX",
    "REPORT_COLUMNS",
    "admin_token_auth",
    "build_admin_app",
    "report_cell",
    "report_csv",
    "report_query",
    "revoke_console_sessions",
]

ADMIN_PREFIX = "/admin/v1"
_SANE_ACTOR = re.compile(r"[A-Za-z0-9._@:/\-]{1,128}")
_MAX_PAGE = 200
_Row = TypeVar("_Row")


def admin_token_auth(token: str, guard: SignInGuard) -> Middleware:
    """The admin API's own authentication: ``Authorization: Bearer <LLMGW_ADMIN_TOKEN>``.

    Failures are throttled per client address with the console's sign-ins (``guard``).
    """
    expected = token.encode()
    # Audit rows name the caller by a hash of the token's prefix, never by the token.
    token_actor = "token:" + hashlib.sha256(token[:8].encode()).hexdigest()[:16]

    @web.middleware
    async def impl(request: web.Request, handler: Handler) -> web.StreamResponse:
        guard.admit(request)
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            presented.strip().encode(), expected
        ):
            guard.failed(request)
            raise AuthenticationFailed()
        offered = request.headers.get("X-Admin-Actor", "")
        actor = offered if _SANE_ACTOR.fullmatch(offered) else token_actor
        request[IDENTITY] = Identity(actor=actor, admin=True)
        return await handler(request)

    return impl


@asynccontextmanager
async def _transaction(request: web.Request) -> AsyncIterator[asyncpg.Connection]:
    pool = request.config_dict[app_keys.POOL]
    with database_errors():
        async with pool.acquire() as connection, connection.transaction():
            yield connection


async def _json_body(request: web.Request, *, optional: bool = False) -> Any:
    raw = await request.read()
    if not raw and optional:
        return {}
    return parse_json(raw)


def _json(value: Any, status: int = 200) -> web.Response:
    body = orjson.dumps(value, default=_exact_number)
    return web.Response(status=status, body=body, content_type="application/json")


def _exact_number(value: Any) -> orjson.Fragment:
    """A Decimal (ledger sums) as the JSON number it is, digit for digit, not a rounded float."""
    if isinstance(value, Decimal) and value.is_finite():
        return orjson.Fragment(format(value.normalize(), "f"))
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _uuid(text: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise InvalidRequest(f"{what} must be a UUID, not {text!r}.", param=what) from None


def _key_id(request: web.Request) -> str:
    return str(_uuid(request.match_info["key_id"], "key id"))


async def _audit(
    connection: asyncpg.Connection,
    request: web.Request,
    action: str,
    target: str,
    before: Any = None,
    after: Any = None,
) -> None:
    await write_audit(
        connection,
        actor=request[IDENTITY].actor,
        action=action,
        target=target,
        before=None if before is None else to_json(before),
        after=None if after is None else to_json(after),
    )


def _issued_json(issued: api_keys.IssuedKey) -> dict[str, Any]:
    return {**to_json(issued.record), "key": issued.plaintext}


async def _check_team(
    connection: asyncpg.Connection, identity: Identity, wanted: KeyCreate, named: Iterable[str]
) -> None:
    """A key's team exists and allows every model the key names (an empty list: the team's); a
    team admin or member sets the key's limits in ``named`` only within the team's."""
    if wanted.team_id is None:
        return
    try:
        team = await teams.find_team(connection, wanted.team_id)
    except teams.TeamNotFound:
        raise Unprocessable(f"No team has id {wanted.team_id}.", param="team_id") from None
    team_models = team.allowed_models
    outside = sorted(set(wanted.allowed_models) - set(team_models)) if team_models else []
    if outside:
        raise Unprocessable(
            f"The key's team does not allow {', '.join(outside)}; it allows "
            f"{', '.join(team_models)}.",
            param="allowed_models",
        )
    if not identity.admin:
        _within_team_limits(team, wanted, frozenset(named))


def _within_team_limits(team: teams.TeamRecord, wanted: KeyCreate, named: frozenset[str]) -> None:
    """Refuse (422, naming the field) a limit in ``named`` that allows the key more than its team
    allows all its keys together (admins are not held to this: docs/teams.md, "Roles")."""
    for name in ("tokens_per_minute", "max_concurrent_requests"):
        mine, theirs = getattr(wanted, name), getattr(team, name)
        if name in named and mine is not None and theirs is not None and mine > theirs:
            raise Unprocessable(
                f"{name} {mine} is above the team's {theirs}; a key's limits are within its "
                "team's.",
                param=name,
            )
    windowed = {"rate_limit_requests", "rate_limit_window_seconds"} & named
    if windowed and team.rate_limit_requests is not None:
        team_window = team.rate_limit_window_seconds or 1
        # The most the key's own window lets through within one of the team's windows.
        most = wanted.rate_limit_requests * math.ceil(
            team_window / wanted.rate_limit_window_seconds
        )
        if most > team.rate_limit_requests:
            raise Unprocessable(
                f"A rate limit of {wanted.rate_limit_requests} requests per "
                f"{wanted.rate_limit_window_seconds}s lets the key make {most} requests in the "
                f"team's window of {team_window}s, above the team's {team.rate_limit_requests}; "
                "a key's limits are within its team's.",
                param=min(windowed),
            )


def _may(request: web.Request, action: Action, target: Target | None = None) -> Identity:
    """The caller, once authorised to do ``action`` (on ``target``)."""
    identity = request[IDENTITY]
    authorize(identity, action, target)
    return identity


async def create_key(request: web.Request) -> web.Response:
    body = await _json_body(request)
    wanted = parse(body, KeyCreate)
    _may(request, Action.KEY_CREATE, Target(wanted.team_id))
    if wanted.subject_id is not None:  # its spend counts against that subject's budget
        _may(request, Action.SUBJECT_UPDATE)
    async with _transaction(request) as connection:
        await _check_team(connection, request[IDENTITY], wanted, body)
        issued = await api_keys.create_key(
            connection,
            api_keys.KeySettings(
                **attrs.asdict(wanted, recurse=False), owner=request[IDENTITY].actor
            ),
        )
        await _audit(connection, request, "key.create", str(issued.record.id), after=issued.record)
    return _json(_issued_json(issued), status=201)


async def list_keys(request: web.Request) -> web.Response:
    identity = _may(request, Action.KEY_LIST)
    query = request.query
    subject, team = query.get("subject_id"), query.get("team_id")
    state = query.get("state", "all")
    if state not in api_keys.KEY_STATES:
        raise InvalidRequest(
            f"state must be one of {', '.join(api_keys.KEY_STATES)}.", param="state"
        )
    page = _OffsetPage.asked(query)
    async with _transaction(request) as connection:
        records = await api_keys.list_keys(
            connection,
            subject_id=None if subject is None else _uuid(subject, "subject_id"),
            team_id=None if team is None else _uuid(team, "team_id"),
            state=state,
            limit=page.fetch,
            offset=page.offset,
            # Only what the caller may see: their teams' keys (a team admin), their own (a member).
            visible=None if identity.admin else (list(identity.admin_teams), identity.actor),
        )
    return page.answer(records, [to_json(record) for record in page.rows(records)])


async def get_key(request: web.Request) -> web.Response:
    async with _transaction(request) as connection:
        record = await _find(request, connection, _key_id(request), Action.KEY_READ)
    return _json(to_json(record))


async def _find(
    request: web.Request, connection: asyncpg.Connection, key_id: str, action: Action
) -> api_keys.ApiKeyRecord:
    """The key, once the caller may do ``action`` on it (404 for a key they may not see)."""
    try:
        record = await api_keys.find_key(connection, key_id)
    except api_keys.KeyNotFound:
        raise NotFound(f"No key has id {key_id}.") from None
    _may(request, action, Target(record.team_id, record.owner))
    return record


async def patch_key(request: web.Request) -> web.Response:
    changes = await _json_body(request)
    if not isinstance(changes, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    not_mutable = sorted(set(changes) - set(api_keys.MUTABLE_FIELDS))
    if not_mutable:
        raise InvalidRequest(
            f"cannot change {', '.join(not_mutable)}; changeable: {', '.join(api_keys.MUTABLE_FIELDS)}.",
            param=not_mutable[0],
        )
    key_id = _key_id(request)
    async with _transaction(request) as connection:
        current = await _find(request, connection, key_id, Action.KEY_UPDATE)
        # Validate the key as it would be after the change, with the same rules as creation.
        merged = {name: to_json(getattr(current, name)) for name in api_keys.MUTABLE_FIELDS}
        merged.update(changes)
        if current.subject_id is not None:
            merged["subject_id"] = str(current.subject_id)
        wanted = parse(merged, KeyCreate)
        named = set(changes)
        if wanted.team_id != current.team_id:  # moved: the caller must be able to put it there
            _may(request, Action.KEY_UPDATE, Target(wanted.team_id, current.owner))
            named |= set(api_keys.MUTABLE_FIELDS)  # and all its limits come under the team's
        await _check_team(connection, request[IDENTITY], wanted, named)
        before, after = await api_keys.update_key(
            connection, key_id, {name: getattr(wanted, name) for name in changes}
        )
        await _audit(connection, request, "key.update", key_id, before=before, after=after)
    return _json(to_json(after))


async def revoke_key(request: web.Request) -> web.Response:
    key_id = _key_id(request)
    async with _transaction(request) as connection:
        before = await _find(request, connection, key_id, Action.KEY_REVOKE)
        after = await api_keys.revoke_key(connection, key_id)
        await _audit(connection, request, "key.revoke", key_id, before=before, after=after)
    return _json(to_json(after))


async def rotate_key(request: web.Request) -> web.Response:
    wanted = parse(await _json_body(request, optional=True), Rotate)
    key_id = _key_id(request)
    async with _transaction(request) as connection:
        before = await _find(request, connection, key_id, Action.KEY_ROTATE)
        old_after, issued = await api_keys.rotate_key(
            connection, key_id, grace_seconds=wanted.grace_seconds
        )
        await _audit(connection, request, "key.rotate", key_id, before=before, after=old_after)
        await _audit(connection, request, "key.create", str(issued.record.id), after=issued.record)
    return _json({**_issued_json(issued), "replaces": to_json(old_after)}, status=201)


def _team_id(request: web.Request) -> uuid.UUID:
    return _uuid(request.match_info["team_id"], "team id")


async def _find_team(connection: asyncpg.Connection, team_id: uuid.UUID) -> teams.TeamRecord:
    try:
        return await teams.find_team(connection, team_id)
    except teams.TeamNotFound:
        raise NotFound(f"No team has id {team_id}.") from None


async def create_team(request: web.Request) -> web.Response:
    _may(request, Action.TEAM_CREATE)
    wanted = parse(await _json_body(request), TeamCreate)
    async with _transaction(request) as connection:
        try:
            team = await teams.create_team(
                connection, teams.TeamSettings(**attrs.asdict(wanted, recurse=False))
            )
        except teams.TeamNameTaken as exc:
            raise Conflict(f"{str(exc).capitalize()}.", param="name") from None
        await _audit(connection, request, "team.create", str(team.id), after=team)
    return _json(to_json(team), status=201)


async def list_teams(request: web.Request) -> web.Response:
    identity = _may(request, Action.TEAM_LIST)
    page = _OffsetPage.asked(request.query)
    async with _transaction(request) as connection:
        found = await teams.list_teams(
            connection,
            limit=page.fetch,
            offset=page.offset,
            ids=None if identity.admin else list(identity.teams),
        )
    return page.answer(found, [to_json(team) for team in page.rows(found)])


async def get_team(request: web.Request) -> web.Response:
    team_id = _team_id(request)
    _may(request, Action.TEAM_READ, Target(team_id))
    async with _transaction(request) as connection:
        return _json(to_json(await _find_team(connection, team_id)))


async def patch_team(request: web.Request) -> web.Response:
    changes = await _json_body(request)
    if not isinstance(changes, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    not_mutable = sorted(set(changes) - set(teams.TEAM_FIELDS))
    if not_mutable:
        raise InvalidRequest(
            f"cannot change {', '.join(not_mutable)}; changeable: {', '.join(teams.TEAM_FIELDS)}.",
            param=not_mutable[0],
        )
    team_id = _team_id(request)
    _may(request, Action.TEAM_UPDATE, Target(team_id))
    async with _transaction(request) as connection:
        current = await _find_team(connection, team_id)
        # The team as it would be after the change, checked with the same rules as a new one.
        merged = {name: to_json(getattr(current, name)) for name in teams.TEAM_FIELDS}
        merged.update(changes)
        wanted = parse(merged, TeamCreate)
        try:
            before, after = await teams.update_team(
                connection, team_id, {name: getattr(wanted, name) for name in changes}
            )
        except teams.TeamNameTaken as exc:
            raise Conflict(f"{str(exc).capitalize()}.", param="name") from None
        await _audit(connection, request, "team.update", str(team_id), before=before, after=after)
    return _json(to_json(after))


async def delete_team(request: web.Request) -> web.Response:
    team_id = _team_id(request)
    _may(request, Action.TEAM_DELETE, Target(team_id))
    async with _transaction(request) as connection:
        await _find_team(connection, team_id)
        try:
            before = await teams.delete_team(connection, team_id)
        except teams.TeamHasKeys as exc:
            raise Conflict(f"{str(exc).capitalize()}.") from None
        await _audit(connection, request, "team.delete", str(team_id), before=before)
    return _json({"id": str(team_id), "object": "team", "deleted": True})


async def put_subject(request: web.Request) -> web.Response:
    _may(request, Action.SUBJECT_UPDATE)
    subject_id = _uuid(request.match_info["subject_id"], "subject_id")
    wanted = parse(await _json_body(request), SubjectBudgetUpdate)
    async with _transaction(request) as connection:
        before, after = await subjects.set_budget(connection, subject_id, wanted.monthly_budget_usd)
        await _audit(
            connection, request, "subject.budget", str(subject_id), before=before, after=after
        )
    return _json(to_json(after))


async def get_subject(request: web.Request) -> web.Response:
    _may(request, Action.SUBJECT_READ)
    subject_id = _uuid(request.match_info["subject_id"], "subject_id")
    async with _transaction(request) as connection:
        subject = await subjects.get_subject(connection, subject_id)
    (shown,) = await _with_reserved(request, [subject])
    return _json(shown)


async def _with_reserved(
    request: web.Request, found: list[subjects.SubjectBudget]
) -> list[dict[str, Any]]:
    """Each subject with what its requests in flight reserve against its budget (None: the limit
    store is unreachable); the spend above is only what the ledger has settled."""
    limits = request.config_dict[app_keys.LIMITS]

    async def reserved(subject: subjects.SubjectBudget) -> float | None:
        if subject.monthly_budget_usd is None:
            return 0.0  # nothing is reserved without a budget
        try:
            return await limits.budget_reserved(subject.subject_id)
        except ServiceUnavailable:
            return None

    amounts = await asyncio.gather(*(reserved(subject) for subject in found))
    return [
        {**to_json(subject), "month_to_date_reserved_usd": amount}
        for subject, amount in zip(found, amounts, strict=True)
    ]


def _time(text: str | None, name: str) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidRequest(f"{name} must be an RFC 3339 time.", param=name) from None
    if moment.tzinfo is None:
        raise InvalidRequest(f"{name} needs a time zone, e.g. {text}Z.", param=name)
    problem = bounds.time_problem(moment)
    if problem is not None:
        raise InvalidRequest(f"{name} {problem}.", param=name)
    return moment


async def usage(request: web.Request) -> web.Response:
    query = request.query
    group_by = query.get("group_by", "model")
    if group_by not in GROUPINGS:
        raise InvalidRequest(f"group_by must be one of {', '.join(GROUPINGS)}.", param="group_by")
    subject, key, team = query.get("subject_id"), query.get("key_id"), query.get("team_id")
    wanted = UsageQuery(
        subject_id=None if subject is None else _uuid(subject, "subject_id"),
        key_id=None if key is None else _uuid(key, "key_id"),
        team_id=None if team is None else _uuid(team, "team_id"),
        start=_time(query.get("from"), "from"),
        end=_time(query.get("to"), "to"),
        group_by=group_by,
    )
    async with _transaction(request) as connection:
        await _may_read_usage(request, connection, wanted.team_id, wanted.key_id)
        rows = await summarize_usage(connection, wanted)
    return _json({"object": "list", "group_by": group_by, "data": rows})


async def usage_of_request(request: web.Request) -> web.Response:
    """One request's rows: an admin's to read, or whoever may read the key that made it (a
    request of a key the caller may not see is as unknown as one never made)."""
    request_id = request.match_info["request_id"]
    unknown = NotFound(f"No usage is recorded for request {request_id!r}.")
    identity = _may(request, Action.USAGE_READ)
    async with _transaction(request) as connection:
        rows = await request_usage(connection, request_id)
        if not identity.admin:
            try:
                for key_id in {row["api_key_id"] for row in rows}:
                    await _find(request, connection, key_id, Action.KEY_READ)
            except (NotFound, Forbidden):
                raise unknown from None
    if not rows:
        raise unknown
    return _json({"object": "list", "request_id": request_id, "data": rows})


async def _may_read_usage(
    request: web.Request,
    connection: asyncpg.Connection,
    team_id: uuid.UUID | None,
    key_id: uuid.UUID | None,
) -> None:
    """An admin reads all usage; a team admin a team of theirs (team_id), a member a key of
    their own (key_id): a narrower question names what it is about."""
    identity = _may(request, Action.USAGE_READ)
    if identity.admin:
        return
    if team_id is not None:
        _may(request, Action.AUDIT_READ, Target(team_id))  # a team's usage: its team admins'
        return
    if key_id is not None:
        await _find(request, connection, str(key_id), Action.KEY_READ)
        return
    raise Forbidden("Name the team_id of a team you administer, or the key_id of a key of yours.")


_CLEAR_PARAMETERS = frozenset({"key_id", "model"})


async def clear_cache(request: web.Request) -> web.Response:
    """Delete response-cache entries: all, or those stored by ``key_id`` or for ``model``."""
    _may(request, Action.CACHE_CLEAR)
    query = request.query
    # A parameter it does not know (a typo of key_id, say) must not widen the clear to everything.
    unknown = sorted(set(query) - _CLEAR_PARAMETERS)
    if unknown:
        raise InvalidRequest(
            f"unknown parameter {unknown[0]!r}: name key_id and/or model, or neither to clear all.",
            param=unknown[0],
        )
    key_id = query.get("key_id")
    if key_id is not None:
        key_id = str(_uuid(key_id, "key_id"))
    model = query.get("model")
    if model is not None and (not model or len(model) > 1000):
        raise InvalidRequest("model must be a model name.", param="model")
    cache = request.config_dict.get(app_keys.CACHE)
    deleted = 0
    if cache is not None:
        try:
            deleted = await cache.clear(key_id=key_id, model=model)
        except CacheUnavailable:
            raise ServiceUnavailable("The response cache's Redis did not answer.") from None
    async with _transaction(request) as connection:
        await _audit(
            connection,
            request,
            "cache.clear",
            key_id or model or "*",
            after={"key_id": key_id, "model": model, "deleted": deleted},
        )
    return _json({"deleted": deleted})


def _page_size(query: Any) -> int:
    try:
        limit = int(query.get("limit", "50"))
    except ValueError:
        raise InvalidRequest("limit must be an integer.", param="limit") from None
    if not 1 <= limit <= _MAX_PAGE:
        raise InvalidRequest(f"limit must be 1-{_MAX_PAGE}.", param="limit")
    return limit


def _list_answer(data: list[Any], more: bool, **next_page: int | None) -> web.Response:
    """One page of a list: its rows, whether another page follows, and the one parameter that
    asks for the next page (None on the last)."""
    return _json({"object": "list", "data": data, "has_more": more, **next_page})


@attrs.frozen
class _OffsetPage:
    """The page of a list the query asks for by ``limit`` and ``offset``, fetched with one row
    more than it shows: that row says whether another page follows."""

    limit: int
    offset: int

    @classmethod
    def asked(cls, query: Any, *, max_offset: int = bounds.MAX_OFFSET) -> _OffsetPage:
        return cls(_page_size(query), _bounded_int(query, "offset", max_offset) or 0)

    @property
    def fetch(self) -> int:
        return self.limit + 1

    def rows(self, found: list[_Row]) -> list[_Row]:
        return found[: self.limit]

    def answer(self, found: list[Any], data: list[Any]) -> web.Response:
        """``data``, the shown rows of ``found`` as JSON, as the list's page."""
        more = len(found) > self.limit
        return _list_answer(data, more, next_offset=self.offset + self.limit if more else None)


def _bounded_int(query: Any, name: str, maximum: int) -> int | None:
    text = query.get(name)
    if text is None:
        return None
    if not text.isdigit() or int(text) > maximum:
        raise InvalidRequest(f"{name} must be an integer from 0 to {maximum}.", param=name)
    return int(text)


async def list_subjects(request: web.Request) -> web.Response:
    _may(request, Action.SUBJECT_READ)
    page = _OffsetPage.asked(request.query, max_offset=2**31 - 1)
    async with _transaction(request) as connection:
        found = await subjects.list_subjects(connection, limit=page.fetch, offset=page.offset)
    return page.answer(found, await _with_reserved(request, page.rows(found)))


async def audit_log(request: web.Request) -> web.Response:
    identity = _may(request, Action.AUDIT_READ)
    limit = _page_size(request.query)
    before_id = _bounded_int(request.query, "before_id", 2**63 - 1)
    async with _transaction(request) as connection:
        entries = await list_audit(
            connection,
            limit=limit + 1,
            before_id=before_id,
            teams=None if identity.admin else list(identity.admin_teams),
        )
    page = entries[:limit]
    more = len(entries) > limit
    data = [to_json(entry) for entry in page]
    return _list_answer(data, more, next_before_id=page[-1].id if more else None)


async def overview(request: web.Request) -> web.Response:
    _may(request, Action.OVERVIEW_READ)
    async with _transaction(request) as connection:
        return _json(await rollup.overview(connection, datetime.now(UTC)))


async def routes(request: web.Request) -> web.Response:
    """Each alias's strategy and each deployment's health, as this replica sees it."""
    _may(request, Action.ROUTES_READ)
    return _json(routes_view(request.config_dict[app_keys.PROVIDERS]))


def report_query(query: Mapping[str, str]) -> rollup.UsageReportQuery:
    """The usage report's parameters (shared by JSON and CSV), checked and bounded."""
    given = parse({name: value for name, value in query.items() if name != "format"}, ReportRange)
    end = given.to or datetime.now(UTC).date() + timedelta(days=1)
    start = given.from_ or end - timedelta(days=30)
    if not start < end:
        raise InvalidRequest("from must be before to.", param="from")
    if (end - start).days > rollup.MAX_REPORT_DAYS:
        raise InvalidRequest(
            f"a report covers at most {rollup.MAX_REPORT_DAYS} days.", param="from"
        )
    return rollup.UsageReportQuery(
        by=given.by,
        start=start,
        end=end,
        key_id=given.key_id,
        subject_id=given.subject_id,
        team_id=given.team_id,
    )


REPORT_COLUMNS = (
    "requests",
    "errors",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "cache_hits",
    "saved_cost_usd",
    "provider_extras",
)


# A spreadsheet runs a cell that begins with one of these as a formula (OWASP "CSV injection").
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _spreadsheet_cell(value: object) -> object:
    """Text a spreadsheet would run (a model name a caller chose, say) made inert by a leading '."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def report_cell(value: object) -> object:
    """A report's value as a CSV or table cell shows it: the provider extras as a JSON object."""
    if value is None:
        return ""
    if isinstance(value, dict):
        return orjson.dumps(value).decode()
    return value


def report_csv(by: str, rows: list[dict[str, Any]]) -> str:
    """The usage report as CSV, for the admin API and ``llmgw usage report --csv`` alike."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow((by, *REPORT_COLUMNS))
    for row in rows:
        cells = (row[by] or "", *(report_cell(row[c]) for c in REPORT_COLUMNS))
        writer.writerow(_spreadsheet_cell(cell) for cell in cells)
    return out.getvalue()


async def usage_report(request: web.Request) -> web.Response:
    wanted = report_query(request.query)
    async with _transaction(request) as connection:
        await _may_read_usage(request, connection, wanted.team_id, wanted.key_id)
        rows = await rollup.usage_report(connection, wanted)
    if request.query.get("format") == "csv":
        name = f"llmgw-usage-by-{wanted.by}-{wanted.start}-{wanted.end}.csv"
        return web.Response(
            text=report_csv(wanted.by, rows),
            content_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    return _json(
        {
            "object": "list",
            "by": wanted.by,
            "from": wanted.start.isoformat(),
            "to": wanted.end.isoformat(),
            "data": rows,
        }
    )


async def revoke_console_sessions(request: web.Request) -> int:
    """Sign out everywhere (this route, and the console's button): every console session ends."""
    async with _transaction(request) as connection:
        revoked = await console_sessions.delete_all_sessions(connection)
        await _audit(
            connection,
            request,
            "console.sign_out_everywhere",
            "console_sessions",
            after={"revoked": revoked},
        )
    return revoked


async def sign_out_everywhere(request: web.Request) -> web.Response:
    _may(request, Action.SESSIONS_REVOKE)
    return _json({"object": "console.sessions", "revoked": await revoke_console_sessions(request)})


# The admin API answers JSON objects (their fields: README, "Admin API").
_OBJECT: Mapping[str, dict[str, Any]] = {JSON: {"type": "object"}}


def _admin(
    method: str,
    path: str,
    handler: Handler,
    operation_id: str,
    summary: str,
    *,
    status: str = "200",
    answer: str = "The answer.",
    request: type | None = None,
    request_required: bool = True,
    request_fields: tuple[str, ...] = (),
    content: Mapping[str, dict[str, Any]] = _OBJECT,
) -> Route:
    return Route(
        method,
        path,
        handler,
        Doc(
            operation_id,
            summary,
            answer,
            content,
            status=status,
            request=request,
            request_required=request_required,
            request_fields=request_fields,
            errors="admin",
        ),
    )


def admin_routes() -> tuple[Route, ...]:
    """The admin API's route table (at /admin/v1, and at /console/api behind a session)."""
    return (
        _admin(
            "POST",
            "/keys",
            create_key,
            "adminCreateKey",
            "Issue a key.",
            status="201",
            answer="The key, with its secret (shown this once).",
            request=KeyCreate,
        ),
        _admin("GET", "/keys", list_keys, "adminListKeys", "The keys (never their secrets)."),
        _admin("GET", "/keys/{key_id}", get_key, "adminGetKey", "One key."),
        _admin(
            "PATCH",
            "/keys/{key_id}",
            patch_key,
            "adminChangeKey",
            "Change a key's name, limits or models.",
            request=KeyCreate,
            request_fields=api_keys.MUTABLE_FIELDS,
        ),
        _admin("POST", "/keys/{key_id}/revoke", revoke_key, "adminRevokeKey", "Revoke a key."),
        _admin(
            "POST",
            "/keys/{key_id}/rotate",
            rotate_key,
            "adminRotateKey",
            "Issue a key's successor; the old one lasts grace_seconds more.",
            status="201",
            answer="The successor, with its secret (shown this once), and the old key.",
            request=Rotate,
            request_required=False,
        ),
        _admin(
            "POST",
            "/teams",
            create_team,
            "adminCreateTeam",
            "Create a team.",
            status="201",
            answer="The team.",
            request=TeamCreate,
        ),
        _admin("GET", "/teams", list_teams, "adminListTeams", "The teams."),
        _admin("GET", "/teams/{team_id}", get_team, "adminGetTeam", "One team."),
        _admin(
            "PATCH",
            "/teams/{team_id}",
            patch_team,
            "adminChangeTeam",
            "Change a team's name, limits, models or groups.",
            request=TeamCreate,
            request_fields=teams.TEAM_FIELDS,
        ),
        _admin(
            "DELETE",
            "/teams/{team_id}",
            delete_team,
            "adminDeleteTeam",
            "Delete a team (409 while it has active keys).",
        ),
        _admin(
            "PUT",
            "/subjects/{subject_id}",
            put_subject,
            "adminSetSubjectBudget",
            "Set a subject's monthly budget.",
            request=SubjectBudgetUpdate,
        ),
        _admin("GET", "/subjects/{subject_id}", get_subject, "adminGetSubject", "One subject."),
        _admin("GET", "/subjects", list_subjects, "adminListSubjects", "The subjects."),
        _admin("GET", "/usage", usage, "adminUsage", "Usage and spend, by key."),
        _admin(
            "GET",
            "/usage/report",
            usage_report,
            "adminUsageReport",
            "Usage by day, model, key, subject or team, as JSON or CSV (format=csv).",
            content={**_OBJECT, "text/csv": {"type": "string"}},
        ),
        _admin(
            "GET",
            "/usage/requests/{request_id}",
            usage_of_request,
            "adminUsageOfRequest",
            "One request's ledger row, with every upstream attempt and how it ended.",
        ),
        _admin(
            "DELETE",
            "/cache",
            clear_cache,
            "adminClearCache",
            "Delete response-cache entries (all, or ?key_id= / ?model=); answers {deleted: N}.",
        ),
        _admin("GET", "/overview", overview, "adminOverview", "The console's overview."),
        _admin("GET", "/routes", routes, "adminRoutes", "Providers and model routing."),
        _admin("GET", "/audit", audit_log, "adminAudit", "The audit log."),
        _admin(
            "DELETE",
            "/console/sessions",
            sign_out_everywhere,
            "adminSignOutEverywhere",
            "End every console session.",
        ),
    )


def build_admin_app(auth: Middleware) -> web.Application:
    """The admin routes behind ``auth`` (the bearer token here, the console's session there)."""
    admin = web.Application(middlewares=[auth])
    add_routes(admin, admin_routes())
    return admin
