"""Every typed key the application and its requests carry."""

from __future__ import annotations

import asyncpg
from aiohttp import web

from llmgw.auth.authenticator import AuthenticatedKey, Authenticator
from llmgw.body_memory import BodyAllowance
from llmgw.cache.policy import ResponseCache
from llmgw.config import Settings
from llmgw.limits.policy import LimitPolicy, Ticket
from llmgw.routing.registry import ProviderRegistry
from llmgw.storage.ledger import UsageLedger
from llmgw.storage.refusals import RefusalCounts
from llmgw.telemetry.refusals import RefusalLog
from llmgw.telemetry.runtime import Telemetry
from llmgw.usage_sink import UsageAccounting

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
AUTHENTICATOR = web.AppKey("authenticator", Authenticator)
LIMITS = web.AppKey("limits", LimitPolicy)
PROVIDERS = web.AppKey("providers", ProviderRegistry)
TELEMETRY = web.AppKey("telemetry", Telemetry)
LEDGER = web.AppKey("ledger", UsageLedger)
USAGE = web.AppKey("usage", UsageAccounting)
CACHE = web.AppKey("cache", ResponseCache)  # absent: LLMGW_CACHE=off
REFUSALS = web.AppKey("refusals", RefusalLog)
REFUSAL_COUNTS = web.AppKey("refusal_counts", RefusalCounts)

REQUEST_ID = web.RequestKey("request_id", str)
API_KEY = web.RequestKey("api_key", AuthenticatedKey)
# The request's admission (the middleware's, once its key is known): settled when it ends.
TICKET = web.RequestKey("ticket", Ticket)
# Headers a handler puts on whatever response its request gets: a stream's, sent before it returns,
# and an error's too.
RESPONSE_HEADERS: web.RequestKey[dict[str, str]] = web.RequestKey("response_headers")
BODY_ALLOWANCE = web.RequestKey("body_allowance", BodyAllowance)
# Parameters the answering deployment was sent without (its provider does not accept them).
OMITTED_PARAMS = web.RequestKey("omitted_params", tuple[str, ...])
