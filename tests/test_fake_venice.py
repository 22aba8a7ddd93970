"""The fake Venice upstream answers with the shapes recorded from real Venice traffic."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.fake_venice import (
    FAKE_VENICE_KEY,
    TOOL_ARGUMENTS,
    Behaviour,
    FakeVenice,
    expected_cost_usd,
)
from tests.processes import eventually
from tests.recorded import recorded_answer

AUTH = {"Authorization": f"Bearer {FAKE_VENICE_KEY}"}
# Multi-byte characters so that character-wise chunking splits inside words.
REPLY = "héllo wörld ✓ and more"
MESSAGES = [{"role": "user", "content": "Reply with the single word: pong"}]
PROMPT_TOKENS = 6  # the fake counts whitespace-separated words
COMPLETION_TOKENS = 5  # one per content chunk
COST_USD = expected_cost_usd(PROMPT_TOKENS, COMPLETION_TOKENS)

Shape = tuple[frozenset[str], ...]


def sse_payloads(text: str) -> list[Any]:
    """Every `data:` payload, parsed as JSON except the final `[DONE]` marker kept as a string."""
    events = [event for event in text.split("\n\n") if event]
    assert all(event.startswith("data: ") for event in events), events
    return [
        "[DONE]" if event == "data: [DONE]" else orjson.loads(event[len("data: ") :])
        for event in events
    ]


def shape(payload: dict[str, Any], inner: str) -> Shape:
    """Key sets of the payload, its first choice, and that choice's `inner` (message/delta)."""
    choice = payload["choices"][0] if payload["choices"] else {}
    return frozenset(payload), frozenset(choice), frozenset(choice.get(inner, {}))


@pytest.fixture
async def fake() -> AsyncIterator[FakeVenice]:
    async with FakeVenice(reply=REPLY, chunks=COMPLETION_TOKENS) as server:
        yield server


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def chat(
    session: aiohttp.ClientSession, fake: FakeVenice, **fields: Any
) -> aiohttp.ClientResponse:
    body = {"model": "qwen3-5-9b", "messages": MESSAGES, **fields}
    return await session.post(f"{fake.base_url}/chat/completions", json=body, headers=AUTH)


async def stream_payloads(
    session: aiohttp.ClientSession, fake: FakeVenice, **fields: Any
) -> list[Any]:
    response = await chat(session, fake, stream=True, **fields)
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    return sse_payloads(await response.text())


async def test_non_stream_body_has_recorded_shape_and_billing(
    fake: FakeVenice, session: aiohttp.ClientSession
) -> None:
    _, recorded_body = recorded_answer(
        "raw_capture_matrix/raw_exposes_venice_parameters_and_cost.yaml"
    )
    response = await chat(session, fake, venice_parameters={"disable_thinking": True})

    assert response.status == 200
    body = await response.json()
    assert shape(body, "message") == shape(orjson.loads(recorded_body), "message")
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == "qwen3-5-9b"
    assert body["choices"][0]["message"]["content"] == REPLY
    assert body["venice_parameters"]["disable_thinking"] is True
    assert body["usage"] == {
        "completion_tokens": COMPLETION_TOKENS,
        "prompt_tokens": PROMPT_TOKENS,
        "prompt_tokens_details": {"cached_tokens": 0},
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
    }
    assert body["cost"] == {"diem": 0, "usd": COST_USD}
    headers = response.headers
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    assert headers["x-venice-model-id"] == "qwen3-5-9b"
    assert {"CF-RAY", "x-venice-version", "x-venice-balance-usd"} <= headers.keys()
    assert len(headers["x-ratelimit-reset-requests"]) == 13


