"""A whole OpenAI Response and its stream, one made from the other: what replays a cached answer
of a provider that serves Responses itself (a native ``/v1/responses``) in the form a later request
asks for.

A stream's Response is its ``response.completed`` event's, which carries the whole of it; its
items, as each ``response.output_item.done`` had them, only when that event leaves the output out
(as the SDK's accumulator does). A Response's stream opens each output item empty and fills it as
a provider does: each text, refusal, reasoning summary and reasoning text by one delta, a function
call's arguments and a custom tool's input by one delta; an item with nothing streamed (a web
search, an image) is added whole, in progress. Every item is sent whole again when it is done, and
the Response whole at ``response.completed``: nothing is lost either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import orjson

from llmgw.providers.sse import event_data
from llmgw.translation.responses_stream import response_event

__all__ = ["response_completed", "response_events", "response_from_events"]

# What each streamed part's delta carries: its text field, and the events that fill and close it.
_PARTS = {
    "output_text": ("text", "response.output_text"),
    "refusal": ("refusal", "response.refusal"),
    "reasoning_text": ("text", "response.reasoning_text"),
}
_SUMMARY = ("text", "response.reasoning_summary_text")
# An item whose one string is streamed: that field, and its events.
_STREAMED_ITEMS = {
    "function_call": ("arguments", "response.function_call_arguments"),
    "custom_tool_call": ("input", "response.custom_tool_call_input"),
}


def response_events(response: dict[str, Any]) -> tuple[bytes, ...]:
    """The events of the stream that makes ``response`` (a completed one: only those are stored),
    ``response.created`` to ``response.completed``, numbered from 0."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(response.get("output") or ()):
        if isinstance(item, dict):
            events.extend(_item_events(index, item))
    events.append({"type": "response.completed", "response": response})
    return tuple(
        response_event(event["type"], {**event, "sequence_number": number})
        for number, event in enumerate(events)
    )


def _item_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    kind = item.get("type")
    where = {"item_id": item.get("id"), "output_index": index}
    opened = dict(item)
    if "status" in item:
        opened["status"] = "in_progress"
    inner: list[dict[str, Any]] = []
    if kind in ("message", "reasoning"):
        for field in ("summary", "content"):
            parts = item.get(field)
            if isinstance(parts, list):
                opened[field] = []
                inner.extend(_parts_events(field, parts, where))
    elif kind in _STREAMED_ITEMS and isinstance(item.get(_STREAMED_ITEMS[kind][0]), str):
        field, prefix = _STREAMED_ITEMS[kind]
        value = item[field]
        opened[field] = ""
        if value:
            inner.append({"type": f"{prefix}.delta", **where, "delta": value})
        done = {"type": f"{prefix}.done", **where, field: value}
        if kind == "function_call":
            done["name"] = item.get("name")
        inner.append(done)
    yield {"type": "response.output_item.added", "output_index": index, "item": opened}
    yield from inner
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def _parts_events(field: str, parts: list[Any], where: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A message's content parts, or a reasoning item's summary or content parts: each added
    empty, filled by one delta, and done whole."""
    summary = field == "summary"
    position = "summary_index" if summary else "content_index"
    added, done = (
        ("response.reasoning_summary_part.added", "response.reasoning_summary_part.done")
        if summary
        else ("response.content_part.added", "response.content_part.done")
    )
    for number, part in enumerate(parts):
        if not isinstance(part, dict):
            continue
        at = {**where, position: number}
        streamed = _SUMMARY if summary else _PARTS.get(str(part.get("type")))
        if streamed is None or not isinstance(part.get(streamed[0]), str):
            yield {"type": added, **at, "part": part}  # nothing to stream: whole at once
        else:
            yield {"type": added, **at, "part": _emptied(part, streamed[0])}
            yield from _text_events(part, at, *streamed)
        yield {"type": done, **at, "part": part}


def _emptied(part: dict[str, Any], field: str) -> dict[str, Any]:
    emptied = {**part, field: ""}
    if isinstance(part.get("annotations"), list):
        emptied["annotations"] = []
    return emptied


def _text_events(
    part: dict[str, Any], at: dict[str, Any], field: str, prefix: str
) -> Iterator[dict[str, Any]]:
    value = part[field]
    # An output text's delta and done carry its logprobs (the SDK's types require them).
    logprobs = {"logprobs": part.get("logprobs") or []} if part.get("type") == "output_text" else {}
    if value:
        yield {"type": f"{prefix}.delta", **at, "delta": value, **logprobs}
    annotations = part.get("annotations")
    for number, annotation in enumerate(annotations if isinstance(annotations, list) else ()):
        yield {
            "type": "response.output_text.annotation.added",
            **at,
            "annotation_index": number,
            "annotation": annotation,
        }
    yield {"type": f"{prefix}.done", **at, field: value, **logprobs}


def response_from_events(events: Sequence[bytes]) -> dict[str, Any]:
    """The Response a stream's events make: the last one a lifecycle event carries (a complete
    stream's: ``response.completed``'s), with the done items as its output when it has none."""
    response = _last_response(events)
    if response.get("output") is None:
        done = {
            document["output_index"]: document.get("item")
            for document in _documents(events)
            if document.get("type") == "response.output_item.done"
            and isinstance(document.get("output_index"), int)
        }
        response = {**response, "output": [done[index] for index in sorted(done)]}
    return response


def response_completed(events: Sequence[bytes]) -> bool:
    """Whether a stream ended with its Response completed (not incomplete or failed)."""
    return bool(_last_response(events).get("status") == "completed")


def _last_response(events: Sequence[bytes]) -> dict[str, Any]:
    """The Response the last lifecycle event carries: read from the end, the rest not decoded."""
    for document in _documents(reversed(events)):
        response = document.get("response")
        if isinstance(response, dict):
            return response
    return {}


def _documents(events: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    for event in events:
        data = event_data(event)
        document = orjson.loads(data) if data else None
        if isinstance(document, dict):
            yield document
