"""What a media call is billed by, read from its request (the most it can be, for admission) and
from its answer (what it was): images returned, seconds of audio transcribed, characters spoken."""

from __future__ import annotations

import io
import wave
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import attrs

from llmgw.accounting.price import Metered

__all__ = ["IMAGES", "SPEECH", "UPLOAD_BYTES_PER_SECOND", "Meter", "transcription_meter"]

# A transcription's audio in a compressed format has no length the gateway can read without a
# decoder; it is taken as 16 kbit/s, about the least speech is sent at (Opus and MP3 voice
# settings), so the estimate errs long rather than short.
UPLOAD_BYTES_PER_SECOND = 2_000


@attrs.frozen
class Meter:
    """``requested``: the quantity a request asks for at most; ``answered``: what the answer
    says it was (None: the answer does not say, and the request's quantity stands)."""

    requested: Callable[[dict[str, Any]], Metered]
    answered: Callable[[dict[str, Any]], Metered | None] = lambda _document: None


def _images_requested(body: dict[str, Any]) -> Metered:
    n = body.get("n")
    return Metered("image", n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1)


def _images_returned(document: dict[str, Any]) -> Metered | None:
    data = document.get("data")
    return Metered("image", len(data)) if isinstance(data, list) else None


def _characters(body: dict[str, Any]) -> Metered:
    text = body.get("input")
    return Metered("speech_char", len(text) if isinstance(text, str) else 0)


IMAGES = Meter(_images_requested, _images_returned)
SPEECH = Meter(_characters)


def _duration(document: dict[str, Any]) -> Metered | None:
    duration = document.get("duration")
    if isinstance(duration, int | float) and not isinstance(duration, bool) and duration >= 0:
        return Metered("audio_second", Decimal(str(duration)))
    return None


def upload_seconds(audio: bytes) -> Decimal:
    """The length of an uploaded audio file: exact for WAV, else estimated from its size (see
    UPLOAD_BYTES_PER_SECOND)."""
    try:
        with wave.open(io.BytesIO(audio)) as reader:
            frames, rate = reader.getnframes(), reader.getframerate()
    except (wave.Error, EOFError, ValueError):
        return Decimal(len(audio)) / UPLOAD_BYTES_PER_SECOND
    return Decimal(frames) / rate if rate else Decimal(0)


def transcription_meter(audio: bytes) -> Meter:
    """Seconds of audio: the answer's ``duration`` (JSON and verbose JSON answers carry it),
    else the upload's length."""
    seconds = Metered("audio_second", upload_seconds(audio))
    return Meter(lambda _fields: seconds, _duration)
