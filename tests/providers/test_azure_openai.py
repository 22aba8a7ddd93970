"""The Azure OpenAI adapter: where each operation is sent in each URL scheme, and with which key
header (real sockets: an upstream that records every request and answers 200)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.errors import InvalidRequest
from llmgw.providers.azure_openai import PLUGIN, AzureOpenAIProvider
from llmgw.providers.base import UpstreamCall
from llmgw.providers.openai_compatible import new_client_session
from llmgw.providers.plugin import Timeouts
from llmgw.routing.retry import RetryPolicy

KEY = "azure-secret-key"


class Recorder:
    """Answers every request with an empty JSON object and keeps its path, query and headers."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.server: TestServer | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.raw_path, dict(request.headers)))
        return web.json_response({})


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    recorder.server = TestServer(app, host="127.0.0.1")
    await recorder.server.start_server()
    yield recorder
    await recorder.server.close()


def adapter(recorder: Recorder, api_version: str | None) -> AzureOpenAIProvider:
    assert recorder.server is not None
    return AzureOpenAIProvider(
        api_version=api_version,
        name="azure",
        base_url=str(recorder.server.make_url("/")),  # a trailing slash is no second one
        api_key=KEY,
        session=new_client_session(),
        retry=RetryPolicy(max_retries=0),
        timeouts=Timeouts(attempt=5.0, connect=5.0, first_token=5.0, stall=5.0),
        headers={"X-Team": "search"},
    )


def call(model: str) -> UpstreamCall:
    deadline = asyncio.get_running_loop().time() + 10
    body = orjson.dumps({"model": model, "messages": []})
    return UpstreamCall(body=body, deadline=deadline, model=model)


async def test_classic_puts_the_deployment_in_the_path_and_the_api_version_in_the_query(
    recorder: Recorder,
) -> None:
    provider = adapter(recorder, "2025-04-01-preview")
    try:
        await provider.chat_completion(call("prod-chat"))
        await provider.embeddings(call("embed-small"))
        await provider.forward("/audio/transcriptions", call("whisper"))
        # Not bound to a deployment: the model stays in the body (Z6, Z10).
        await provider.forward("/responses", call("prod-chat"))
        stream = await provider.stream_chat_completion(call("prod-chat"))
        await stream.close()
    finally:
        await provider.close()
    query = "?api-version=2025-04-01-preview"
    assert [path for path, _ in recorder.seen] == [
        f"/openai/deployments/prod-chat/chat/completions{query}",
        f"/openai/deployments/embed-small/embeddings{query}",
        f"/openai/deployments/whisper/audio/transcriptions{query}",
        f"/openai/responses{query}",
        f"/openai/deployments/prod-chat/chat/completions{query}",
    ]


async def test_v1_sends_the_deployment_in_the_body_only(recorder: Recorder) -> None:
    provider = adapter(recorder, None)
    try:
        await provider.chat_completion(call("prod-chat"))
        await provider.embeddings(call("embed-small"))
        await provider.forward("/responses", call("prod-chat"))
    finally:
        await provider.close()
    assert [path for path, _ in recorder.seen] == [
        "/openai/v1/chat/completions",
        "/openai/v1/embeddings",
        "/openai/v1/responses",
    ]


@pytest.mark.parametrize("api_version", ["2024-10-21", None], ids=["classic", "v1"])
async def test_the_key_goes_in_api_key_and_never_as_a_bearer_token(
    recorder: Recorder, api_version: str | None
) -> None:
    provider = adapter(recorder, api_version)
    try:
        await provider.chat_completion(call("prod-chat"))
    finally:
        await provider.close()
    [(_, headers)] = recorder.seen
    assert headers["api-key"] == KEY
    assert "Authorization" not in headers
    assert headers["X-Team"] == "search", "configured headers are still sent"


async def test_a_deployment_name_is_one_path_segment(recorder: Recorder) -> None:
    provider = adapter(recorder, "2024-10-21")
    try:
        await provider.chat_completion(call("team/chat?x=1"))
        for name in (".", ".."):
            with pytest.raises(InvalidRequest, match="not the name of an Azure deployment"):
                await provider.chat_completion(call(name))
    finally:
        await provider.close()
    assert [path for path, _ in recorder.seen] == [
        "/openai/deployments/team%2Fchat%3Fx=1/chat/completions?api-version=2024-10-21"
    ]


async def test_models_lists_none_without_asking_azure(recorder: Recorder) -> None:
    provider = adapter(recorder, None)
    try:
        answer = await provider.list_models(asyncio.get_running_loop().time() + 5)
    finally:
        await provider.close()
    assert (answer.status, orjson.loads(answer.body)) == (200, {"object": "list", "data": []})
    assert recorder.seen == []


def test_the_kind_reasons_only_when_declared_and_never_prefills() -> None:
    capabilities = PLUGIN.capabilities
    assert (capabilities.reasoning, capabilities.prefill) == (False, False)
