"""``create_app``: all wiring in one place, in order (resources, routes, middleware)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
from aiohttp import web

from llmgw import app_keys
from llmgw.accounting.prices import PriceTable, configured_prices, publishers
from llmgw.admin.api import ADMIN_PREFIX, admin_token_auth, build_admin_app
from llmgw.admin.sign_in_guard import SignInGuard, SignInThrottle
from llmgw.api import messages
from llmgw.api.models import MODELS_CACHE, ModelListCache
from llmgw.api.responses import RESPONSE_STORE
from llmgw.auth.authenticator import Authenticator
from llmgw.background import cancel_and_wait
from llmgw.body_memory import BodyLimits, BodyMemory
from llmgw.cache.build import build_cache
from llmgw.clocks import SYSTEM_CLOCKS, Clocks
from llmgw.config import Settings
from llmgw.console.app import build_console_app
from llmgw.console.oidc import OidcClient, OidcSettings
from llmgw.errors import GatewayError
from llmgw.lifecycle.reload import RELOADER, ConfigReloader, RequestGenerations
from llmgw.limits.leases import LeasedLimitStore
from llmgw.limits.policy import LimitPolicy
from llmgw.limits.postgres import PostgresLimitStore
from llmgw.limits.store import LimitStore
from llmgw.middleware import add_response_headers, gateway_middleware
from llmgw.providers.base import UpstreamHTTPError
from llmgw.route_table import CONSOLE_PREFIX, add_routes, admitting
from llmgw.routes import PUBLIC_PATHS, body_limits, gateway_routes
from llmgw.routing.channel import HealthChannel
from llmgw.routing.policy import RoutingPolicy
from llmgw.routing.postgres import PostgresHealthChannel
from llmgw.routing.registry import ProviderRegistry, build_registry
from llmgw.routing.views import observe_health
from llmgw.storage.database import create_pool
from llmgw.storage.ledger import UsageLedger
from llmgw.storage.refusals import RefusalCounts
from llmgw.storage.responses import ResponseStore
from llmgw.storage.spool import Spool, spool_directory
from llmgw.streaming import supervisor
from llmgw.telemetry.connections import observe_connection_pools
from llmgw.telemetry.model_names import remember_listed
from llmgw.telemetry.refusals import RefusalLog
from llmgw.telemetry.runtime import Telemetry
from llmgw.telemetry.setup import build_providers
from llmgw.usage_sink import UsageAccounting

__all__ = ["create_app"]


def _health_channel(settings: Settings, database_url: str, clocks: Clocks) -> HealthChannel:
    """Breaker changes travel through the limits store the replicas already share."""
    if settings.rate_limit_backend == "redis":
        from llmgw.routing.redis import RedisHealthChannel

        assert settings.redis_url is not None  # load_settings requires it for this backend
        return RedisHealthChannel(settings.redis_url, clock=clocks.wall)
    return PostgresHealthChannel(database_url)


def _limit_store(settings: Settings, pool: asyncpg.Pool, database_url: str) -> LimitStore:
    store: LimitStore
    if settings.rate_limit_backend == "redis":
        from llmgw.limits.redis import RedisLimitStore

        assert settings.redis_url is not None  # load_settings requires it for this backend
        store = RedisLimitStore(settings.redis_url)
    else:
        store = PostgresLimitStore(pool, database_url)
    if not settings.limit_slice_requests:
        return store
    return LeasedLimitStore(
        store,
        slice_requests=settings.limit_slice_requests,
        slice_seconds=settings.limit_slice_seconds,
        busy_rate=settings.limit_slice_busy_rate,
    )


async def _list_models_once(
    app: web.Application, registry: ProviderRegistry, timeout: float
) -> None:
    """Never fails start-up: a provider down now may be up by the first request."""
    with contextlib.suppress(GatewayError, UpstreamHTTPError):
        await app[MODELS_CACHE].get(registry, timeout)  # failures are logged per provider


def _oidc_client(settings: Settings) -> OidcClient | None:
    """The console's single sign-on, when OIDC_ISSUER (with its client id and secret) is set."""
    if (
        settings.oidc_issuer is None
        or settings.oidc_client_id is None
        or settings.oidc_client_secret is None
    ):
        return None
    return OidcClient(
        OidcSettings(
            issuer=settings.oidc_issuer,
            client_id=settings.oidc_client_id,
            client_secret=settings.oidc_client_secret,
            redirect_url=settings.oidc_redirect_url,
            groups_claim=settings.oidc_groups_claim,
            admin_groups=settings.oidc_admin_groups,
        )
    )


