"""A fake Azure OpenAI resource, behaving as ``shared/azure-openai.md`` says the service does.

A real aiohttp server on 127.0.0.1 serving both URL schemes:

- classic: ``/openai/deployments/{deployment}/chat/completions`` and ``.../embeddings`` with a
  required ``api-version`` query (an unknown one: 404 "Resource not found"; one older than
  2024-09-01 refuses ``stream_options`` as the service did, Z4);
- v1: ``/openai/v1/chat/completions`` and ``/openai/v1/embeddings``, the deployment in ``model``.

The key is accepted in ``api-key`` (both schemes) or as a Bearer token (v1 only); otherwise the
401 Azure sends (Z2). An unknown deployment is 404 ``DeploymentNotFound`` (Z3). Answers carry
``prompt_filter_results`` and per-choice ``content_filter_results``, and ``model`` is the
deployment's underlying model, not its name (Z3, Z5). A stream is Z11's: a first chunk with no
choices and a blank identity holding the prompt's filter results, ``content_filter_results: {}``
on the role and finish chunks, verdicts on each content chunk, the usage chunk when asked.
With ``tools`` it calls the first one unless the last message is a tool result (as FakeOpenAI).

Tests script the next answers with :meth:`FakeAzure.fail_next` (``PROMPT_FILTERED``, the 400
``content_filter`` refusal; ``OUTPUT_FILTERED``, a 200 ending ``finish_reason: content_filter``;
``STREAM_DROPPED``, a stream cut after two content chunks; :class:`RateLimited`, a 429 with
``retry-after``, ``retry-after-ms`` and ``x-ratelimit-*``; any other status) and read
``received`` (``path`` includes the query).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import attrs
from aiohttp import web

from tests.fake_openai import RecordingFake, _event, _tool_call, end_stream, reply_deltas
from tests.fake_venice import (
    _embeddings_body,
    _hang_up,
    count_prompt_tokens,
    split_reply,
)

FAKE_AZURE_KEY = "fake-azure-key-7f3a9c2e4b"
# Deployment names (what callers and llmgw name) and the model each one runs (what Azure answers).
FAKE_AZURE_DEPLOYMENTS = {
    "prod-chat": "gpt-4o-2024-11-20",
    "backup-chat": "gpt-4o-mini-2024-07-18",
    "embed-small": "text-embedding-3-small",
}
GA_API_VERSION = "2024-10-21"
# api-versions the service knows (Z1); any other is a 404. Those dated before 2024-09-01 refuse
# stream_options (Z1, Z4).
API_VERSIONS = frozenset(
    {
        "2024-02-01",
        "2024-06-01",
        "2024-08-01-preview",
        "2024-09-01-preview",
        GA_API_VERSION,
        "2024-12-01-preview",
        "2025-01-01-preview",
        "2025-03-01-preview",
        "2025-04-01-preview",
    }
)
_STREAM_OPTIONS_SINCE = "2024-09-01"
V1_API_VERSIONS = frozenset({"v1", "preview"})

PROMPT_FILTERED = "prompt_filtered"
OUTPUT_FILTERED = "output_filtered"
# A stream whose connection is cut after its first two content chunks (no finish, no [DONE]).
STREAM_DROPPED = "stream_dropped"
_DROPPED_AFTER_CONTENT_CHUNKS = 2
# Outcomes that shape a 200 answer rather than replace it.
_ANSWER_OUTCOMES = frozenset({OUTPUT_FILTERED, STREAM_DROPPED})


@attrs.frozen
class RateLimited:
    """A 429 as Azure sends it (Z8): the wait in both headers and in the message."""

    retry_after_ms: int = 250


Outcome = int | str | RateLimited

SAFE = {"filtered": False, "severity": "safe"}
# What the filters found in a harmless prompt and answer (Z5, Z11).
PROMPT_VERDICTS = {
    "hate": SAFE,
    "jailbreak": {"filtered": False, "detected": False},
    "self_harm": SAFE,
    "sexual": SAFE,
    "violence": SAFE,
}
OUTPUT_VERDICTS = {"hate": SAFE, "self_harm": SAFE, "sexual": SAFE, "violence": SAFE}
FILTERED_OUTPUT_VERDICTS = {**OUTPUT_VERDICTS, "violence": {"filtered": True, "severity": "high"}}
PROMPT_FILTER_RESULTS = [{"prompt_index": 0, "content_filter_results": PROMPT_VERDICTS}]
SYSTEM_FINGERPRINT = "fp_ded0d14823"

# The refusal of a prompt exactly as the service sends it (Z7: "innererror", singular result).
PROMPT_FILTERED_BODY = {
    "error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's content "
        "management policy. Please modify your prompt and retry. To learn more about our content "
        "filtering policies please read our documentation: "
        "https://go.microsoft.com/fwlink/?linkid=2198766",
        "type": None,
        "param": "prompt",
        "code": "content_filter",
        "status": 400,
        "innererror": {
            "code": "ResponsibleAIPolicyViolation",
            "content_filter_result": {
                **PROMPT_VERDICTS,
                "jailbreak": {"filtered": True, "detected": True},
            },
        },
    }
}
UNAUTHORIZED_MESSAGE = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a "
    "valid key for an active subscription and use a correct regional API endpoint for your resource."
)
DEPLOYMENT_NOT_FOUND_MESSAGE = (
    "The API deployment for this resource does not exist. If you created the deployment within "
    "the last 5 minutes, please wait a moment and try again."
)


def azure_error(status: int, code: str, message: str, **headers: str) -> web.Response:
    """Azure's usual error body: ``code`` is often the status as a string, no ``type`` (Z7)."""
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status, headers=headers
    )