async def test_stream_chunks_have_recorded_shapes(
    fake: FakeVenice, session: aiohttp.ClientSession
) -> None:
    _, recorded_body = recorded_answer(
        "raw_stream_capture_matrix/stream_raw_exposes_terminal_cost.yaml"
    )
    recorded = sse_payloads(recorded_body)
    payloads = await stream_payloads(session, fake, stream_options={"include_usage": True})

    assert payloads[-1] == recorded[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert {shape(c, "delta") for c in chunks} == {shape(c, "delta") for c in recorded[:-1]}
    assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1
    contents = [c["choices"][0]["delta"]["content"] for c in chunks[1:-2]]
    assert len(contents) == COMPLETION_TOKENS
    assert "".join(contents) == REPLY
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["cost"]["usd"] == COST_USD


async def test_finish_placement_bills_on_the_finish_chunk(
    fake: FakeVenice, session: aiohttp.ClientSession
) -> None:
    fake.usage_placement = "finish"
    chunks = (await stream_payloads(session, fake))[:-1]

    *unbilled, finish = chunks
    assert all(chunk["usage"] is None and "cost" not in chunk for chunk in unbilled)
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert finish["usage"]["total_tokens"] == PROMPT_TOKENS + COMPLETION_TOKENS
    assert finish["cost"]["usd"] == COST_USD


@pytest.mark.parametrize(("include_usage", "billed"), [(False, False), (True, True)])
async def test_usage_follows_include_usage_when_not_always(
    fake: FakeVenice, session: aiohttp.ClientSession, include_usage: bool, billed: bool
) -> None:
    fake.usage_always = False
    chunks = (
        await stream_payloads(session, fake, stream_options={"include_usage": include_usage})
    )[:-1]

    assert any("usage" in chunk for chunk in chunks) is billed
    assert (chunks[-1]["choices"] == []) is billed


async def test_streamed_tool_call_reassembles_arguments(
    fake: FakeVenice, session: aiohttp.ClientSession
) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    chunks = (await stream_payloads(session, fake, tools=tools))[:-1]

    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[1:-2]]
    assert calls[0]["function"] == {"arguments": "", "name": "add"}
    assert calls[0]["id"].startswith("call_")
    assert "".join(call["function"]["arguments"] for call in calls) == TOOL_ARGUMENTS
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_unknown_model_stream_gets_recorded_json_404(
    fake: FakeVenice, session: aiohttp.ClientSession
) -> None:
    status, recorded_body = recorded_answer(
        "error_envelope/nonexistent_model_streaming_error_preserves_status_and_body.yaml"
    )
    response = await chat(session, fake, model="venice-nonexistent-rig-test", stream=True)

    assert response.status == status == 404
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert await response.read() == recorded_body.encode()


async def test_fail_times_then_recovers(fake: FakeVenice, session: aiohttp.ClientSession) -> None:
    fake.fail_times(2, status=503, retry_after="7")
    fake.enqueue(Behaviour(status=429, ratelimit_reset_ms=1780567876726))

    for _ in range(2):
        response = await chat(session, fake)
        assert response.status == 503
        assert response.headers["Retry-After"] == "7"
        assert await response.json() == {
            "error": "The model is at capacity. Please try again later."
        }
    limited = await chat(session, fake)
    assert limited.status == 429
    assert limited.headers["x-ratelimit-reset-requests"] == "1780567876726"
    assert (await chat(session, fake)).status == 200
    assert len(fake.received) == 4


async def test_stream_cuts(fake: FakeVenice, session: aiohttp.ClientSession) -> None:
    fake.enqueue(Behaviour(drop_after_chunks=2), Behaviour(error_event_after_chunks=1))

    dropped = await chat(session, fake, stream=True)
    with pytest.raises(aiohttp.ClientPayloadError):
        await dropped.read()
    errored = (await stream_payloads(session, fake))[-2:]
    assert errored[0]["error"]["code"] == "model_overloaded"
    assert errored[1] == "[DONE]"
    assert (fake.completed_streams, fake.cancelled_streams) == (1, 0)


async def test_client_going_away_cancels_stalled_stream(
    fake: FakeVenice, session: aiohttp.ClientSession
) -> None:
    fake.enqueue(Behaviour(stall_after_chunks=1))
    response = await chat(session, fake, stream=True)
    await response.content.readuntil(b"\n\n")
    assert fake.active_streams == 1

    response.close()
    await eventually(lambda: fake.active_streams == 0, within=1)
    assert (fake.active_streams, fake.cancelled_streams, fake.completed_streams) == (0, 1, 0)


@pytest.mark.parametrize(
    ("headers", "status", "error"),
    [({}, 402, "Authentication required"), ({"Authorization": "Bearer nope"}, 401, None)],
)
async def test_auth_is_required_except_for_models(
    fake: FakeVenice,
    session: aiohttp.ClientSession,
    headers: dict[str, str],
    status: int,
    error: str | None,
) -> None:
    url = f"{fake.base_url}/chat/completions"
    response = await session.post(url, json={"model": "m", "messages": []}, headers=headers)

    assert response.status == status
    body = await response.json()
    assert body["error"] == (error or "Authentication failed")
    assert ("x402Version" in body) is (status == 402)
    models = await session.get(f"{fake.base_url}/models")
    assert models.status == 200
    assert "qwen3-5-9b" in {item["id"] for item in (await models.json())["data"]}


