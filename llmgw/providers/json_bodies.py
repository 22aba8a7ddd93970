"""The JSON bodies of an adapter that translates to another API than OpenAI's: the call's body
replaced by the translated request, and the answer's read back as a JSON object."""

from __future__ import annotations

from typing import Any, Final

import attrs
import orjson

from llmgw.errors import UpstreamUnavailable
from llmgw.providers.base import UpstreamCall, UpstreamResponse

__all__ = ["answer_document", "counted_tokens", "invalid_answer", "with_json_body"]

_JSON: Final = "application/json"


def with_json_body(call: UpstreamCall, body: Any) -> UpstreamCall:
    """``call`` sending ``body`` (the request in the upstream API's shape) as JSON."""
    return attrs.evolve(call, body=orjson.dumps(body), content_type=_JSON)


def answer_document(answer: UpstreamResponse, provider: str) -> dict[str, Any]:
    """A 2xx answer's JSON object; a 502 ``upstream_invalid_response`` when it is not one."""
    try:
        document = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        document = None
    if not isinstance(document, dict):
        raise invalid_answer(provider)
    return document


def invalid_answer(provider: str) -> UpstreamUnavailable:
    """The 502 for a 2xx answer that lacks what the upstream API defines."""
    return UpstreamUnavailable(
        f"{provider} answered with a body that is not the answer its API defines.",
        code="upstream_invalid_response",
    )


def counted_tokens(answer: UpstreamResponse, provider: str, field: str) -> UpstreamResponse:
    """A token-counting API's answer, its count under ``field``, as Messages' count_tokens
    answers: ``{"input_tokens": n}``."""
    count = answer_document(answer, provider).get(field)
    if not isinstance(count, int):
        raise invalid_answer(provider)
    return attrs.evolve(answer, body=orjson.dumps({"input_tokens": count}), content_type=_JSON)
