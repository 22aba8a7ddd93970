"""The gateway's own errors: each leaf's status, type and code as the docstring's tree draws them,
OpenAI's error body, and a provider's error kept (status and message) when re-rendered."""

from __future__ import annotations

import inspect
import re

import orjson
import pytest

from llmgw import errors
from llmgw.errors import (
    AuthenticationFailed,
    GatewayError,
    InvalidRequest,
    ProviderError,
    RateLimited,
    UpstreamBusy,
)

LEAVES = [
    cls
    for _, cls in inspect.getmembers(errors, inspect.isclass)
    if issubclass(cls, GatewayError) and cls is not GatewayError
]


def drawn() -> dict[str, tuple[str, str, str | None]]:
    """The module docstring's tree: class name -> (status, type, code) as drawn ("" and None
    where the row draws none)."""
    tree: dict[str, tuple[str, str, str | None]] = {}
    for name, row in re.findall(r"[├└]── (\w+)\s+(.+)", errors.__doc__ or ""):
        parts = [part.strip() for part in row.split("(")[0].split(" / ")]
        status, _, kind = parts[0].partition(" ")
        if not status.isdigit():  # ProviderError: "the provider's status / type / code"
            status, kind, parts = "", parts[1], parts[1:]
        tree[name] = (status, kind, parts[1] if len(parts) > 1 else None)
    return tree


@pytest.mark.parametrize("cls", LEAVES, ids=lambda cls: cls.__name__)
def test_every_error_is_as_the_tree_draws_it(cls: type[GatewayError]) -> None:
    status, kind, code = drawn()[cls.__name__]
    assert cls.error_type == kind
    if status:
        assert str(cls.status) == status
    if code is not None:
        assert cls.code == code


def test_the_tree_names_every_error() -> None:
    assert set(drawn()) == {cls.__name__ for cls in LEAVES}


def test_the_body_is_openais_shape_with_param_only_when_named() -> None:
    error = InvalidRequest("messages must not be empty", param="messages")
    assert orjson.loads(error.body_bytes()) == {
        "error": {
            "message": "messages must not be empty",
            "type": "invalid_request_error",
            "code": "invalid_request",
            "param": "messages",
        }
    }
    assert "param" not in RateLimited("slow down").body()["error"]  # type: ignore[operator]


def test_a_code_given_replaces_the_class_code_for_that_error_only() -> None:
    error = RateLimited("too many tokens", code="tokens_per_minute_exceeded")
    assert (error.code, error.error_kind) == ("tokens_per_minute_exceeded", error.code)
    assert RateLimited("again").code == "rate_limit_exceeded"


def test_authentication_says_nothing_of_which_part_failed() -> None:
    error = AuthenticationFailed()
    assert error.status == 401 and dict(error.headers) == {"WWW-Authenticate": "Bearer"}
    assert error.message == AuthenticationFailed().message  # one message for every cause


def test_a_busy_upstream_is_a_503_that_routes_treat_as_unavailable() -> None:
    assert UpstreamBusy("full").status == 503
    assert isinstance(UpstreamBusy("full"), errors.UpstreamUnavailable)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "model overloaded"}}', "model overloaded"),  # OpenAI's
        (
            b'{"error": "Invalid request", "issues": [{"message": "a"}, {"message": "b"}, 3]}',
            "Invalid request: a; b",
        ),  # Venice's, with its validation issues
        (b'{"error": ""}', "The provider answered 429."),
        (b"<html>bad gateway</html>", "The provider answered 429."),
        (b"[1, 2]", "The provider answered 429."),
    ],
)
def test_a_providers_answer_keeps_its_status_and_message(body: bytes, message: str) -> None:
    error = ProviderError.from_answer(429, body, retry_after="7")
    assert (error.status, error.message, dict(error.headers)) == (
        429,
        message,
        {"Retry-After": "7"},
    )
    assert error.error_kind == "429"  # the label of a passed-through provider error
    assert orjson.loads(error.body_bytes())["error"]["type"] == "upstream_error"
    assert ProviderError.from_answer(500, body, retry_after=None).headers == {}