async def test_embeddings_honour_dimensions(
    fake: FakeVenice, session: aiohttp.ClientSession
) -> None:
    url = f"{fake.base_url}/embeddings"
    body = {"model": "text-embedding-qwen3-0-6b", "input": ["one two", "three"], "dimensions": 4}
    response = await session.post(url, json=body, headers=AUTH)

    assert response.status == 200
    answer = await response.json()
    assert [len(item["embedding"]) for item in answer["data"]] == [4, 4]
    assert answer["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    bad = await session.post(url, json={**body, "input": [1, 2]}, headers=AUTH)
    assert bad.status == 400


# Responses, images and audio (swagger /responses, /images/generations, /audio/*) -----------------


async def post_raw(fake: FakeVenice, path: str, **kwargs: Any) -> tuple[int, str, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(fake.base_url + path, headers=AUTH, **kwargs) as response,
    ):
        return response.status, response.content_type, await response.read()


async def test_chat_takes_only_chat_tools(fake: FakeVenice) -> None:
    """Nested functions and Venice's own search tools; a Responses-only kind is refused."""
    function = {"type": "function", "function": {"name": "add", "parameters": {}}}
    for tools, expected in (
        ([function, {"type": "web_search"}], 200),
        ([function, {"type": "namespace", "name": "n", "tools": []}], 400),
        ([{"type": "function", "name": "add", "parameters": {}}], 400),
    ):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
        status, _, answer = await post_raw(fake, "/chat/completions", json=body)
        assert status == expected, answer


async def test_responses_is_stateless_and_strict_about_its_fields(fake: FakeVenice) -> None:
    status, _, body = await post_raw(
        fake, "/responses", json={"model": "m", "input": "hi", "instructions": "x", "store": True}
    )
    assert status == 400
    assert b"Unrecognized key(s) in object: 'instructions', 'store'" in body
    flat_tool = {"type": "function", "name": "add", "parameters": {}}
    status, _, _ = await post_raw(
        fake, "/responses", json={"model": "m", "input": "hi", "tools": [flat_tool]}
    )
    assert status == 400  # Venice documents nested, chat-style function tools only
    status, _, body = await post_raw(fake, "/responses", json={"model": "m", "input": "hi"})
    assert status == 200
    document = orjson.loads(body)
    assert document["object"] == "response" and document["status"] == "completed"
    assert document["output"][0]["content"][0]["text"] == fake.reply
    assert set(document["usage"]) >= {"input_tokens", "output_tokens", "total_tokens"}


async def test_responses_stream_is_data_only_and_ends_with_done(fake: FakeVenice) -> None:
    status, content_type, body = await post_raw(
        fake, "/responses", json={"model": "m", "input": "hi", "stream": True}
    )
    assert (status, content_type) == (200, "text/event-stream")
    payloads = sse_payloads(body.decode())
    assert payloads[-1] == "[DONE]"
    kinds = [payload["type"] for payload in payloads[:-1]]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [p["sequence_number"] for p in payloads[:-1]] == list(range(len(kinds)))


async def test_images_speech_and_transcriptions(fake: FakeVenice) -> None:
    status, _, body = await post_raw(fake, "/images/generations", json={"model": "m"})
    assert status == 400  # prompt is required
    status, _, body = await post_raw(
        fake,
        "/images/generations",
        json={"model": "m", "prompt": "a cat", "response_format": "url"},
    )
    assert status == 200 and orjson.loads(body)["data"][0]["url"].startswith("data:image/png")
    status, content_type, body = await post_raw(
        fake, "/audio/speech", json={"model": "tts-kokoro", "input": "hi"}
    )
    assert (status, content_type) == (200, "audio/mpeg") and body.startswith(b"ID3")
    status, _, _ = await post_raw(fake, "/audio/transcriptions", json={"model": "m"})
    assert status == 415
    empty = aiohttp.FormData()
    empty.add_field("file", b"", filename="a.wav")
    status, _, _ = await post_raw(fake, "/audio/transcriptions", data=empty)
    assert status == 422  # zero-length audio
    form = aiohttp.FormData({"response_format": "text"})
    form.add_field("file", b"RIFF....", filename="a.wav")
    status, content_type, body = await post_raw(fake, "/audio/transcriptions", data=form)
    assert (status, content_type) == (200, "text/plain") and body.decode().startswith("Hello")
