"""The ledger's cost is the hand-computed bill, exactly, for answers with cached, cache-written
(5-minute and 1-hour) and reasoning tokens, through the gateway; media calls are priced, so
budgeted keys can make them (issue #20, acceptance 4; the Anthropic shape is in
tests/accounting/test_price.py)."""

from __future__ import annotations

import io
import uuid
import wave
from decimal import Decimal
from typing import Any

import aiohttp
import attrs
import pytest

from llmgw import app_keys
from llmgw.accounting.price import Price
from llmgw.config.prices import PriceEntry
from tests.conftest import Gateway
from tests.fake_venice import Behaviour
from tests.test_policy_and_ledger import flush, settle

MODEL = "qwen3-5-9b"
# Not what the fake's listing publishes for the model: the configured price wins.
PRICE = Price(
    input_usd_per_mtok=1.1,
    output_usd_per_mtok=4.4,
    cache_read_usd_per_mtok=0.275,
    cache_write_usd_per_mtok=1.375,
    reasoning_usd_per_mtok=8.8,
)
MEDIA = {
    "venice-sd35": Price(image_usd=0.04),
    "tts-kokoro": Price(speech_usd_per_mchar=15),
    "openai/whisper-large-v3": Price(audio_usd_per_second=0.0001),
}


def entry(model: str, price: Price) -> PriceEntry:
    """The [[prices]] entry for ``venice:model`` that gives ``price``."""
    usd = {key: value for key, value in attrs.asdict(price).items() if value is not None}
    return PriceEntry(f"venice:{model}", usd)


PRICES = (entry(MODEL, PRICE), *(entry(model, price) for model, price in MEDIA.items()))
# A chat answer's usage as Venice (and OpenAI) report it: prompt_tokens includes the cached and
# cache-written tokens, completion_tokens the reasoning ones. No "cost": the gateway prices it.
USAGE = {
    "prompt_tokens": 123_457,
    "completion_tokens": 6_789,
    "total_tokens": 130_246,
    "prompt_tokens_details": {"cached_tokens": 100_003, "cache_creation_input_tokens": 20_011},
    "completion_tokens_details": {"reasoning_tokens": 5_003},
}
BILL = (
    (123_457 - 100_003 - 20_011) * Decimal("1.1")
    + 100_003 * Decimal("0.275")
    + 20_011 * Decimal("1.375")
    + (6_789 - 5_003) * Decimal("4.4")
    + 5_003 * Decimal("8.8")
) / 1_000_000


@pytest.fixture
async def priced(start_gateway: Any) -> Gateway:
    gateway: Gateway = await start_gateway(prices=PRICES)
    return gateway


async def _rows(gateway: Gateway) -> list[Any]:
    await flush(gateway)
    return await gateway.db.fetch("SELECT * FROM usage_events ORDER BY id")


async def _post(gateway: Gateway, key: str, path: str, body: dict[str, Any]) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url(path), json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        await response.read()
        return response.status


async def test_every_token_kind_is_billed_at_its_price_exactly(priced: Gateway) -> None:
    key = await priced.create_key()
    messages = [{"role": "user", "content": "hi"}]
    requests = [
        ("/v1/chat/completions", {"model": MODEL, "messages": messages}),
        ("/v1/chat/completions", {"model": MODEL, "messages": messages, "stream": True}),
        ("/v1/responses", {"model": MODEL, "input": "hi"}),  # translated to chat upstream
    ]
    priced.fake.enqueue(*(Behaviour(billing={"usage": USAGE}) for _ in requests))
    for path, body in requests:
        assert await _post(priced, key, path, body) == 200
    rows = await _rows(priced)
    assert len(rows) == len(requests)
    for row in rows:
        assert abs(row["cost_usd"] - BILL) < Decimal("1e-9")
        assert row["cost_usd"] == BILL  # and in fact to the last digit
        assert row["cost_computed"] is True
        counts = (
            row["input_tokens"], row["cache_read_input_tokens"],
            row["cache_creation_input_tokens"], row["output_tokens"],
            row["reasoning_output_tokens"],
        )  # fmt: skip
        assert counts == (123_457, 100_003, 20_011, 6_789, 5_003)


def _wav(seconds: float) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16_000)
        writer.writeframes(b"\0\0" * int(16_000 * seconds))
    return buffer.getvalue()


async def test_priced_media_is_admitted_for_a_budgeted_key_and_charged(
    priced: Gateway,
) -> None:
    subject = uuid.uuid4()
    await priced.db.execute(
        "INSERT INTO subjects (subject_id, monthly_budget_usd) VALUES ($1, 1)", subject
    )
    key = await priced.create_key(subject_id=subject)
    image = {"model": "venice-sd35", "prompt": "a lighthouse", "n": 2}
    assert await _post(priced, key, "/v1/images/generations", image) == 200
    speech = {"model": "tts-kokoro", "voice": "af_sky", "input": "Hello there, world"}
    assert await _post(priced, key, "/v1/audio/speech", speech) == 200
    form = aiohttp.FormData()
    form.add_field("model", "openai/whisper-large-v3")
    form.add_field("file", _wav(1.5), filename="a.wav", content_type="audio/wav")
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            priced.url("/v1/audio/transcriptions"),
            data=form,
            headers={"Authorization": f"Bearer {key}"},
        ) as response,
    ):
        duration = Decimal(str((await response.json())["duration"]))
    rows = await _rows(priced)
    # One image returned (the fake answers one whatever n asks): billed one, not two.
    assert [(r["operation"], r["cost_usd"]) for r in rows] == [
        ("image_generation", Decimal("0.04")),
        ("text_to_speech", Decimal(len(speech["input"])) * 15 / 1_000_000),
        ("speech_to_text", duration * Decimal("0.0001")),  # the answer's duration
    ]
    await settle(priced)
    spent = await priced.server.app[app_keys.LIMITS].store.usage(
        f"budget:{subject}:{rows[0]['occurred_at'].strftime('%Y-%m')}"
    )
    assert spent[0] == pytest.approx(float(sum(r["cost_usd"] for r in rows)))


async def test_unpriced_media_is_still_refused_to_a_budgeted_key(priced: Gateway) -> None:
    subject = uuid.uuid4()
    await priced.db.execute(
        "INSERT INTO subjects (subject_id, monthly_budget_usd) VALUES ($1, 1)", subject
    )
    key = await priced.create_key(subject_id=subject)
    image = {"model": "unpriced-image-model", "prompt": "a lighthouse"}
    assert await _post(priced, key, "/v1/images/generations", image) == 403
