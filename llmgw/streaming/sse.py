"""An incremental splitter of a byte stream into server-sent events.

It works on bytes and splits only at blank lines (ASCII), so a multi-byte UTF-8 character cut across
two TCP reads is rejoined untouched, and nothing is decoded unless a caller asks for it.
"""

from __future__ import annotations

__all__ = ["DONE_EVENT", "SSEScanner", "event_data"]

DONE_EVENT = b"data: [DONE]\n\n"
_SEPARATOR = b"\n\n"


class SSEScanner:
    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Complete events (each ending in a blank line) found so far; the rest waits for more."""
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        buffer = self._buffer + data if self._buffer else data
        end = buffer.rfind(_SEPARATOR)
        if end < 0:
            self._buffer = buffer
            return []
        self._buffer = buffer[end + 2 :]
        return [event + _SEPARATOR for event in buffer[:end].split(_SEPARATOR) if event]


def event_data(event: bytes) -> bytes:
    """The payload of an event's ``data:`` lines, joined as the SSE spec says; comments dropped."""
    lines = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(lines)
