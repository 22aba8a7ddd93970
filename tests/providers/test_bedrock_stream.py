"""AWS's event stream read as it arrives (llmgw/providers/bedrock.py's _EventStream): frames split
anywhere between reads, frames that fail their CRC, and streams that end early."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import pytest

from llmgw.errors import UpstreamUnavailable
from llmgw.providers.bedrock import _ConverseAsMessages, _EventStream
from llmgw.translation.converse import ConverseEvents
from tests.fake_bedrock import event, exception_frame

FRAMES = [
    event("messageStart", {"role": "assistant"}),
    event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hel"}}),
    event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "lo"}}),
    event("contentBlockStop", {"contentBlockIndex": 0}),
    event("messageStop", {"stopReason": "end_turn"}),
    event("metadata", {"usage": {"inputTokens": 2, "outputTokens": 2, "totalTokens": 4}}),
]


class Upstream:
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.retries = 0
        self.content_type = "application/vnd.amazon.eventstream"
        self.closed = False

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        for piece in self.pieces:
            yield piece

    async def close(self) -> None:
        self.closed = True


def stream(pieces: list[bytes]) -> _EventStream:
    return _EventStream(Upstream(pieces), "bedrock", _ConverseAsMessages(ConverseEvents(model="m")))


async def read(events: _EventStream) -> list[bytes]:
    return [chunk async for chunk in events.chunks()]


@pytest.mark.parametrize("size", [1, 7, 64, 10_000])
async def test_frames_split_anywhere_are_relayed_whole_and_in_order(size: int) -> None:
    data = b"".join(FRAMES)
    relayed = b"".join(await read(stream([data[i : i + size] for i in range(0, len(data), size)])))
    names = [line for line in relayed.split(b"\n") if line.startswith(b"event: ")]
    assert names == [
        b"event: message_start",
        b"event: content_block_start",
        b"event: content_block_delta",
        b"event: content_block_delta",
        b"event: content_block_stop",
        b"event: message_delta",
        b"event: message_stop",
    ]


async def test_each_whole_frame_is_relayed_before_the_next_read() -> None:
    chunks = await read(stream(FRAMES))
    assert b'"text":"Hel"' in chunks[1] and b'"text":"lo"' not in chunks[1]


async def test_a_frame_that_fails_its_crc_breaks_the_stream() -> None:
    damaged = bytearray(FRAMES[1])
    damaged[-6] ^= 0xFF  # a payload byte: the message CRC no longer matches
    with pytest.raises(UpstreamUnavailable) as broken:
        await read(stream([FRAMES[0], bytes(damaged)]))
    assert broken.value.code == "upstream_stream_interrupted"


async def test_an_exception_frame_breaks_the_stream_naming_it() -> None:
    with pytest.raises(UpstreamUnavailable) as broken:
        await read(stream([*FRAMES[:2], exception_frame("modelStreamErrorException", "boom")]))
    assert broken.value.code == "upstream_stream_interrupted"
    assert "modelStreamErrorException: boom" in broken.value.message


async def test_a_stream_that_ends_before_its_stop_is_broken() -> None:
    with pytest.raises(UpstreamUnavailable) as broken:
        await read(stream(FRAMES[:3]))
    assert broken.value.code == "upstream_stream_interrupted"