class FakeAzure(RecordingFake[Outcome]):
    def __init__(self, *, reply: str = "Hello from fake Azure!", chunks: int = 4) -> None:
        super().__init__(reply=reply, chunks=chunks)
        # Reported instead of the fake's own count (cached and reasoning tokens, as Azure
        # reports them in OpenAI's shape, Z5), when set.
        self.usage: dict[str, Any] | None = None

    @property
    def endpoint(self) -> str:
        """The resource's endpoint: what an Azure provider's ``base_url`` is."""
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/openai/deployments/{deployment}/chat/completions", self._chat)
        app.router.add_post("/openai/deployments/{deployment}/embeddings", self._embeddings)
        app.router.add_post("/openai/v1/chat/completions", self._chat)
        app.router.add_post("/openai/v1/embeddings", self._embeddings)
        return app

    # Admission -------------------------------------------------------------------------------

    async def _admit(self, request: web.Request) -> tuple[dict[str, Any], str] | web.Response:
        """The body and the deployment's model, or the error Azure answers instead."""
        received = await self._record(request)
        body, headers = received.json, received.headers
        classic = "deployment" in request.match_info
        version = request.query.get("api-version")
        if classic and version not in API_VERSIONS:
            return azure_error(404, "404", "Resource not found")
        if not classic and version is not None and version not in V1_API_VERSIONS:
            return azure_error(404, "404", "Resource not found")
        key_ok = headers.get("api-key") == FAKE_AZURE_KEY or (
            not classic and headers.get("authorization") == f"Bearer {FAKE_AZURE_KEY}"
        )
        if not key_ok:
            return azure_error(401, "401", UNAUTHORIZED_MESSAGE)
        if not isinstance(body, dict):
            return azure_error(400, "BadRequest", "Expected a JSON object.")
        deployment = request.match_info["deployment"] if classic else body.get("model")
        model = FAKE_AZURE_DEPLOYMENTS.get(deployment) if isinstance(deployment, str) else None
        if model is None:
            return azure_error(404, "DeploymentNotFound", DEPLOYMENT_NOT_FOUND_MESSAGE)
        if classic and "stream_options" in body and str(version) < _STREAM_OPTIONS_SINCE:
            message = (
                "Unrecognized request argument supplied: stream_options. Please contact us "
                "through an Azure support request at: https://go.microsoft.com/fwlink/?linkid=2213926 "
                "for further questions."
            )
            return azure_error(400, "BadRequest", message)
        if body.get("stream_options") is not None and body.get("stream") is not True:
            error = {
                "message": "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "type": "invalid_request_error",
                "param": "stream_options",
                "code": None,
            }
            return web.json_response({"error": error}, status=400)
        refusal = self._refusal(version or "v1")
        return refusal if refusal is not None else (body, model)

    def _refusal(self, version: str) -> web.Response | None:
        if not self._failures or self._failures[0] in _ANSWER_OUTCOMES:
            return None  # an answer, filtered or cut while it is written
        outcome = self._failures.popleft()
        if outcome == PROMPT_FILTERED:
            return web.json_response(PROMPT_FILTERED_BODY, status=400)
        if isinstance(outcome, RateLimited):
            seconds = math.ceil(outcome.retry_after_ms / 1000)
            message = (
                "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version "
                f"{version} have exceeded token rate limit of your current OpenAI S0 pricing tier. "
                f"Please retry after {seconds} seconds. Please go here: "
                "https://aka.ms/oai/quotaincrease if you would like to further increase the "
                "default rate limit."
            )
            return azure_error(
                429,
                "429",
                message,
                **{
                    "retry-after": str(seconds),
                    "retry-after-ms": str(outcome.retry_after_ms),
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-remaining-tokens": "0",
                },
            )
        assert isinstance(outcome, int), outcome
        return azure_error(outcome, str(outcome), "The service is temporarily unavailable.")

    # Operations ------------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request)
        if isinstance(admitted, web.Response):
            return admitted
        body, model = admitted
        shaped = self._failures.popleft() if self._failures else None
        filtered = shaped == OUTPUT_FILTERED
        base = {
            "id": "chatcmpl-" + os.urandom(12).hex(),
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }
        call = _tool_call(body)
        # A filtered answer is usually cut before any content (Z5); the stream stops where it was.
        reply = self.reply if call is None else call["function"]["arguments"]
        pieces = split_reply(reply, self.chunks)[: 1 if filtered else None]
        prompt = count_prompt_tokens(body.get("messages"))
        usage = self.usage or {
            "completion_tokens": len(pieces),
            "prompt_tokens": prompt,
            "total_tokens": prompt + len(pieces),
        }
        finish_reason = "content_filter" if filtered else "stop" if call is None else "tool_calls"
        verdicts = FILTERED_OUTPUT_VERDICTS if filtered else OUTPUT_VERDICTS
        if body.get("stream") is not True:
            message: dict[str, Any] = {
                "content": None if filtered else self.reply,
                "refusal": None,
                "role": "assistant",
            }
            if call is not None and not filtered:
                message = {**message, "content": None, "tool_calls": [call]}
            choice = {
                "content_filter_results": verdicts,
                "finish_reason": finish_reason,
                "index": 0,
                "logprobs": None,
                "message": message,
            }
            document = {
                **base,
                "choices": [choice],
                "object": "chat.completion",
                "prompt_filter_results": PROMPT_FILTER_RESULTS,
                "usage": usage,
            }
            return web.json_response(document)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        blank = {"choices": [], "created": 0, "id": "", "model": "", "object": ""}
        await response.write(_event({**blank, "prompt_filter_results": PROMPT_FILTER_RESULTS}))
        chunk = {**base, "object": "chat.completion.chunk"}
        deltas: list[tuple[dict[str, Any], dict[str, Any]]] = [
            ({"content": "", "refusal": None, "role": "assistant"}, {})
        ]
        deltas += [(delta, OUTPUT_VERDICTS) for delta in reply_deltas(call, pieces)]
        for sent, (delta, results) in enumerate(deltas):
            if shaped == STREAM_DROPPED and sent > _DROPPED_AFTER_CONTENT_CHUNKS:
                _hang_up(request)
                return response
            await response.write(_event({**chunk, "choices": [_delta(delta, results, None)]}))
        finish = _delta({}, FILTERED_OUTPUT_VERDICTS if filtered else {}, finish_reason)
        return await end_stream(response, chunk, finish, body, usage)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request)
        if isinstance(admitted, web.Response):
            return admitted
        body, model = admitted
        return web.Response(
            body=_embeddings_body({**body, "model": model}), content_type="application/json"
        )


def _delta(delta: dict[str, Any], results: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "content_filter_results": results,
        "delta": delta,
        "finish_reason": finish,
        "index": 0,
        "logprobs": None,
    }
