"""An incremental splitter of a byte stream into server-sent events, as the SSE spec frames them.

Lines end in LF, CRLF or a bare CR, and an event ends at a blank line. The scanner works on bytes and
returns each event as the exact bytes it arrived as (so the relay forwards them untouched), however
the reads split them: a CRLF cut between two reads, a multi-byte UTF-8 character cut in half. Every
byte is looked at once (``bytes.find`` from where the last read stopped), so an event that never
ends costs linear time until it is refused for its size.
"""

from __future__ import annotations

__all__ = ["DONE", "EventTooLarge", "SSEScanner", "event_data"]

DONE = b"[DONE]"  # the data of OpenAI's last event
_LF = 0x0A


class EventTooLarge(ValueError):
    """An event (complete or not) grew past the scanner's ``max_event_bytes``; ``events`` are the
    complete ones that came before it in the same read (the caller's still: a provider's read
    may carry the last deltas and the oversized event together). The scanner is spent."""

    def __init__(self, size: int, events: list[bytes]) -> None:
        super().__init__(size)
        self.events = events


class SSEScanner:
    __slots__ = ("_buffer", "_cr", "_lf", "_lf_after_cr", "_line_start", "_max_event_bytes")

    def __init__(self, max_event_bytes: int = 1 << 20) -> None:
        self._max_event_bytes = max_event_bytes
        self._buffer = bytearray()  # the unfinished event, from its first byte
        self._line_start = 0  # where the current (unfinished) line starts in the buffer
        # Next CR / LF at or after the scan position (-1: none in the buffer); searched once each.
        self._cr = -1
        self._lf = -1
        # The byte that follows a CR is an LF to skip (CRLF cut between two reads).
        self._lf_after_cr: int | None = None

    def feed(self, data: bytes) -> list[bytes]:
        """Complete events found so far, each with its blank line; the rest waits for more."""
        buffer = self._buffer
        scanned = len(buffer)
        buffer += data
        if self._cr < 0:
            self._cr = buffer.find(b"\r", scanned)
            if self._cr < 0 and self._lf_after_cr is None:
                return self._feed_lf_only(buffer, scanned)
        if self._lf < 0:
            self._lf = buffer.find(b"\n", scanned)
        events: list[bytes] = []
        event_start = 0
        line_start = self._line_start
        while True:
            if self._lf_after_cr is not None:
                if self._lf_after_cr >= len(buffer):
                    break  # the byte after a CR that ended the last read has not come yet
                if buffer[self._lf_after_cr] == _LF:  # the LF of a CRLF: not a line of its own
                    line_start += 1
                    self._lf = buffer.find(b"\n", line_start)
                self._lf_after_cr = None
            cr, lf = self._cr, self._lf
            if cr >= 0 and (lf < 0 or cr < lf):
                end = cr
                if cr + 1 == len(buffer):
                    line_end = cr + 1
                    self._lf_after_cr = line_end
                else:
                    line_end = cr + 2 if buffer[cr + 1] == _LF else cr + 1
                self._cr = buffer.find(b"\r", cr + 1)
                if line_end == cr + 2:
                    self._lf = buffer.find(b"\n", line_end)
            elif lf >= 0:
                end = lf
                line_end = lf + 1
                self._lf = buffer.find(b"\n", line_end)
            else:
                break
            if end == line_start:  # a blank line: the event so far is complete
                if line_end - event_start > self._max_event_bytes:
                    raise EventTooLarge(line_end - event_start, events)
                events.append(bytes(buffer[event_start:line_end]))
                event_start = line_end
            line_start = line_end
        if len(buffer) - event_start > self._max_event_bytes:
            raise EventTooLarge(len(buffer) - event_start, events)
        if event_start:
            del buffer[:event_start]
            line_start -= event_start
            if self._cr >= 0:
                self._cr -= event_start
            if self._lf >= 0:
                self._lf -= event_start
            if self._lf_after_cr is not None:
                self._lf_after_cr -= event_start
        self._line_start = line_start
        return events

    def _feed_lf_only(self, buffer: bytearray, scanned: int) -> list[bytes]:
        """``feed`` while no CR is in sight (the usual case): a blank line is an LF after an LF."""
        events: list[bytes] = []
        start = 0
        end = buffer.find(b"\n\n", max(scanned - 1, 0))
        while end >= 0:
            if end + 2 - start > self._max_event_bytes:
                raise EventTooLarge(end + 2 - start, events)
            events.append(bytes(buffer[start : end + 2]))
            start = end + 2
            end = buffer.find(b"\n\n", start)
        if len(buffer) - start > self._max_event_bytes:
            raise EventTooLarge(len(buffer) - start, events)
        last_lf = buffer.rfind(b"\n", max(scanned, start))
        del buffer[:start]
        # Keep the state ``feed`` needs should a CR come later: no LF after the current line start.
        self._line_start = last_lf + 1 - start if last_lf >= 0 else max(self._line_start - start, 0)
        self._lf = -1
        return events


def event_data(event: bytes) -> bytes | None:
    """The event's data (its ``data:`` lines joined by LF), or None when it has no data field.

    Comments and other fields (``event:``, ``id:``, ``retry:``) are skipped; ``data`` without a colon
    is an empty line of data, and one space after the colon is not part of the value.
    """
    if event.startswith(b"data: ") and event.count(b"\n") + event.count(b"\r") <= 2:
        return event[6:].rstrip(b"\r\n")  # the usual one-line event: no need to split
    lines: list[bytes] | None = None
    for line in event.splitlines():
        name, colon, value = line.partition(b":")
        if name != b"data":
            continue
        if colon and value.startswith(b" "):
            value = value[1:]
        if lines is None:
            lines = []
        lines.append(value)
    return None if lines is None else b"\n".join(lines)
