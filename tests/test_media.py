"""Images and audio through the official openai SDK against the fake Venice: the answers, the audio
streamed as it is generated, the upload limit, and keys, limits, allowlists, budgets, spans and
ledger rows for every new route (Responses included)."""

from __future__ import annotations

import base64
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from llmgw import app_keys
from llmgw.config.providers_file import DeploymentSpec, ModelAlias, ProviderSpec
from llmgw.telemetry import semconv as sc
from tests.conftest import Gateway, eventually
from tests.fake_venice import (
    FAKE_VENICE_KEY,
    PNG_1X1_B64,
    TRANSCRIPT,
    Behaviour,
    FakeVenice,
    speech_audio,
)

AUDIO = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 8


async def ledger_rows(gateway: Gateway) -> list[Any]:
    assert await gateway.server.app[app_keys.LEDGER].flush()
    return await gateway.db.fetch("SELECT * FROM usage_events ORDER BY id")


async def test_images_generate(gateway: Gateway, api_key: str) -> None:
    client = gateway.client(api_key)
    result = await client.images.generate(
        model="venice-sd35", prompt="a lighthouse", size="256x256"
    )
    assert result.data is not None and result.data[0].b64_json == PNG_1X1_B64
    assert base64.b64decode(PNG_1X1_B64).startswith(b"\x89PNG")
    sent = gateway.fake.received[-1]
    assert sent.path == "/api/v1/images/generations"
    assert sent.json["prompt"] == "a lighthouse" and sent.json["size"] == "256x256"
    span = gateway.telemetry.span("image_generation venice-sd35")
    assert span.attributes[sc.GEN_AI_OPERATION_NAME] == "image_generation"
    rows = await ledger_rows(gateway)
    assert [(r["operation"], r["model"], r["status"]) for r in rows] == [
        ("image_generation", "venice-sd35", 200)
    ]
    assert rows[0]["cost_usd"] is None  # Venice reports no cost for images


async def test_speech_is_streamed_to_a_file_as_it_is_generated(
    gateway: Gateway, api_key: str, tmp_path: Path
) -> None:
    gateway.fake.enqueue(Behaviour(chunk_delay=0.3))
    client = gateway.client(api_key)
    target = tmp_path / "speech.mp3"
    started = time.perf_counter()
    first_bytes_at = None
    async with client.audio.speech.with_streaming_response.create(
        model="tts-kokoro", voice="af_sky", input="Hello there"
    ) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        with target.open("wb") as file:
            async for data in response.iter_bytes():
                if first_bytes_at is None:
                    first_bytes_at = time.perf_counter() - started
                file.write(data)
    total = time.perf_counter() - started
    assert target.read_bytes() == speech_audio("Hello there")
    # Four chunks 0.3 s apart: the first arrived long before the last was generated.
    assert first_bytes_at is not None and total >= 0.9
    assert first_bytes_at < total - 0.5
    span = gateway.telemetry.span("text_to_speech tts-kokoro")
    assert span.attributes[sc.GEN_AI_REQUEST_STREAM] is True
    assert span.attributes[sc.LLMGW_STREAM_OUTCOME] == "completed"
    rows = await ledger_rows(gateway)
    assert [(r["operation"], r["status"]) for r in rows] == [("text_to_speech", 200)]


async def test_transcription_upload(gateway: Gateway, api_key: str, tmp_path: Path) -> None:
    path = tmp_path / "hello.wav"
    path.write_bytes(AUDIO)
    client = gateway.client(api_key)
    with path.open("rb") as file:
        result = await client.audio.transcriptions.create(
            model="openai/whisper-large-v3", file=file, language="en"
        )
    assert result.text == TRANSCRIPT
    sent = gateway.fake.received[-1]
    assert sent.path == "/api/v1/audio/transcriptions"
    assert sent.json == {
        "model": "openai/whisper-large-v3",
        "language": "en",
        "file_size": len(AUDIO),
    }
    with path.open("rb") as file:
        text = await client.audio.transcriptions.create(
            model="openai/whisper-large-v3", file=file, response_format="text"
        )
    assert text == TRANSCRIPT
    rows = await ledger_rows(gateway)
    assert [(r["operation"], r["status"]) for r in rows] == [("speech_to_text", 200)] * 2


