"""What to do after a failed upstream attempt: retry the same deployment, move on, or stop.

:func:`decide` is the one place that maps what happened (a :class:`Failure`) to a
:class:`Decision`; it is pure: the wall clock (``now``, for an HTTP-date ``Retry-After``) and the
backoff's randomness (``RetryPolicy.jitter``) come in as arguments.

    silence (no connection, no first byte in time) .... move on at once: a silent provider stays
                                                        silent, so it is not asked again
    408, 500, 502, 503, 504, 529, a broken connection . retry with exponential backoff and jitter
                                                        (or the provider's Retry-After), then move on
    429 with a wait ................................... wait when the budget allows it, else move on
    429 beyond the caller's share (input tokens) ...... the same, but the deployment is not failing
    429 that waiting cannot fix (quota, too large) .... move on
    context window exceeded ........................... move on (a larger model may be next)
    content-policy refusal, any other 4xx ............. stop: the provider's answer is the caller's

The provider's own hint wins over backoff: ``retry-after-ms`` (milliseconds, Azure's, and the one
the official SDKs read first), ``Retry-After`` (seconds or an HTTP date) or a rate-limit reset
header (epoch seconds, epoch milliseconds, or a duration). No wait outlives the budget.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime

import attrs
import orjson

from llmgw.providers.base import Decision, Failure

__all__ = [
    "ABOUT_THE_REQUEST",
    "CONTEXT_TOO_LONG",
    "REQUEST_RATE_LIMITED",
    "REQUEST_TOO_LARGE",
    "SILENT",
    "RetryPolicy",
    "decide",
    "hinted_delay",
]

# The reasons a route acts on beyond moving on (fallback.FallbackChain skips what cannot answer).
SILENT = "silent"
CONTEXT_TOO_LONG = "context_length_exceeded"
REQUEST_TOO_LARGE = "request_too_large"  # larger than the whole tokens-per-minute limit
REQUEST_RATE_LIMITED = "request_rate_limited"  # this request would take its limit past the top
# Reasons that say the request is what failed, not the deployment (its breaker does not count
# them: a caller could otherwise switch a deployment off for everyone with its own requests).
ABOUT_THE_REQUEST = frozenset({CONTEXT_TOO_LONG, REQUEST_TOO_LARGE, REQUEST_RATE_LIMITED})

# Statuses a provider answers when it is briefly unable (529: Anthropic's overload).
TRANSIENT_STATUSES = frozenset({408, 500, 502, 503, 504, 529})
_RESET_HEADERS = ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens")
_EPOCH_MS_THRESHOLD = 1e12
_EPOCH_S_THRESHOLD = 1e9
# Only the start of an error body is searched: the message sits there, and bodies can be large.
_BODY_PREFIX = 8192

# How providers say a request is longer than the model's window (shared/provider-failures.md F1):
# OpenAI, Azure and Venice send the code; vLLM, Anthropic, Gemini and Ollama only the message.
_CONTEXT_CODES = frozenset({"context_length_exceeded"})
_CONTEXT_MESSAGES = (
    "maximum context length",
    "context window",
    "maximum context",
    "prompt is too long",
    "exceed context limit",
    "exceeds the maximum number of tokens",
    "input tokens exceed the configured limit",
    "longer than the context length",
)
# Content-policy refusals (OpenAI, Azure, Venice): the provider's reason is the caller's answer.
_POLICY_CODES = frozenset(
    {"content_filter", "content_policy_violation", "invalid_prompt", "content_blocked_by_provider"}
)
_POLICY_MESSAGES = ("content policy", "usage policy", "safety system", "content management policy")
# 429s that waiting does not fix: an exhausted quota or balance, a request above the whole limit.
_HOPELESS_429_CODES = frozenset({"insufficient_quota"})
_HOPELESS_429_MESSAGES = ("exceeded your current quota", "too many failed")
# 429s about one request (shared/provider-failures.md F1.1, F1.3): OpenAI's "Request too large for
# gpt-4o ... on tokens per min (TPM)" never fits; Anthropic's "This request would exceed the rate
# limit ... of N input tokens per minute" is this request's size against what is left.
_TOO_LARGE_MESSAGES = ("request too large",)
_REQUEST_RATE_MESSAGES = ("this request would exceed", "input tokens per minute")


def _parse_delay(value: str, now: float) -> float | None:
    text = value.strip().lower().removesuffix("s")
    try:
        number = float(text)
    except ValueError:
        try:
            return parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError, IndexError):
            return None
    if number >= _EPOCH_MS_THRESHOLD:
        return number / 1000.0 - now
    if number >= _EPOCH_S_THRESHOLD:
        return number - now
    return number


def hinted_delay(
    headers: Mapping[str, str], *, status: int, now: float | None = None
) -> float | None:
    """Seconds the upstream asked us to wait, if it said; never negative.

    Reset headers ride on every Venice answer, but they only explain a rate-limit refusal (429).
    """
    wall = time.time() if now is None else now
    # Azure sends both (shared/azure-openai.md Z8); the official SDKs read the milliseconds first.
    milliseconds = _milliseconds(headers.get("retry-after-ms"))
    if milliseconds is not None:
        return max(0.0, milliseconds / 1000.0)
    names = ("retry-after", *_RESET_HEADERS) if status == 429 else ("retry-after",)
    for name in names:
        value = headers.get(name)
        if value:
            delay = _parse_delay(value, wall)
            if delay is not None:
                return max(0.0, delay)
    return None


def _milliseconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


@attrs.frozen
class RetryPolicy:
    """How often and how long apart one deployment is asked again within one request."""

    max_retries: int = 2
    base_delay: float = 0.2
    max_delay: float = 8.0
    # A number between its two arguments; random.uniform unless a test fixes it.
    jitter: Callable[[float, float], float] = attrs.field(default=random.uniform, eq=False)

    def backoff(self, retry_number: int) -> float:
        """Exponential, with the upper half jittered: callers retrying together spread out, and
        a retry never comes sooner than half the step (0.1-0.2 s, 0.2-0.4 s, ... by default)."""
        step = min(self.max_delay, self.base_delay * 2**retry_number)
        return self.jitter(step / 2, step)

    def decide(
        self,
        failure: Failure,
        *,
        retries: int,
        remaining: float,
        now: float,
        max_retries: int | None = None,
    ) -> Decision:
        """:func:`decide` under this policy, with at most ``max_retries`` retries when given (a
        route's limit for this call): what an adapter's retry loop asks (``providers.base.Retries``)."""
        policy = self
        if max_retries is not None and max_retries < self.max_retries:
            policy = attrs.evolve(self, max_retries=max_retries)
        return decide(failure, retries=retries, remaining=remaining, policy=policy, now=now)


def decide(
    failure: Failure, *, retries: int, remaining: float, policy: RetryPolicy, now: float
) -> Decision:
    """The next step after ``failure``, the ``retries``-th retry of this deployment already spent
    (0 after the first attempt) and ``remaining`` seconds of the request's budget left; ``now``
    is wall-clock time (epoch seconds), for waits given as a date."""
    if failure.silent:
        return Decision("move_on", SILENT)
    status = failure.status
    if status == 0:
        return _transient("connection_failed", None, retries, remaining, policy)
    hinted = hinted_delay(failure.headers, status=status, now=now)
    if status == 429:
        code, message = _error_text(failure.body)
        if any(m in message for m in _TOO_LARGE_MESSAGES):
            return Decision("move_on", REQUEST_TOO_LARGE)
        if code in _HOPELESS_429_CODES or any(m in message for m in _HOPELESS_429_MESSAGES):
            return Decision("move_on", "quota_exhausted")
        if any(m in message for m in _REQUEST_RATE_MESSAGES):
            return _transient(REQUEST_RATE_LIMITED, hinted, retries, remaining, policy)
        return _transient("rate_limited", hinted, retries, remaining, policy)
    if status in TRANSIENT_STATUSES:
        return _transient("overloaded", hinted, retries, remaining, policy)
    if 400 <= status < 500:
        code, message = _error_text(failure.body)
        if code in _CONTEXT_CODES or any(m in message for m in _CONTEXT_MESSAGES):
            return Decision("move_on", CONTEXT_TOO_LONG)
        if code in _POLICY_CODES or any(m in message for m in _POLICY_MESSAGES):
            return Decision("stop", "content_policy")
    return Decision("stop", "refused")


def _transient(
    reason: str, hinted: float | None, retries: int, remaining: float, policy: RetryPolicy
) -> Decision:
    if retries >= policy.max_retries:
        return Decision("move_on", reason)
    wait = policy.backoff(retries) if hinted is None else hinted
    # A retry must still have time to be answered before the deadline.
    if wait >= remaining:
        return Decision("move_on", reason)
    return Decision("retry", reason, wait)


def _error_text(body: bytes) -> tuple[str, str]:
    """The error's ``code`` and its lower-cased message (or the body's start when it has none)."""
    head = body[:_BODY_PREFIX]
    text = head.decode(errors="replace").lower()
    try:
        document = orjson.loads(body) if len(body) <= _BODY_PREFIX else None
    except orjson.JSONDecodeError:
        return "", text
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict):  # Venice's and Ollama's error is a string; Gemini's a list
        return "", text
    code, message = error.get("code"), error.get("message")
    return (code if isinstance(code, str) else ""), (str(message).lower() if message else text)
