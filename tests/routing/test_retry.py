"""retry.decide, the one mapping from what an attempt came back with to the route's next step:
no network, a fixed wall clock and a fixed jitter."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import orjson
import pytest

from llmgw.providers.base import Decision, Failure, Retries
from llmgw.routing.retry import (
    ABOUT_THE_REQUEST,
    REQUEST_RATE_LIMITED,
    REQUEST_TOO_LARGE,
    RetryPolicy,
    decide,
)

NOW = 1_800_000_000.0  # the wall clock, epoch seconds
HIGH = RetryPolicy(max_retries=2, jitter=lambda _low, high: high)
LOW = RetryPolicy(max_retries=2, jitter=lambda low, _high: low)


def after(
    failure: Failure, *, retries: int = 0, remaining: float = 60.0, policy: RetryPolicy = HIGH
) -> Decision:
    return decide(failure, retries=retries, remaining=remaining, policy=policy, now=NOW)


def answered(status: int, error: object = None, **headers: str) -> Failure:
    body = orjson.dumps(error) if error is not None else b""
    return Failure(status, headers, body)


def openai_error(code: str | None, message: str) -> dict[str, object]:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    }


# Silence ------------------------------------------------------------------------------------------


def test_silence_moves_on_at_once_even_with_retries_left() -> None:
    assert after(Failure(silent=True)) == Decision("move_on", "silent")


# Transient failures: backoff with jitter, then move on ------------------------------------------------


@pytest.mark.parametrize("status", [408, 500, 502, 503, 504, 529])
def test_a_transient_status_is_retried_with_exponential_backoff_then_moves_on(status: int) -> None:
    assert [after(answered(status), retries=n).wait for n in (0, 1)] == [0.2, 0.4]
    assert after(answered(status), retries=2) == Decision("move_on", "overloaded")


def test_a_broken_connection_is_retried_like_an_overload() -> None:
    assert after(Failure()) == Decision("retry", "connection_failed", 0.2)
    assert after(Failure(), retries=2).action == "move_on"


def test_jitter_spreads_a_retry_over_the_upper_half_of_its_step() -> None:
    assert [after(answered(503), retries=n, policy=LOW).wait for n in (0, 1)] == [0.1, 0.2]
    capped = RetryPolicy(max_retries=10, max_delay=8.0, jitter=lambda _low, high: high)
    assert after(answered(503), retries=9, policy=capped).wait == 8.0


def test_a_retry_that_would_end_past_the_budget_moves_on() -> None:
    assert after(answered(503), remaining=0.15) == Decision("move_on", "overloaded")


def test_a_provider_retry_after_on_a_503_wins_over_backoff() -> None:
    assert after(answered(503, **{"retry-after": "1.5"})).wait == 1.5


# Rate limits ---------------------------------------------------------------------------------------


def test_a_429_retry_after_is_waited_for_when_the_budget_allows() -> None:
    assert after(answered(429, **{"retry-after": "2"})) == Decision("retry", "rate_limited", 2.0)


def test_a_429_retry_after_as_an_http_date_is_read_with_the_given_clock() -> None:
    date = format_datetime(datetime.fromtimestamp(NOW + 3, tz=UTC), usegmt=True)
    assert after(answered(429, **{"retry-after": date})).wait == pytest.approx(3.0)


def test_a_429_wait_longer_than_the_budget_moves_on_without_waiting() -> None:
    assert after(answered(429, **{"retry-after": "30"}), remaining=5.0) == Decision(
        "move_on", "rate_limited"
    )


def test_a_429_retry_after_ms_wins_over_its_whole_seconds() -> None:
    # Azure's 429 says both (shared/azure-openai.md Z8); the milliseconds are read first, as the
    # official SDKs read them.
    azure = answered(429, **{"retry-after": "2", "retry-after-ms": "250"})
    assert after(azure) == Decision("retry", "rate_limited", 0.25)
    assert after(answered(429, **{"retry-after-ms": "30000"}), remaining=5.0).action == "move_on"
    assert after(answered(429, **{"retry-after-ms": "soon", "retry-after": "1"})).wait == 1.0


def test_a_429_without_a_hint_backs_off() -> None:
    assert after(answered(429)) == Decision("retry", "rate_limited", 0.2)


def test_a_429_reset_header_in_epoch_milliseconds_is_a_wait() -> None:
    reset = str(int((NOW + 1.5) * 1000))
    assert after(answered(429, **{"x-ratelimit-reset-requests": reset})).wait == pytest.approx(1.5)


@pytest.mark.parametrize(
    "error",
    [
        openai_error(
            "insufficient_quota", "You exceeded your current quota, please check your plan."
        ),
        {"error": "Too many failed attempts (> 50) resulting in a non-success status code."},
    ],
)
def test_a_429_that_waiting_cannot_fix_moves_on_at_once(error: object) -> None:
    assert after(answered(429, error, **{"retry-after": "1"})) == Decision(
        "move_on", "quota_exhausted"
    )


def test_a_request_too_large_for_the_tpm_limit_moves_on_as_the_requests_fault() -> None:
    error = openai_error(
        "rate_limit_exceeded",
        "Request too large for gpt-4o in organization org-1 on tokens per min (TPM): Limit 30000, "
        "Requested 30601. The input or output tokens must be reduced in order to run successfully.",
    )
    decision = after(answered(429, error, **{"retry-after": "1"}))
    assert decision == Decision("move_on", REQUEST_TOO_LARGE)
    assert decision.reason in ABOUT_THE_REQUEST


def test_a_429_for_this_requests_input_tokens_per_minute_is_about_the_request() -> None:
    error = {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "This request would exceed the rate limit for your organization (abc) of "
            "40,000 input tokens per minute. For details, refer to: https://docs.claude.com/.",
        },
    }
    decision = after(answered(429, error, **{"retry-after": "1"}))
    assert decision == Decision("retry", REQUEST_RATE_LIMITED, 1.0)
    assert decision.reason in ABOUT_THE_REQUEST
    assert after(answered(429, error), retries=2).action == "move_on"
    assert "rate_limited" not in ABOUT_THE_REQUEST  # an ordinary rate limit is the deployment's


# Context window and content policy ---------------------------------------------------------------

# Azure's refusal of a prompt as the service sends it (shared/azure-openai.md Z7).
AZURE_PROMPT_FILTERED = (
    b'{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI\'s '
    b"content management policy. Please modify your prompt and retry. To learn more about our "
    b"content filtering policies please read our documentation: "
    b'https://go.microsoft.com/fwlink/?linkid=2198766","type":null,"param":"prompt",'
    b'"code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation",'
    b'"content_filter_result":{"hate":{"filtered":false,"severity":"safe"},"jailbreak":'
    b'{"filtered":true,"detected":true},"self_harm":{"filtered":false,"severity":"safe"},'
    b'"sexual":{"filtered":false,"severity":"safe"},"violence":{"filtered":false,'
    b'"severity":"safe"}}}}}'
)


@pytest.mark.parametrize(
    "error",
    [
        openai_error(
            "context_length_exceeded", "This model's maximum context length is 8192 tokens."
        ),
        {
            "error": {
                "message": "This model's maximum context length is 32768 tokens. However, your request has 40000 input tokens.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        },
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000 maximum",
            },
        },
        [
            {
                "error": {
                    "code": 400,
                    "message": "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ],
    ],
    ids=["openai", "vllm", "anthropic", "gemini-array"],
)
def test_a_context_window_too_small_moves_on_and_is_never_retried(error: object) -> None:
    assert after(answered(400, error)) == Decision("move_on", "context_length_exceeded")


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (
            422,
            {"error": "Your prompt violates the content policy of Venice.ai or the model provider"},
        ),
        (
            400,
            openai_error(
                "invalid_prompt",
                "Invalid prompt: your prompt was flagged as potentially violating our usage policy.",
            ),
        ),
        (
            400,
            {
                "error": {
                    "code": "content_filter",
                    "message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.",
                    "status": 400,
                }
            },
        ),
        (400, orjson.loads(AZURE_PROMPT_FILTERED)),
    ],
    ids=["venice", "openai", "azure", "azure-as-sent"],
)
def test_a_content_policy_refusal_stops(status: int, error: object) -> None:
    assert after(answered(status, error)) == Decision("stop", "content_policy")


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404, 409, 413, 422])
def test_any_other_4xx_stops(status: int) -> None:
    assert after(answered(status, openai_error(None, "Bad request"))) == Decision("stop", "refused")


def test_an_error_body_that_is_not_json_is_read_as_text() -> None:
    failure = Failure(400, {}, b"<html>maximum context length exceeded</html>")
    assert after(failure).action == "move_on"


def test_the_policy_an_adapter_asks_caps_retries_at_the_calls_limit() -> None:
    # An adapter holds the policy as providers.base.Retries; a route's max_retries (0 when another
    # deployment is left) lowers the policy's own, never raises it.
    policy: Retries = HIGH
    failure = answered(503)
    assert policy.decide(failure, retries=0, remaining=60.0, now=NOW) == after(failure)
    assert policy.decide(failure, retries=0, remaining=60.0, now=NOW, max_retries=0) == Decision(
        "move_on", "overloaded"
    )
    assert policy.decide(failure, retries=2, remaining=60.0, now=NOW, max_retries=5) == Decision(
        "move_on", "overloaded"
    )