async def test_uploads_have_their_own_limit(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(audio_upload_limit_bytes=len(AUDIO) + 1024)
    key = await gateway.create_key()
    client = gateway.client(key)
    # Larger than REQUEST_BODY_LIMIT_BYTES would allow a JSON body (1 MiB), within its own limit.
    big: Gateway = await start_gateway(audio_upload_limit_bytes=4 << 20)
    big_file = AUDIO * (1600 * 1024 // len(AUDIO))
    assert len(big_file) > big.server.app[app_keys.SETTINGS].request_body_limit_bytes
    result = await big.client(key).audio.transcriptions.create(
        model="openai/whisper-large-v3", file=("big.wav", big_file)
    )
    assert result.text == TRANSCRIPT
    with pytest.raises(openai.APIStatusError) as caught:
        await client.audio.transcriptions.create(
            model="openai/whisper-large-v3", file=("big.wav", AUDIO * 2)
        )
    assert caught.value.status_code == 413
    assert isinstance(caught.value.body, dict)
    assert "AUDIO_UPLOAD_LIMIT_BYTES" in caught.value.body["message"]


async def test_transcription_needs_a_file_and_multipart(gateway: Gateway, api_key: str) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    async with aiohttp.ClientSession() as session:
        form = aiohttp.FormData({"model": "openai/whisper-large-v3"}, default_to_multipart=True)
        async with session.post(
            gateway.url("/v1/audio/transcriptions"), data=form, headers=headers
        ) as response:
            assert response.status == 400
            assert (await response.json())["error"]["param"] == "file"
        async with session.post(
            gateway.url("/v1/audio/transcriptions"), json={"model": "x"}, headers=headers
        ) as response:
            assert response.status == 415


# Every new route: key, rate limit, allowlist, budget, span, ledger row ----------------------------


async def _call(client: openai.AsyncOpenAI, route: str, model: str) -> Any:
    if route == "responses":
        return await client.responses.create(model=model, input="hi")
    if route == "images":
        return await client.images.generate(model=model, prompt="a cat")
    if route == "speech":
        async with client.audio.speech.with_streaming_response.create(
            model=model, voice="af_sky", input="hi"
        ) as response:
            return await response.read()
    return await client.audio.transcriptions.create(model=model, file=("a.wav", AUDIO))


ROUTES = {
    "responses": ("qwen3-5-9b", "chat"),
    "images": ("venice-sd35", "image_generation"),
    "speech": ("tts-kokoro", "text_to_speech"),
    "transcriptions": ("openai/whisper-large-v3", "speech_to_text"),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
async def test_every_new_route_is_keyed_limited_allowlisted_budgeted_observed_and_billed(
    gateway: Gateway, route: str
) -> None:
    model, operation = ROUTES[route]
    with pytest.raises(openai.AuthenticationError):
        await _call(gateway.client("llmg_not-a-real-key"), route, model)

    allowed = gateway.client(await gateway.create_key(allowed_models=(model,)))
    await _call(allowed, route, model)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        await _call(allowed, route, "some-other-model")
    assert isinstance(denied.value.body, dict) and denied.value.body["code"] == "model_not_allowed"

    limited = gateway.client(await gateway.create_key(rate_limit_requests=1))
    await _call(limited, route, model)
    with pytest.raises(openai.RateLimitError) as limited_error:
        await _call(limited, route, model)
    assert limited_error.value.response.headers.get("retry-after")

    subject = uuid.uuid4()
    await gateway.db.execute(
        "INSERT INTO subjects (subject_id, monthly_budget_usd) VALUES ($1, 0)", subject
    )
    broke = gateway.client(await gateway.create_key(subject_id=subject))
    # A budget needs a price: Venice publishes chat prices, none for images or audio, so a
    # budgeted key is refused those models (403 price_unknown) rather than admitted unmetered.
    refusal = openai.RateLimitError if route == "responses" else openai.PermissionDeniedError
    with pytest.raises(refusal) as budget:
        await _call(broke, route, model)
    assert isinstance(budget.value.body, dict)
    assert budget.value.body["code"] == (
        "budget_exceeded" if route == "responses" else "price_unknown"
    )

    spans = [s for s in gateway.telemetry.finished_spans() if s.name == f"{operation} {model}"]
    assert len(spans) == 2
    assert all(s.attributes[sc.GEN_AI_PROVIDER_NAME] == "venice" for s in spans)
    rows = await ledger_rows(gateway)
    assert [(r["operation"], r["model"], r["status"]) for r in rows] == [
        (operation, model, 200)
    ] * 2
    # The refused calls never reached the provider (its model listing, read for prices, aside).
    received = [r.path for r in gateway.fake.received if not r.path.endswith("/models")]
    assert len(received) == 2


async def test_speech_cut_off_mid_stream_is_recorded_as_failed(
    gateway: Gateway, api_key: str
) -> None:
    gateway.fake.enqueue(Behaviour(chunk_delay=0.2))
    client = gateway.client(api_key)
    async with client.audio.speech.with_streaming_response.create(
        model="tts-kokoro", voice="af_sky", input="Hello there"
    ) as response:
        async for _ in response.iter_bytes():
            break  # the client hangs up after the first chunk
    name = "text_to_speech tts-kokoro"
    await eventually(lambda: any(s.name == name for s in gateway.telemetry.finished_spans()))
    assert gateway.telemetry.span(name).attributes[sc.LLMGW_STREAM_OUTCOME] == "cancelled"


async def test_an_alias_reaches_each_deployment_with_its_own_model(
    start_gateway: Any, fake_venice: FakeVenice
) -> None:
    venice = ProviderSpec(
        name="venice", kind="venice", base_url=fake_venice.base_url, api_key=FAKE_VENICE_KEY
    )
    alias = ModelAlias("stt", (DeploymentSpec("venice", "openai/whisper-large-v3"),))
    gateway: Gateway = await start_gateway(providers=(venice,), model_aliases=(alias,))
    client = gateway.client(await gateway.create_key(allowed_models=("stt",)))
    result = await client.audio.transcriptions.create(model="stt", file=("a.wav", AUDIO))
    assert result.text == TRANSCRIPT
    # The multipart body was re-encoded for the deployment's model.
    assert gateway.fake.received[-1].json["model"] == "openai/whisper-large-v3"


async def test_speech_the_provider_breaks_off_is_cut_short_and_recorded_as_failed(
    gateway: Gateway, api_key: str
) -> None:
    gateway.fake.enqueue(Behaviour(drop_after_chunks=2))
    received = b""
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url("/v1/audio/speech"),
            json={"model": "tts-kokoro", "voice": "af_sky", "input": "Hello there"},
            headers={"Authorization": f"Bearer {api_key}"},
        )
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for data in response.content.iter_any():
                received += data
    # What arrived is a strict prefix: the client can tell the audio is incomplete.
    assert speech_audio("Hello there").startswith(received)
    assert len(received) < len(speech_audio("Hello there"))
    span = gateway.telemetry.span("text_to_speech tts-kokoro")
    assert span.attributes[sc.LLMGW_STREAM_OUTCOME] == "failed"
    rows = await ledger_rows(gateway)
    assert [(r["operation"], r["error_type"]) for r in rows] == [
        ("text_to_speech", "upstream_stream_interrupted")
    ]
