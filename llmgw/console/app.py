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
import logging
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmgw import app_keys
from llmgw.admin.api import build_admin_app, revoke_console_sessions
from llmgw.admin.identity import IDENTITY, Action, Identity, authorize, identity_from_groups
from llmgw.admin.sign_in_guard import SignInGuard
from llmgw.console.oidc import OidcClient, OidcError
from llmgw.errors import GatewayError, NotFound, RateLimited
from llmgw.forwarded import is_https
from llmgw.route_table import CONSOLE_PREFIX
from llmgw.storage import console_sessions
from llmgw.storage.database import database_errors

log = logging.getLogger(__name__)

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


async def _live_session(request: web.Request) -> tuple[str, Identity] | None:
    """The session's token and who it is: the identity decided at sign-in (an admin-token session
    is an admin)."""
    token = request.cookies.get(COOKIE)
    if not token or len(token) > 128:
        return None
    with database_errors():
        async with request.config_dict[app_keys.POOL].acquire() as connection:
            live = await console_sessions.live_session(
                connection, token, _admin_fingerprint(token, request.config_dict[_ADMIN_TOKEN])
            )
    if live is None:
        return None
    if live.identity is None:
        return token, Identity(actor=_session_actor(token), admin=True)
    return token, Identity.from_json(live.identity)


def _check_state_change(request: web.Request, session: str, presented: str | None) -> None:
    if not _same_origin(request):
        raise CrossSiteRequest("This request came from another site.")
    if presented is None or not hmac.compare_digest(presented, csrf_token(session)):
        raise CrossSiteRequest("The request lacks this session's CSRF token; reload the console.")


def _session_auth() -> Middleware:
    """The admin API's handlers, authenticated by the console's session cookie."""

    @web.middleware
    async def impl(request: web.Request, handler: Handler) -> web.StreamResponse:
        live = await _live_session(request)
        if live is None:
            raise SignInRequired("Sign in to the console first; the session is missing or expired.")
        session, identity = live
        if request.method not in _SAFE_METHODS:
            _check_state_change(request, session, request.headers.get("X-CSRF-Token"))
        request[IDENTITY] = identity
        return await handler(request)

    return impl


def _redirect(location: str) -> web.Response:
    # Returned, not raised: the error middleware turns raised HTTP exceptions into JSON errors.
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def _read_static(name: str) -> str:
    return (_STATIC / name).read_text(encoding="utf-8")


