"""What a media call is billed by: from its request before the answer, from the answer after."""

from __future__ import annotations

import io
import wave
from decimal import Decimal

from llmgw.accounting.metering import IMAGES, SPEECH, transcription_meter, upload_seconds
from llmgw.accounting.price import Metered


def wav(frames: int, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(2)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(b"\0\0\0\0" * frames)
    return buffer.getvalue()


def test_images_are_the_n_asked_for_until_the_answer_says_how_many_came() -> None:
    assert IMAGES.requested({"prompt": "x"}) == Metered("image", 1)
    assert IMAGES.requested({"n": 3}) == Metered("image", 3)
    assert IMAGES.requested({"n": True}) == Metered("image", 1)
    assert IMAGES.answered({"data": [{}, {}]}) == Metered("image", 2)
    assert IMAGES.answered({"error": "x"}) is None


def test_speech_is_the_characters_of_its_input() -> None:
    assert SPEECH.requested({"input": "héllo"}) == Metered("speech_char", 5)


def test_a_wav_upload_is_timed_exactly_and_any_other_by_its_size() -> None:
    assert upload_seconds(wav(24_000, 16_000)) == Decimal("1.5")
    assert upload_seconds(b"ID3" + b"\0" * 4_997) == Decimal("2.5")  # an MP3: 5,000 bytes


def test_a_transcription_is_billed_by_the_answers_duration_else_the_uploads() -> None:
    meter = transcription_meter(wav(8_000, 16_000))
    assert meter.requested({}) == Metered("audio_second", Decimal("0.5"))
    assert meter.answered({"text": "hi", "duration": 0.48}) == Metered("audio_second", "0.48")
    assert meter.answered({"text": "hi"}) is None
