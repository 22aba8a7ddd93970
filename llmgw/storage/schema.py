"""SQLAlchemy Core metadata for every table; Alembic migrations must match it (a test checks)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, JSONB, UUID

__all__ = [
    "admin_audit",
    "api_key_rate_limit_windows",
    "api_key_token_windows",
    "api_keys",
    "console_oidc_logins",
    "console_sessions",
    "deployment_health",
    "limit_cancelled_leases",
    "limit_counters",
    "limit_leases",
    "metadata",
    "refusals_by_minute",
    "responses",
    "subject_monthly_spend",
    "subjects",
    "teams",
    "usage_dead_letters",
    "usage_events",
    "usage_hourly",
]

# Costs in USD (or Diem) as providers report them: Venice's 0.00010471875 needs 11 places.
_COST = sa.Numeric(30, 18)

metadata = sa.MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "ix": "ix_%(table_name)s_%(column_0_name)s",
    }
)

# A team: a level of the limit hierarchy above its keys, and the identity-provider groups whose
# members are its members and admins (docs/teams.md).
teams = sa.Table(
    "teams",
    metadata,
    sa.Column(
        "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
    ),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("monthly_budget_usd", sa.Numeric(18, 8), nullable=True),
    sa.Column("rate_limit_requests", sa.Integer(), nullable=True),
    sa.Column("rate_limit_window_seconds", sa.Integer(), nullable=True),
    sa.Column("tokens_per_minute", sa.Integer(), nullable=True),
    sa.Column("max_concurrent_requests", sa.Integer(), nullable=True),
    sa.Column(
        "allowed_models", ARRAY(sa.Text()), nullable=False, server_default=sa.text("'{}'::text[]")
    ),
    sa.Column("oidc_group", sa.Text(), nullable=True),
    sa.Column("oidc_admin_group", sa.Text(), nullable=True),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
    ),
    # What keys that joined (or left) the team this month had spent elsewhere (or in it): the
    # budget counter admits against the budget less this (llmgw.storage.teams.carry_key_spend).
    sa.Column("carried_spend_usd", _COST, nullable=False, server_default=sa.text("0")),
    sa.Column("carried_month", sa.Date(), nullable=True),  # the month it is for (else 0)
    sa.UniqueConstraint("name"),
    sa.CheckConstraint("name <> ''", name="name_not_empty"),
    sa.CheckConstraint(
        "monthly_budget_usd IS NULL OR monthly_budget_usd >= 0", name="budget_non_negative"
    ),
    sa.CheckConstraint(
        "(rate_limit_requests IS NULL) = (rate_limit_window_seconds IS NULL)", name="window_whole"
    ),
    sa.CheckConstraint(
        "array_position(allowed_models, '') IS NULL AND array_position(allowed_models, NULL) IS NULL",
        name="allowed_models_not_blank",
    ),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column(
        "id", UUID(as_uuid=True), primary_key=True, server_default=sa.text("gen_random_uuid()")
    ),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("subject_id", UUID(as_uuid=True), nullable=True),
    sa.Column("prefix", sa.String(12), nullable=False),
    sa.Column("key_hash", BYTEA(), nullable=False),
    sa.Column("rate_limit_requests", sa.Integer(), nullable=False, server_default=sa.text("60")),
    sa.Column(
        "rate_limit_window_seconds", sa.Integer(), nullable=False, server_default=sa.text("60")
    ),
    sa.Column("is_active", sa.Boolean(), nullable=False, server_default=sa.text("true")),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
    ),
    sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column(
        "allowed_models", ARRAY(sa.Text()), nullable=False, server_default=sa.text("'{}'::text[]")
    ),
    sa.Column("tokens_per_minute", sa.Integer(), nullable=True),
    sa.Column("max_concurrent_requests", sa.Integer(), nullable=True),
    # Set when the key is rotated: the key that replaced it (it may work on through a grace period).
    sa.Column(
        "replaced_by",
        UUID(as_uuid=True),
        sa.ForeignKey("api_keys.id", ondelete="SET NULL"),
        nullable=True,
    ),
    # The key's team: its limits apply on top of the key's own (a team with keys cannot be deleted).
    sa.Column(
        "team_id",
        UUID(as_uuid=True),
        sa.ForeignKey("teams.id", ondelete="RESTRICT"),
        nullable=True,
        index=True,
    ),
    # Who made the key ("user:<email or sub>" from a console session, the admin actor otherwise).
    sa.Column("owner", sa.Text(), nullable=True),
    sa.UniqueConstraint("prefix"),
    sa.UniqueConstraint("key_hash"),
    sa.CheckConstraint("char_length(prefix) = 12", name="prefix_length"),
    sa.CheckConstraint("octet_length(key_hash) = 32", name="key_hash_length"),
    sa.CheckConstraint("rate_limit_requests > 0", name="rate_limit_requests_positive"),
    sa.CheckConstraint("rate_limit_window_seconds > 0", name="rate_limit_window_positive"),
    sa.CheckConstraint("revoked_at IS NULL OR NOT is_active", name="revoked_only_when_inactive"),
    sa.CheckConstraint(
        "tokens_per_minute IS NULL OR tokens_per_minute > 0", name="tokens_per_minute_positive"
    ),
    sa.CheckConstraint(
        "max_concurrent_requests IS NULL OR max_concurrent_requests > 0",
        name="max_concurrent_requests_positive",
    ),
    sa.CheckConstraint(
        "array_position(allowed_models, '') IS NULL AND array_position(allowed_models, NULL) IS NULL",
        name="allowed_models_not_blank",
    ),
)

api_key_rate_limit_windows = sa.Table(
    "api_key_rate_limit_windows",
    metadata,
    sa.Column(
        "api_key_id",
        UUID(as_uuid=True),
        sa.ForeignKey("api_keys.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("window_start_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("window_seconds", sa.Integer(), nullable=False),
    sa.Column("request_count", sa.Integer(), nullable=False, server_default=sa.text("0")),
    sa.PrimaryKeyConstraint("api_key_id", "window_start_at", "window_seconds"),
    sa.CheckConstraint("request_count >= 0", name="request_count_non_negative"),
    sa.CheckConstraint("window_seconds > 0", name="window_seconds_positive"),
)

subjects = sa.Table(
    "subjects",
    metadata,
    sa.Column("subject_id", UUID(as_uuid=True), primary_key=True),
    sa.Column("monthly_budget_usd", sa.Numeric(18, 8), nullable=True),
    sa.Column(
        "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
    ),
    sa.CheckConstraint(
        "monthly_budget_usd IS NULL OR monthly_budget_usd >= 0", name="budget_non_negative"
    ),
)

# Month-to-date spend per subject, kept by the usage ledger so budget checks need no aggregate.
subject_monthly_spend = sa.Table(
    "subject_monthly_spend",
    metadata,
    sa.Column("subject_id", UUID(as_uuid=True), nullable=False),
    sa.Column("month", sa.Date(), nullable=False),
    sa.Column("spend_usd", _COST, nullable=False, server_default=sa.text("0")),
    sa.PrimaryKeyConstraint("subject_id", "month"),
    sa.CheckConstraint("spend_usd >= 0", name="spend_non_negative"),
    sa.CheckConstraint("extract(day FROM month) = 1", name="month_is_first_day"),
)

api_key_token_windows = sa.Table(
    "api_key_token_windows",
    metadata,
    sa.Column(
        "api_key_id",
        UUID(as_uuid=True),
        sa.ForeignKey("api_keys.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("window_start_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("tokens", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    sa.PrimaryKeyConstraint("api_key_id", "window_start_at"),
    sa.CheckConstraint("tokens >= 0", name="tokens_non_negative"),
)

_PRICED_APART = (
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "cache_creation_1h_input_tokens",
    "reasoning_output_tokens",
)
usage_events = sa.Table(
    "usage_events",
    metadata,
    sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
    sa.Column(
        "occurred_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
    ),
    sa.Column("api_key_id", UUID(as_uuid=True), nullable=False),
    sa.Column("subject_id", UUID(as_uuid=True), nullable=True),
    sa.Column("request_id", sa.Text(), nullable=False),
    sa.Column("response_id", sa.Text(), nullable=True),
    sa.Column("operation", sa.Text(), nullable=False),
    sa.Column("provider", sa.Text(), nullable=False),
    sa.Column("model", sa.Text(), nullable=False),
    sa.Column("stream", sa.Boolean(), nullable=False),
    sa.Column("status", sa.Integer(), nullable=True),  # NULL: the provider's was no HTTP status
    sa.Column("error_type", sa.Text(), nullable=True),
    sa.Column("input_tokens", sa.Integer(), nullable=True),
    sa.Column("output_tokens", sa.Integer(), nullable=True),
    sa.Column("cost_usd", _COST, nullable=True),
    sa.Column("duration_ms", sa.Float(), nullable=False),
    sa.Column("time_to_first_chunk_ms", sa.Float(), nullable=True),
    sa.Column("usage_source", sa.Text(), nullable=False, server_default=sa.text("'reported'")),
    # "field:reason" for each value dropped or changed to make the row storable (UsageRecord).
    sa.Column("flags", ARRAY(sa.Text()), nullable=False, server_default=sa.text("'{}'::text[]")),
    sa.Column("cost_computed", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    # UsageRecord.event_id: a record written twice (a spool replayed) is stored once. NULL: older rows.
    sa.Column("event_id", UUID(as_uuid=True), nullable=True),
    # The token kinds priced apart, each part of input_tokens or output_tokens. NULL: not
    # reported (or older rows).
    *(sa.Column(name, sa.Integer(), nullable=True) for name in _PRICED_APART),
    # The provider:model that finished the answer, and how many attempts' tokens the row counts
    # (UsageRecord.attempts). NULL deployment: older rows.
    sa.Column("deployment", sa.Text(), nullable=True),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("1")),
    # The model the answer's last bytes came from; a continued stream's starting deployment; and
    # every upstream attempt with how it ended (UsageRecord.attempt_log). Older rows: NULL, '[]'.
    sa.Column("response_model", sa.Text(), nullable=True),
    sa.Column("started_deployment", sa.Text(), nullable=True),
    sa.Column("attempt_log", JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")),
    # Answered by the response cache (cost_usd 0), and what the answer cost when it was fetched.
    sa.Column("cache_hit", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    sa.Column("saved_cost_usd", _COST, nullable=True),
    # The figures the providers reported beyond the core ones, by the names they gave them
    # (UsageRecord.provider_extras: Venice's "venice.cost.diem"); migration 0022.
    sa.Column("provider_extras", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.UniqueConstraint("event_id"),
    sa.Index("ix_usage_events_occurred_at", "occurred_at"),
    sa.Index("ix_usage_events_api_key_id", "api_key_id", "occurred_at"),
    sa.Index("ix_usage_events_subject_id", "subject_id", "occurred_at"),
    sa.CheckConstraint("status BETWEEN 100 AND 599", name="status_http"),
    sa.CheckConstraint("input_tokens IS NULL OR input_tokens >= 0", name="input_tokens"),
    sa.CheckConstraint("output_tokens IS NULL OR output_tokens >= 0", name="output_tokens"),
    *(sa.CheckConstraint(f"{name} IS NULL OR {name} >= 0", name=name) for name in _PRICED_APART),
    sa.CheckConstraint("cost_usd IS NULL OR cost_usd >= 0", name="cost_usd"),
    sa.CheckConstraint("jsonb_typeof(provider_extras) = 'object'", name="provider_extras"),
    sa.CheckConstraint("duration_ms >= 0", name="duration"),
    sa.CheckConstraint(
        "time_to_first_chunk_ms IS NULL OR time_to_first_chunk_ms >= 0", name="time_to_first_chunk"
    ),
    sa.CheckConstraint(
        "operation IN ('chat', 'embeddings', 'image_generation', 'text_to_speech', "
        "'speech_to_text', 'count_tokens')",
        name="operation",
    ),
    sa.CheckConstraint("usage_source IN ('reported', 'estimated')", name="usage_source"),
    sa.CheckConstraint("attempts >= 1", name="attempts"),
    sa.CheckConstraint(
        "array_position(flags, '') IS NULL AND array_position(flags, NULL) IS NULL",
        name="flags_not_blank",
    ),
)

# Usage rows the database refused even after the ledger isolated them, kept for an operator.
usage_dead_letters = sa.Table(
    "usage_dead_letters",
    metadata,
    sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
    sa.Column(
        "set_aside_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
    ),
    sa.Column("request_id", sa.Text(), nullable=True),
    sa.Column("record", sa.Text(), nullable=False),  # the UsageRecord as JSON (ASCII, escaped)
    sa.Column("error_type", sa.Text(), nullable=False),
    sa.Column("error_message", sa.Text(), nullable=False),
    sa.CheckConstraint("error_type <> ''", name="error_type_not_empty"),
    sa.CheckConstraint("record <> ''", name="record_not_empty"),
)

admin_audit = sa.Table(
    "admin_audit",
    metadata,
    sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
    sa.Column(
        "occurred_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
    ),
    sa.Column("actor", sa.Text(), nullable=False),
    sa.Column("action", sa.Text(), nullable=False),
    sa.Column("target", sa.Text(), nullable=True),
    sa.Column("before", JSONB(), nullable=True),
    sa.Column("after", JSONB(), nullable=True),
    sa.CheckConstraint("actor <> ''", name="actor_not_empty"),
    sa.CheckConstraint("action <> ''", name="action_not_empty"),
)

# Limit counters (llmgw.limits): ``used + reserved <= cap``, named by what and which period they
# count; each reservation is a lease that settlement removes or that expires.
limit_counters = sa.Table(
    "limit_counters",
    metadata,
    sa.Column("counter", sa.Text(), primary_key=True),
    sa.Column("used", sa.Numeric(30, 12), nullable=False, server_default=sa.text("0")),
    sa.Column("reserved", sa.Numeric(30, 12), nullable=False, server_default=sa.text("0")),
    sa.Column("keep_until", sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("used >= 0", name="used_non_negative"),
    sa.CheckConstraint("reserved >= 0", name="reserved_non_negative"),
    sa.CheckConstraint("counter <> ''", name="counter_not_empty"),
)

limit_leases = sa.Table(
    "limit_leases",
    metadata,
    sa.Column("lease_id", UUID(as_uuid=True), nullable=False),
    sa.Column(
        "counter",
        sa.Text(),
        sa.ForeignKey("limit_counters.counter", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("amount", sa.Numeric(30, 12), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint("lease_id", "counter"),
    sa.Index("ix_limit_leases_counter", "counter", "expires_at"),
    sa.CheckConstraint("amount >= 0", name="amount_non_negative"),
)

# Admissions whose caller gave up waiting: refused should they still reach the database, until
# expires_at (llmgw_limits_settle_then_admit; pruned afterwards).
limit_cancelled_leases = sa.Table(
    "limit_cancelled_leases",
    metadata,
    sa.Column("lease_id", UUID(as_uuid=True), primary_key=True),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
)

# Per hour, key and model: what the console and `llmgw usage report` read (llmgw/storage/rollup.py).
usage_hourly = sa.Table(
    "usage_hourly",
    metadata,
    sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
    sa.Column("api_key_id", UUID(as_uuid=True), nullable=False),
    sa.Column("model", sa.Text(), nullable=False),
    sa.Column("subject_id", UUID(as_uuid=True), nullable=True),
    sa.Column("requests", sa.BigInteger(), nullable=False),
    sa.Column("errors", sa.BigInteger(), nullable=False),
    sa.Column("input_tokens", sa.BigInteger(), nullable=False),
    sa.Column("output_tokens", sa.BigInteger(), nullable=False),
    sa.Column("cost_usd", sa.Numeric(38, 18), nullable=False),
    sa.Column("duration_ms_sum", sa.Float(), nullable=False),
    sa.Column("latency_buckets", ARRAY(sa.BigInteger()), nullable=False),
    # Requests the response cache answered, and what their answers cost when fetched.
    sa.Column("cache_hits", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    sa.Column("saved_cost_usd", sa.Numeric(38, 18), nullable=False, server_default=sa.text("0")),
    # The rows' provider_extras summed by name (llmgw_extras_add, migration 0022).
    sa.Column("provider_extras", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.PrimaryKeyConstraint("hour", "api_key_id", "model"),
    sa.Index("ix_usage_hourly_subject_id", "subject_id", "hour"),
    sa.Index("ix_usage_hourly_api_key_id", "api_key_id", "hour"),
    sa.CheckConstraint("requests > 0", name="requests_positive"),
    sa.CheckConstraint("errors >= 0 AND errors <= requests", name="errors_within_requests"),
    sa.CheckConstraint(
        "date_trunc('hour', hour AT TIME ZONE 'UTC') = hour AT TIME ZONE 'UTC'",
        name="hour_is_whole",
    ),
)

# Requests the gateway refused itself (401, 403, 413, 429, its own 400s): no provider was called, so
# the ledger has no row of them; counted per minute for the console (llmgw/storage/refusals.py).
refusals_by_minute = sa.Table(
    "refusals_by_minute",
    metadata,
    sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
    sa.Column("route", sa.Text(), nullable=False),
    sa.Column("status", sa.Integer(), nullable=False),
    sa.Column("code", sa.Text(), nullable=False),
    sa.Column("requests", sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint("minute", "route", "status", "code"),
    sa.CheckConstraint("status BETWEEN 400 AND 499", name="status_refusal"),
    sa.CheckConstraint("requests > 0", name="requests_positive"),
)

# Console sign-ins: only a SHA-256 of the session cookie is kept, never the admin token; the
# fingerprint (an HMAC of the admin token keyed by the session's token, migration 0008) binds the
# session to the admin token it was signed in with.
console_sessions = sa.Table(
    "console_sessions",
    metadata,
    sa.Column("token_hash", BYTEA(), primary_key=True),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
    ),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("admin_token_fingerprint", BYTEA(), nullable=True),  # NULL: made before 0008
    # Who signed in through single sign-on, and their role (llmgw.admin.identity); NULL: the
    # admin token (an admin).
    sa.Column("identity", JSONB(), nullable=True),
    sa.CheckConstraint("octet_length(token_hash) = 32", name="token_hash_length"),
    sa.CheckConstraint("expires_at > created_at", name="expires_after_creation"),
    sa.CheckConstraint(
        "octet_length(admin_token_fingerprint) = 32", name="admin_token_fingerprint_length"
    ),
)

# Single sign-on attempts under way: each state is used once (a replayed one finds no row).
console_oidc_logins = sa.Table(
    "console_oidc_logins",
    metadata,
    sa.Column("state_hash", BYTEA(), primary_key=True),
    sa.Column("nonce", sa.Text(), nullable=False),
    sa.Column("code_verifier", sa.Text(), nullable=False),
    sa.Column("redirect_uri", sa.Text(), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
)

# The Responses API's stored responses (migration 0006): what a previous_response_id continues.
responses = sa.Table(
    "responses",
    metadata,
    sa.Column("id", sa.Text(), primary_key=True),
    sa.Column(
        "api_key_id",
        UUID(as_uuid=True),
        sa.ForeignKey("api_keys.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
    ),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    # Every input item of the conversation up to this response (instructions excluded).
    sa.Column("input_items", JSONB(), nullable=False),
    sa.Column("response", JSONB(), nullable=False),  # the Response object, output included
    sa.Index("ix_responses_expires_at", "expires_at"),
    sa.CheckConstraint("expires_at > created_at", name="expires_after_creation"),
)

# Open circuit breakers (llmgw.routing.postgres): the newest change of each deployment, as its
# NOTIFY carried it, so a replica that starts knows which deployments are down. Times are wall-clock
# seconds; open_until NULL: closed.
deployment_health = sa.Table(
    "deployment_health",
    metadata,
    sa.Column("deployment", sa.Text(), primary_key=True),
    sa.Column("open_until", sa.Float(), nullable=True),
    sa.Column("openings", sa.Integer(), nullable=False),
    sa.Column("last_failure_at", sa.Float(), nullable=False),
    sa.Column("changed_at", sa.Float(), nullable=False),
)
