"""The SSE scanner: events as the spec frames them, the exact bytes back, linear time."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.providers.sse import EventTooLarge, SSEScanner, event_data
from tests.streaming.relaying import parse_sse

ENDINGS = st.sampled_from([b"\n", b"\r\n", b"\r"])
VALUES = st.binary(max_size=12).map(lambda value: value.replace(b"\r", b"").replace(b"\n", b""))


@st.composite
def event_streams(draw: st.DrawFn) -> bytes:
    """Events of data, comment, other-field and bare-name lines, any line endings, blank runs."""
    events = []
    for _ in range(draw(st.integers(0, 6))):
        lines = []
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from([b"data: ", b"data:", b"data", b": ", b"event: ", b"id:"]))
            lines.append(kind + (b"" if kind == b"data" else draw(VALUES)) + draw(ENDINGS))
        events.append(b"".join(lines) + draw(ENDINGS) * draw(st.integers(1, 2)))
    return b"".join(events) + draw(st.sampled_from([b"", b"data: unfinished"]))


def feed_in_pieces(data: bytes, cuts: list[int]) -> tuple[list[bytes], SSEScanner]:
    scanner = SSEScanner()
    bounds = [0, *sorted({cut % (len(data) + 1) for cut in cuts}), len(data)]
    events = [
        event
        for start, end in itertools.pairwise(bounds)
        for event in scanner.feed(data[start:end])
    ]
    return events, scanner


@given(stream=event_streams(), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_events_are_the_specs_and_their_bytes_are_the_input_however_it_is_split(
    stream: bytes, cuts: list[int]
) -> None:
    events, _ = feed_in_pieces(stream, cuts)
    whole = b"".join(events)
    assert stream.startswith(whole), "the events are the input's bytes, in order"
    assert parse_sse(stream[len(whole) :]) == [], "no complete event is held back"
    data = [value for value in map(event_data, events) if value is not None]
    assert data == parse_sse(stream)


@pytest.mark.parametrize("cut", range(1, len(b'data: {"a":1}\r\n\r\n')))
def test_a_crlf_cut_between_two_reads_is_one_line_ending(cut: int) -> None:
    stream = b'data: {"a":1}\r\n\r\ndata: [DONE]\r\n\r\n'
    events, _ = feed_in_pieces(stream, [cut])
    assert b"".join(events) == stream
    assert [event_data(event) for event in events] == [b'{"a":1}', b"[DONE]"]


def test_a_cr_at_the_end_of_a_read_ends_the_event_at_once() -> None:
    scanner = SSEScanner()
    assert scanner.feed(b"data: x\r\r") == [b"data: x\r\r"]
    assert scanner.feed(b"data: y\r\n\r") == [b"data: y\r\n\r"]
    assert scanner.feed(b"\ndata: z\n\n") == [b"\ndata: z\n\n"]  # that LF ended the CRLF


def test_event_data_follows_the_field_rules() -> None:
    assert event_data(b"data: a\ndata:b\ndata\ndata:  c\n\n") == b"a\nb\n\n c"
    assert event_data(b": comment\nevent: x\nid: 1\n\n") is None
    assert event_data(b"data:[DONE]\r\r") == b"[DONE]"
    assert event_data(b"\ndata: z\n\n") == b"z"


def test_an_event_over_the_limit_is_refused_complete_or_not() -> None:
    with pytest.raises(EventTooLarge):
        SSEScanner(max_event_bytes=16).feed(b"data: " + b"x" * 20 + b"\n\n")
    scanner = SSEScanner(max_event_bytes=16)
    assert scanner.feed(b"data: xxxxx") == []
    with pytest.raises(EventTooLarge):
        scanner.feed(b"x" * 10)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_the_events_before_one_over_the_limit_in_the_same_read_are_given_with_it(
    newline: bytes,
) -> None:
    first, second = b"data: a" + newline * 2, b"data: b" + newline * 2
    with pytest.raises(EventTooLarge) as complete:
        SSEScanner(max_event_bytes=16).feed(first + second + b"data: " + b"x" * 20 + newline * 2)
    with pytest.raises(EventTooLarge) as endless:
        SSEScanner(max_event_bytes=16).feed(first + b"data: " + b"x" * 20)
    assert (complete.value.events, endless.value.events) == ([first, second], [first])


def test_an_endless_event_costs_linear_time() -> None:
    """32 MiB without a line ending in 64 KiB reads: each byte is searched once, not per read."""
    scanner = SSEScanner(max_event_bytes=64 << 20)
    piece = b"x" * 65536
    started = time.process_time()
    scanner.feed(b"data: ")
    for _ in range(512):
        assert scanner.feed(piece) == []
    assert scanner.feed(b"\n\n")[0].endswith(b"xx\n\n")
    assert time.process_time() - started < 1.5