def _sign_in_page(
    request: web.Request,
    *,
    error: str | None = None,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    sso = (
        f'<p><a class="button-link" href="{CONSOLE_PREFIX}/login">Sign in with single sign-on</a></p>'
        if request.app.get(_OIDC) is not None
        else ""
    )
    page = (
        _read_static("sign-in.html")
        .replace(
            "{{error}}",
            "" if error is None else f'<p class="error" role="alert">{html.escape(error)}</p>',
        )
        .replace("{{sso}}", sso)
        .replace("{{token_hidden}}", "" if request.app[_TOKEN_SIGN_IN] else " hidden")
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
    live = await _live_session(request)
    if live is None:
        return _redirect(f"{CONSOLE_PREFIX}/sign-in")
    session, identity = live
    page = (
        _read_static("console.html")
        .replace("{{csrf}}", csrf_token(session))
        .replace("{{role}}", "admin" if identity.admin else "team")
        .replace("{{admin_teams}}", ",".join(sorted(str(team) for team in identity.admin_teams)))
    )
    return web.Response(text=page, content_type="text/html", headers=_PAGE_HEADERS)


async def sign_in_form(request: web.Request) -> web.Response:
    return _sign_in_page(request)


async def sign_in(request: web.Request) -> web.Response:
    if not _same_origin(request):
        raise CrossSiteRequest("This sign-in came from another site.")
    if not request.app[_TOKEN_SIGN_IN]:
        return _sign_in_page(
            request, error="Sign-in with the admin token is off; use single sign-on.", status=403
        )
    guard = request.app[_GUARD]
    try:
        guard.admit(request)
    except RateLimited as refused:
        return _sign_in_page(
            request, error=refused.message, status=refused.status, headers=refused.headers
        )
    form = await request.post()
    presented = form.get("token")
    expected: str = request.app[_ADMIN_TOKEN]
    if not isinstance(presented, str) or not hmac.compare_digest(
        presented.encode(), expected.encode()
    ):
        guard.failed(request)
        return _sign_in_page(request, error="That is not the admin token.", status=401)
    return await _start_session(request, None)


async def _start_session(request: web.Request, identity: Identity | None) -> web.Response:
    """A new session (``identity``: a single sign-on's; None: the admin token's) and its cookie."""
    session = secrets.token_urlsafe(32)
    lifetime: timedelta = request.app[_LIFETIME]
    expires = datetime.now(UTC) + lifetime
    with database_errors():
        async with request.config_dict[app_keys.POOL].acquire() as connection:
            await console_sessions.create_session(
                connection,
                session,
                expires,
                _admin_fingerprint(session, request.app[_ADMIN_TOKEN]),
                None if identity is None else identity.to_json(),
            )
    if identity is None:
        response = _redirect(f"{CONSOLE_PREFIX}/")
    else:
        # The provider's redirect here is a cross-site navigation, which would not carry the
        # SameSite=Strict cookie on to the console: this page moves on from this site instead.
        response = web.Response(
            text=_ONWARD, content_type="text/html", headers={**_PAGE_HEADERS, "Refresh": "0"}
        )
        response.headers["Refresh"] = f"0;url={CONSOLE_PREFIX}/"
    response.set_cookie(
        COOKIE,
        session,
        max_age=int(lifetime.total_seconds()),
        expires=expires.strftime("%a, %d %b %Y %H:%M:%S GMT"),
        path=CONSOLE_PREFIX,
        httponly=True,
        samesite="Strict",
        secure=is_https(request, trust_forwarded=request.app[_GUARD].trust_forwarded),
    )
    return response


def _callback_url(request: web.Request, oidc: OidcClient) -> str:
    if oidc.settings.redirect_url is not None:
        return oidc.settings.redirect_url
    trust = request.app[_GUARD].trust_forwarded
    scheme = "https" if is_https(request, trust_forwarded=trust) else "http"
    return f"{scheme}://{request.host}{CONSOLE_PREFIX}/oidc/callback"


def _refused(request: web.Request, why: str, status: int = 400) -> web.Response:
    """No session: a clear page, and a warning line (never a token or secret in either)."""
    log.warning("console single sign-on refused: %s", why)
    return _sign_in_page(request, error=why, status=status)


async def oidc_login(request: web.Request) -> web.Response:
    """Off to the identity provider, with a fresh state, nonce and PKCE verifier."""
    oidc = request.app.get(_OIDC)
    if oidc is None:
        raise NotFound("Single sign-on is not configured (OIDC_ISSUER).")
    redirect_uri = _callback_url(request, oidc)
    try:
        start = await oidc.start(redirect_uri)
    except OidcError as exc:
        return _refused(request, str(exc), status=502)
    with database_errors():
        async with request.config_dict[app_keys.POOL].acquire() as connection:
            await console_sessions.save_sign_in(
                connection,
                start.state,
                console_sessions.PendingSignIn(start.nonce, start.code_verifier, redirect_uri),
                datetime.now(UTC) + _SIGN_IN_TIME,
            )
    return _redirect(start.url)


async def oidc_callback(request: web.Request) -> web.Response:
    oidc = request.app.get(_OIDC)
    if oidc is None:
        raise NotFound("Single sign-on is not configured (OIDC_ISSUER).")
    query = request.query
    if "error" in query:
        return _refused(
            request, f"The identity provider refused the sign-in ({query['error'][:80]})."
        )
    state, code = query.get("state", ""), query.get("code", "")
    if not state or not code or len(state) > 200:
        return _refused(request, "The sign-in answer lacks its code or state; sign in again.")
    with database_errors():
        async with request.config_dict[app_keys.POOL].acquire() as connection:
            pending = await console_sessions.consume_sign_in(connection, state)
    if pending is None:
        return _refused(
            request,
            "This sign-in was already used, has expired or was never started; sign in again.",
        )
    try:
        id_token = await oidc.exchange(code, pending.code_verifier, pending.redirect_uri)
        claims = await oidc.verify(id_token, pending.nonce)
    except OidcError as exc:
        return _refused(request, str(exc))
    who = claims.get("email") if isinstance(claims.get("email"), str) else claims["sub"]
    with database_errors():
        async with request.config_dict[app_keys.POOL].acquire() as connection:
            teams = await connection.fetch("SELECT id, oidc_group, oidc_admin_group FROM teams")
    identity = identity_from_groups(
        f"user:{who}",
        oidc.groups(claims),
        oidc.settings.admin_groups,
        [(row["id"], row["oidc_group"], row["oidc_admin_group"]) for row in teams],
    )
    if not identity.has_role:
        return _refused(
            request,
            f"No access: {who} is in no group that gives a role in this console. Ask an "
            "administrator to add you to a team's group.",
            status=403,
        )
    log.info("console single sign-on: %s signed in", identity.actor)
    return await _start_session(request, identity)


async def sign_out(request: web.Request) -> web.Response:
    """This session ends; with ``scope=everywhere`` every console session does."""
    live = await _live_session(request)
    if live is not None:
        session, identity = live
        form = await request.post()
        token = form.get("csrf")
        _check_state_change(request, session, token if isinstance(token, str) else None)
        if form.get("scope") == "everywhere":
            authorize(identity, Action.SESSIONS_REVOKE)
            request[IDENTITY] = identity
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
_OIDC = web.AppKey("console_oidc", OidcClient)  # set only when single sign-on is configured
_TOKEN_SIGN_IN = web.AppKey("console_token_sign_in", bool)
_LIFETIME = web.AppKey("console_session_lifetime", timedelta)
_ONWARD = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8">'
    f'<meta http-equiv="refresh" content="0;url={CONSOLE_PREFIX}/"><title>Signed in</title></head>'
    f'<body><p>Signed in. <a href="{CONSOLE_PREFIX}/">Open the console</a>.</p></body></html>'
)
# How long a person has to come back from the identity provider.
_SIGN_IN_TIME = timedelta(minutes=10)


def build_console_app(
    admin_token: str,
    guard: SignInGuard,
    *,
    oidc: OidcClient | None = None,
    token_sign_in: bool = True,
    session_lifetime: timedelta = SESSION_LIFETIME,
) -> web.Application:
    """The console; failed sign-ins are throttled with the admin API's (``guard``); ``oidc``:
    single sign-on, when configured."""
    console = web.Application()
    console[_ADMIN_TOKEN] = admin_token
    console[_GUARD] = guard
    if oidc is not None:
        console[_OIDC] = oidc
    console[_TOKEN_SIGN_IN] = token_sign_in
    console[_LIFETIME] = session_lifetime
    console.router.add_get("/login", oidc_login)
    console.router.add_get("/oidc/callback", oidc_callback)
    console.router.add_get("/", console_page)
    console.router.add_get("/sign-in", sign_in_form)
    console.router.add_post("/sign-in", sign_in)
    console.router.add_post("/sign-out", sign_out)
    console.router.add_get("/static/{name}", asset)
    console.add_subapp("/api", build_admin_app(_session_auth()))
    return console
