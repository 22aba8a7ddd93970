"""The console sub-application at /console: sign-in, the page, its assets, and the admin API for it.

- Signing in exchanges the admin token for a session: a random token in an HttpOnly, SameSite=Strict
  cookie with an expiry; the database keeps only its SHA-256, and the admin token itself is never
  stored in the page or the cookie. Wrong tokens are throttled per client address together with
  the admin API's (``SignInGuard``); the cookie is Secure over HTTPS, or when a trusted proxy
  says the browser used it (TRUST_FORWARDED_HEADERS).
- A session is bound to the admin token it was signed in with: the database also keeps an HMAC of
  that token keyed by the session's own token (so the row alone cannot test guesses of the admin
  token), and a session whose HMAC is not the current token's is refused. Changing
  LLMGW_ADMIN_TOKEN signs every console out; "Sign out everywhere" does so without a change.
- The page calls the admin API's own handlers under /console/api, authenticated by that cookie
  instead of the bearer token. Every state-changing request must carry the session's CSRF token
  (an HMAC of the session token, rendered into the page) and, when the browser sends one, an Origin
  of this host.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw import app_keys
from llmgw.admin.api import ACTOR, build_admin_app, revoke_console_sessions
from llmgw.admin.sign_in_guard import SignInGuard
from llmgw.errors import GatewayError, NotFound, RateLimited
from llmgw.forwarded import is_https
from llmgw.route_table import CONSOLE_PREFIX
from llmgw.storage import console_sessions
from llmgw.storage.database import database_errors

__all__ = ["build_console_app"]

COOKIE = "llmgw_console"
SESSION_LIFETIME = timedelta(hours=8)
_SESSION = web.RequestKey("console_session", str)
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_STATIC = resources.files("llmgw.console") / "static"
_ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}


class SignInRequired(GatewayError):
    status = 401
    error_type = "invalid_request_error"
    code = "console_session_required"


class CrossSiteRequest(GatewayError):
    status = 403
    error_type = "permission_error"
    code = "csrf_check_failed"


def csrf_token(session: str) -> str:
    return hmac.new(session.encode(), b"llmgw-console-csrf", hashlib.sha256).hexdigest()


def _admin_fingerprint(session: str, admin_token: str) -> bytes:
    return hmac.new(
        session.encode(), b"llmgw-console-admin:" + admin_token.encode(), hashlib.sha256
    ).digest()


def _session_actor(session: str) -> str:
    # Audit rows name the console session by a hash, never by the cookie itself.
    return "console:" + hashlib.sha256(session.encode()).hexdigest()[:16]


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:  # not sent by every browser on same-origin form posts; the token still is
        return True
    return origin in (f"http://{request.host}", f"https://{request.host}")


async def _live_session(request: web.Request) -> str | None:
    token = request.cookies.get(COOKIE)
    if not token or len(token) > 128:
        return None
    with database_errors():
        async with request.config_dict[app_keys.POOL].acquire() as connection:
            live = await console_sessions.session_is_live(
                connection, token, _admin_fingerprint(token, request.config_dict[_ADMIN_TOKEN])
            )
    return token if live else None


def _check_state_change(request: web.Request, session: str, presented: str | None) -> None:
    if not _same_origin(request):
        raise CrossSiteRequest("This request came from another site.")
    if presented is None or not hmac.compare_digest(presented, csrf_token(session)):
        raise CrossSiteRequest("The request lacks this session's CSRF token; reload the console.")


def _session_auth() -> Middleware:
    """The admin API's handlers, authenticated by the console's session cookie."""

    @web.middleware
    async def impl(request: web.Request, handler: Handler) -> web.StreamResponse:
        session = await _live_session(request)
        if session is None:
            raise SignInRequired("Sign in to the console first; the session is missing or expired.")
        if request.method not in _SAFE_METHODS:
            _check_state_change(request, session, request.headers.get("X-CSRF-Token"))
        request[ACTOR] = _session_actor(session)
        return await handler(request)

    return impl


def _redirect(location: str) -> web.Response:
    # Returned, not raised: the error middleware turns raised HTTP exceptions into JSON errors.
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def _read_static(name: str) -> str:
    return (_STATIC / name).read_text(encoding="utf-8")


def _sign_in_page(
    *, error: str | None = None, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    page = _read_static("sign-in.html").replace(
        "{{error}}",
        "" if error is None else f'<p class="error" role="alert">{html.escape(error)}</p>',
    )
    return web.Response(
        text=page,
        status=status,
        content_type="text/html",
        headers={**_PAGE_HEADERS, **(headers or {})},
    )


_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}


async def console_page(request: web.Request) -> web.Response:
    session = await _live_session(request)
    if session is None:
        return _redirect(f"{CONSOLE_PREFIX}/sign-in")
    page = _read_static("console.html").replace("{{csrf}}", csrf_token(session))
    return web.Response(text=page, content_type="text/html", headers=_PAGE_HEADERS)


async def sign_in_form(request: web.Request) -> web.Response:
    return _sign_in_page()


async def sign_in(request: web.Request) -> web.Response:
    if not _same_origin(request):
        raise CrossSiteRequest("This sign-in came from another site.")
    guard = request.app[_GUARD]
    try:
        guard.admit(request)
    except RateLimited as refused:
        return _sign_in_page(error=refused.message, status=refused.status, headers=refused.headers)
    form = await request.post()
    presented = form.get("token")
    expected: str = request.app[_ADMIN_TOKEN]
    if not isinstance(presented, str) or not hmac.compare_digest(
        presented.encode(), expected.encode()
    ):
        guard.failed(request)
        return _sign_in_page(error="That is not the admin token.", status=401)
    session = secrets.token_urlsafe(32)
    expires = datetime.now(UTC) + SESSION_LIFETIME
    with database_errors():
        async with request.config_dict[app_keys.POOL].acquire() as connection:
            await console_sessions.create_session(
                connection, session, expires, _admin_fingerprint(session, expected)
            )
    response = _redirect(f"{CONSOLE_PREFIX}/")
    response.set_cookie(
        COOKIE,
        session,
        max_age=int(SESSION_LIFETIME.total_seconds()),
        expires=expires.strftime("%a, %d %b %Y %H:%M:%S GMT"),
        path=CONSOLE_PREFIX,
        httponly=True,
        samesite="Strict",
        secure=is_https(request, trust_forwarded=guard.trust_forwarded),
    )
    return response


async def sign_out(request: web.Request) -> web.Response:
    """This session ends; with ``scope=everywhere`` every console session does."""
    session = await _live_session(request)
    if session is not None:
        form = await request.post()
        token = form.get("csrf")
        _check_state_change(request, session, token if isinstance(token, str) else None)
        if form.get("scope") == "everywhere":
            request[ACTOR] = _session_actor(session)
            await revoke_console_sessions(request)
        else:
            with database_errors():
                async with request.config_dict[app_keys.POOL].acquire() as connection:
                    await console_sessions.delete_session(connection, session)
    response = _redirect(f"{CONSOLE_PREFIX}/sign-in")
    response.del_cookie(COOKIE, path=CONSOLE_PREFIX)
    return response


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    content_type = _ASSETS.get(name)
    if content_type is None:
        raise NotFound(f"No console asset {name!r}.")
    return web.Response(
        text=_read_static(name),
        content_type=content_type,
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )


_ADMIN_TOKEN = web.AppKey("console_admin_token", str)
_GUARD = web.AppKey("console_sign_in_guard", SignInGuard)


def build_console_app(admin_token: str, guard: SignInGuard) -> web.Application:
    """The console; failed sign-ins are throttled with the admin API's (``guard``)."""
    console = web.Application()
    console[_ADMIN_TOKEN] = admin_token
    console[_GUARD] = guard
    console.router.add_get("/", console_page)
    console.router.add_get("/sign-in", sign_in_form)
    console.router.add_post("/sign-in", sign_in)
    console.router.add_post("/sign-out", sign_out)
    console.router.add_get("/static/{name}", asset)
    console.add_subapp("/api", build_admin_app(_session_auth()))
    return console