async def _to_console(request: web.Request) -> web.Response:
    return web.Response(status=308, headers={"Location": CONSOLE_PREFIX + "/"})


def create_app(
    settings: Settings,
    *,
    database_url: str,
    telemetry: Telemetry | None = None,
    clocks: Clocks = SYSTEM_CLOCKS,
    check_provider_credentials: bool = False,
) -> web.Application:
    """The gateway application. Tests pass their own telemetry, and clocks they move.

    ``check_provider_credentials``: at start, list each provider's models in the background, so a
    refused key is logged at once and the listing (the model names metrics may carry) is cached
    (``serve`` does; tests that count upstream calls do not).
    """
    if telemetry is None:
        telemetry = Telemetry.from_providers(
            build_providers(settings), capture_content=settings.capture_genai_content
        )
    default_body_limit, route_body_limits = body_limits(settings)
    # What aiohttp reads itself (the admin API's and the console's forms); the proxied routes
    # read their bodies within gateway_middleware's body limits.
    app = web.Application(client_max_size=settings.request_body_limit_bytes)
    app[app_keys.SETTINGS] = settings
    app[app_keys.TELEMETRY] = telemetry
    app[MODELS_CACHE] = ModelListCache(clock=clocks.monotonic)
    prices = PriceTable(configured_prices(settings), refresh_seconds=settings.price_refresh_seconds)

    async def database(app: web.Application) -> AsyncIterator[None]:
        pool = await create_pool(database_url)
        app[app_keys.POOL] = pool
        authenticator = Authenticator(
            pool, database_url, clock=clocks.monotonic, wall_clock=clocks.wall
        )
        await authenticator.start()
        app[app_keys.AUTHENTICATOR] = authenticator
        limits = LimitPolicy(
            _limit_store(settings, pool, database_url),
            prices,
            default_max_output_tokens=settings.default_max_output_tokens,
            on_window_refusal=lambda: telemetry.instruments.rate_limit_refusals.add(1),
        )
        await limits.start()
        app[app_keys.LIMITS] = limits
        ledger = UsageLedger(
            pool,
            on_drop=telemetry.instruments.usage_ledger_dropped.add,
            on_dead_letter=telemetry.instruments.usage_ledger_dead_letters.add,
            spool=Spool.open(
                spool_directory(
                    settings.data_dir, None if settings.database_url is None else database_url
                )
            ),
        )
        await ledger.start()
        app[app_keys.LEDGER] = ledger
        app[app_keys.USAGE] = UsageAccounting(ledger)
        refusal_counts = app[app_keys.REFUSAL_COUNTS] = RefusalCounts(pool)
        await refusal_counts.start()
        responses = app[RESPONSE_STORE] = ResponseStore(
            pool, retention=timedelta(days=settings.responses_retention_days)
        )
        yield
        await responses.close()
        await refusal_counts.close()
        await ledger.close()  # after the server stopped: every finished request is written
        await limits.close()  # and every reservation settled
        await authenticator.close()
        await pool.close()

    generations = RequestGenerations()

    async def provider_sessions(app: web.Application) -> AsyncIterator[None]:
        # Its routing policy outlives reloads; the registries a reload builds lend it providers.
        limits = app[app_keys.LIMITS]
        registry = await build_registry(
            settings,
            RoutingPolicy(clock=clocks.wall, monotonic=clocks.monotonic, caps=limits.caps),
        )
        app[app_keys.PROVIDERS] = registry
        observe_connection_pools(telemetry.providers.meter_provider, registry.connection_pools)
        remember_listed(registry.aliases)
        await registry.routing.start(_health_channel(settings, database_url, clocks))
        registry.routing.use(limits.store)
        observe_health(telemetry.providers.meter_provider, registry)
        await prices.start(publishers(registry.providers))
        reloader = ConfigReloader(
            registry,
            build_registry,
            app[MODELS_CACHE],
            generations,
            prices,
            app.get(app_keys.CACHE),
        )
        app[RELOADER] = reloader
        check = (
            asyncio.create_task(
                _list_models_once(app, registry, min(10.0, settings.request_timeout_seconds)),
                name="llmgw-provider-check",
            )
            if check_provider_credentials
            else None
        )
        yield
        await cancel_and_wait([check])
        await reloader.close()
        await prices.close()
        await registry.routing.close()
        await registry.close()

    async def telemetry_flush(app: web.Application) -> AsyncIterator[None]:
        yield
        app[app_keys.TELEMETRY].providers.shutdown()

    refusals = app[app_keys.REFUSALS] = RefusalLog()

    async def refusal_summaries(app: web.Application) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(refusals.run(), name="llmgw-refusal-summaries")
        yield
        await cancel_and_wait([sweeper])
        refusals.close()  # the repeats counted so far, before the process ends

    cache = build_cache(
        settings,
        clock=clocks.wall,
        meter=telemetry.providers.local_meter,
        meter_provider=telemetry.providers.meter_provider,
    )
    if cache is not None:
        app[app_keys.CACHE] = cache

    async def open_and_close_cache(app: web.Application) -> AsyncIterator[None]:
        if cache is not None:
            await cache.open()
        yield
        if cache is not None:
            await cache.close()

    app.cleanup_ctx.extend(
        [telemetry_flush, refusal_summaries, database, provider_sessions, open_and_close_cache]
    )
    supervisor.install(  # after the cleanup contexts above: its drains end before they close
        app,
        supervisor.StreamSupervisor(
            max_seconds=settings.stream_max_seconds,
            max_event_bytes=settings.upstream_max_event_bytes,
            shutdown_grace_seconds=settings.shutdown_grace_seconds,
        ),
    )
    routes = gateway_routes()
    add_routes(app, routes)
    if settings.admin_token is not None:
        # One throttle for both ways in: a guesser gains nothing by alternating them.
        guard = SignInGuard(
            SignInThrottle(clock=clocks.monotonic),
            trust_forwarded=settings.trust_forwarded_headers,
        )
        app.add_subapp(ADMIN_PREFIX, build_admin_app(admin_token_auth(settings.admin_token, guard)))
        app.router.add_get(CONSOLE_PREFIX, _to_console)  # before the sub-app claims the prefix
        app.add_subapp(
            CONSOLE_PREFIX,
            build_console_app(
                settings.admin_token,
                guard,
                oidc=_oidc_client(settings),
                token_sign_in=settings.console_token_sign_in,
                session_lifetime=timedelta(hours=settings.console_session_hours),
            ),
        )

    app.middlewares.append(
        gateway_middleware(
            telemetry=telemetry,
            refusals=refusals,
            generations=generations,
            body_limits=BodyLimits(
                default_body_limit,
                route_body_limits,
                BodyMemory(settings.request_body_memory_bytes),
            ),
            public_paths=PUBLIC_PATHS,
            # The admin API and the console check their own token or session; with no admin
            # token set their routes do not exist (404).
            public_prefixes=(ADMIN_PREFIX + "/", CONSOLE_PREFIX),
            admitting=admitting(routes),
            renderers=[(messages.MESSAGES_PATH, messages.error_json)],
        )
    )
    app.on_response_prepare.append(add_response_headers)
    return app
