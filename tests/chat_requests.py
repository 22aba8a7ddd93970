"""What the tests of the translating adapters (Bedrock, Gemini) send as chat callers."""

from __future__ import annotations

import base64
from typing import Any

import attrs
from openai import AsyncStream
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionChunk

HELLO = [{"role": "user", "content": "hi"}]
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n fake image bytes").decode()
# A question about an image sent in the request (a data: URL), as chat callers send one.
ABOUT_AN_IMAGE = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ],
    }
]
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@attrs.define
class StreamRead:
    """A chat stream read to its end: each content delta, each finish reason, the last usage."""

    texts: list[str]
    finishes: list[str]
    usage: CompletionUsage | None


async def read_chat_stream(stream: AsyncStream[ChatCompletionChunk]) -> StreamRead:
    read = StreamRead([], [], None)
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                read.texts.append(choice.delta.content)
            if choice.finish_reason:
                read.finishes.append(choice.finish_reason)
        read.usage = chunk.usage or read.usage
    return read
