"""The admin API, a sub-application mounted at /admin/v1 when LLMGW_ADMIN_TOKEN is set.

Every change is written to ``admin_audit`` in the same transaction as the change itself.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import hmac
import io
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import attrs
import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw import app_keys
from llmgw.admin.schemas import (
    KeyCreate,
    ReportRange,
    Rotate,
    SubjectBudgetUpdate,
    parse,
    to_json,
)
from llmgw.admin.sign_in_guard import SignInGuard
from llmgw.api.body import parse_json
from llmgw.cache.store import CacheUnavailable
from llmgw.errors import AuthenticationFailed, InvalidRequest, NotFound, ServiceUnavailable
from llmgw.route_table import JSON, Doc, Route, add_routes
from llmgw.routing.views import routes_view
from llmgw.storage import api_keys, bounds, console_sessions, rollup, subjects
from llmgw.storage.audit import list_audit, write_audit
from llmgw.storage.database import database_errors
from llmgw.storage.usage import GROUPINGS, UsageQuery, request_usage, summarize_usage

__all__ = [
    "ACTOR",
    "ADMIN_PREFIX",
    "REPORT_COLUMNS",
    "admin_token_auth",
    "build_admin_app",
    "report_csv",
    "report_query",
    "revoke_console_sessions",
]

ADMIN_PREFIX = "/admin/v1"
# Who is acting, as audit rows name them: set by whichever authentication the admin app runs behind.
ACTOR = web.RequestKey("admin_actor", str)
_SANE_ACTOR = re.compile(r"[A-Za-z0-9._@:/\-]{1,128}")
_MAX_PAGE = 200


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
        request[ACTOR] = offered if _SANE_ACTOR.fullmatch(offered) else token_actor
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
        actor=request[ACTOR],
        action=action,
        target=target,
        before=None if before is None else to_json(before),
        after=None if after is None else to_json(after),
    )


def _issued_json(issued: api_keys.IssuedKey) -> dict[str, Any]:
    return {**to_json(issued.record), "key": issued.plaintext}


async def create_key(request: web.Request) -> web.Response:
    wanted = parse(await _json_body(request), KeyCreate)
    async with _transaction(request) as connection:
        issued = await api_keys.create_key(
            connection, api_keys.KeySettings(**attrs.asdict(wanted, recurse=False))
        )
        await _audit(connection, request, "key.create", str(issued.record.id), after=issued.record)
    return _json(_issued_json(issued), status=201)


async def list_keys(request: web.Request) -> web.Response:
    query = request.query
    subject = query.get("subject_id")
    state = query.get("state", "all")
    if state not in api_keys.KEY_STATES:
        raise InvalidRequest(
            f"state must be one of {', '.join(api_keys.KEY_STATES)}.", param="state"
        )
    try:
        limit = int(query.get("limit", "50"))
        offset = int(query.get("offset", "0"))
    except ValueError:
        raise InvalidRequest("limit and offset must be integers.", param="limit") from None
    if not 1 <= limit <= _MAX_PAGE:
        raise InvalidRequest(f"limit must be 1-{_MAX_PAGE}.", param="limit")
    if not 0 <= offset <= bounds.MAX_OFFSET:
        raise InvalidRequest(f"offset must be 0-{bounds.MAX_OFFSET}.", param="offset")
    async with _transaction(request) as connection:
        records = await api_keys.list_keys(
            connection,
            subject_id=None if subject is None else _uuid(subject, "subject_id"),
            state=state,
            limit=limit + 1,
            offset=offset,
        )
    page = records[:limit]
    return _json(
        {
            "object": "list",
            "data": [to_json(record) for record in page],
            "has_more": len(records) > limit,
            "next_offset": offset + len(page) if len(records) > limit else None,
        }
    )


async def get_key(request: web.Request) -> web.Response:
    async with _transaction(request) as connection:
        record = await _find(connection, _key_id(request))
    return _json(to_json(record))


async def _find(connection: asyncpg.Connection, key_id: str) -> api_keys.ApiKeyRecord:
    try:
        return await api_keys.find_key(connection, key_id)
    except api_keys.KeyNotFound:
        raise NotFound(f"No key has id {key_id}.") from None


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
        current = await _find(connection, key_id)
        # Validate the key as it would be after the change, with the same rules as creation.
        merged = {name: to_json(getattr(current, name)) for name in api_keys.MUTABLE_FIELDS}
        merged.update(changes)
        if current.subject_id is not None:
            merged["subject_id"] = str(current.subject_id)
        wanted = parse(merged, KeyCreate)
        before, after = await api_keys.update_key(
            connection, key_id, {name: getattr(wanted, name) for name in changes}
        )
        await _audit(connection, request, "key.update", key_id, before=before, after=after)
    return _json(to_json(after))


async def revoke_key(request: web.Request) -> web.Response:
    key_id = _key_id(request)
    async with _transaction(request) as connection:
        before = await _find(connection, key_id)
        after = await api_keys.revoke_key(connection, key_id)
        await _audit(connection, request, "key.revoke", key_id, before=before, after=after)
    return _json(to_json(after))


async def rotate_key(request: web.Request) -> web.Response:
    wanted = parse(await _json_body(request, optional=True), Rotate)
    key_id = _key_id(request)
    async with _transaction(request) as connection:
        before = await _find(connection, key_id)
        old_after, issued = await api_keys.rotate_key(
            connection, key_id, grace_seconds=wanted.grace_seconds
        )
        await _audit(connection, request, "key.rotate", key_id, before=before, after=old_after)
        await _audit(connection, request, "key.create", str(issued.record.id), after=issued.record)
    return _json({**_issued_json(issued), "replaces": to_json(old_after)}, status=201)


async def put_subject(request: web.Request) -> web.Response:
    subject_id = _uuid(request.match_info["subject_id"], "subject_id")
    wanted = parse(await _json_body(request), SubjectBudgetUpdate)
    async with _transaction(request) as connection:
        before, after = await subjects.set_budget(connection, subject_id, wanted.monthly_budget_usd)
        await _audit(
            connection, request, "subject.budget", str(subject_id), before=before, after=after
        )
    return _json(to_json(after))


async def get_subject(request: web.Request) -> web.Response:
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
    subject, key = query.get("subject_id"), query.get("key_id")
    wanted = UsageQuery(
        subject_id=None if subject is None else _uuid(subject, "subject_id"),
        key_id=None if key is None else _uuid(key, "key_id"),
        start=_time(query.get("from"), "from"),
        end=_time(query.get("to"), "to"),
        group_by=group_by,
    )
    async with _transaction(request) as connection:
        rows = await summarize_usage(connection, wanted)
    return _json({"object": "list", "group_by": group_by, "data": rows})


async def usage_of_request(request: web.Request) -> web.Response:
    request_id = request.match_info["request_id"]
    async with _transaction(request) as connection:
        rows = await request_usage(connection, request_id)
    if not rows:
        raise NotFound(f"No usage is recorded for request {request_id!r}.")
    return _json({"object": "list", "request_id": request_id, "data": rows})


async def clear_cache(request: web.Request) -> web.Response:
    """Delete response-cache entries: all, or those stored by ``key_id`` or for ``model``."""
    query = request.query
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


def _bounded_int(query: Any, name: str, maximum: int) -> int | None:
    text = query.get(name)
    if text is None:
        return None
    if not text.isdigit() or int(text) > maximum:
        raise InvalidRequest(f"{name} must be an integer from 0 to {maximum}.", param=name)
    return int(text)


async def list_subjects(request: web.Request) -> web.Response:
    limit = _page_size(request.query)
    offset = _bounded_int(request.query, "offset", 2**31 - 1) or 0
    async with _transaction(request) as connection:
        found = await subjects.list_subjects(connection, limit=limit + 1, offset=offset)
    page = found[:limit]
    more = len(found) > limit
    return _json(
        {
            "object": "list",
            "data": await _with_reserved(request, page),
            "has_more": more,
            "next_offset": offset + len(page) if more else None,
        }
    )


async def audit_log(request: web.Request) -> web.Response:
    limit = _page_size(request.query)
    before_id = _bounded_int(request.query, "before_id", 2**63 - 1)
    async with _transaction(request) as connection:
        entries = await list_audit(connection, limit=limit + 1, before_id=before_id)
    page = entries[:limit]
    more = len(entries) > limit
    return _json(
        {
            "object": "list",
            "data": [to_json(entry) for entry in page],
            "has_more": more,
            "next_before_id": page[-1].id if more else None,
        }
    )


async def overview(request: web.Request) -> web.Response:
    async with _transaction(request) as connection:
        return _json(await rollup.overview(connection, datetime.now(UTC)))


async def routes(request: web.Request) -> web.Response:
    """Each alias's strategy and each deployment's health, as this replica sees it."""
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
        by=given.by, start=start, end=end, key_id=given.key_id, subject_id=given.subject_id
    )


REPORT_COLUMNS = (
    "requests",
    "errors",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "cost_diem",
    "cache_hits",
    "saved_cost_usd",
)


# A spreadsheet runs a cell that begins with one of these as a formula (OWASP "CSV injection").
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _spreadsheet_cell(value: object) -> object:
    """Text a spreadsheet would run (a model name a caller chose, say) made inert by a leading '."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def report_csv(by: str, rows: list[dict[str, Any]]) -> str:
    """The usage report as CSV, for the admin API and ``llmgw usage report --csv`` alike."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow((by, *REPORT_COLUMNS))
    for row in rows:
        cells = (row[by] or "", *("" if row[c] is None else row[c] for c in REPORT_COLUMNS))
        writer.writerow(_spreadsheet_cell(cell) for cell in cells)
    return out.getvalue()


async def usage_report(request: web.Request) -> web.Response:
    wanted = report_query(request.query)
    async with _transaction(request) as connection:
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
            "Usage by day, model, key or subject, as JSON or CSV (format=csv).",
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
