"""A whole Response and its stream, one made from the other (llmgw.cache.responses), and entries
in each form kept and read back (llmgw.cache.entry)."""

from __future__ import annotations

from typing import Any

import orjson

from llmgw.accounting.usage import Usage
from llmgw.cache.entry import Entry, decode_entry, encode_entry
from llmgw.cache.responses import response_completed, response_events, response_from_events
from llmgw.providers.sse import event_data

CITATION = {"type": "url_citation", "start_index": 0, "end_index": 5, "url": "https://x.test"}
RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "model": "gpt-5",
    "status": "completed",
    "output": [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [
                {"type": "summary_text", "text": "First,"},
                {"type": "summary_text", "text": " then."},
            ],
            "content": [{"type": "reasoning_text", "text": "4 + 6 = 10"}],
            "encrypted_content": "enc",
        },
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"query": "q"}},
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Hello", "annotations": [CITATION], "logprobs": []},
                {"type": "refusal", "refusal": "Not that."},
            ],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "add",
            "arguments": '{"a": 4}',
            "status": "completed",
        },
        {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_2", "name": "x", "input": "y"},
    ],
    "usage": {"input_tokens": 3, "output_tokens": 9, "total_tokens": 12},
}
USAGE = Usage(input_tokens=3, output_tokens=9, cost_usd=0.5)


def _documents(events: tuple[bytes, ...]) -> list[dict[str, Any]]:
    return [orjson.loads(event_data(event) or b"") for event in events]


def test_a_response_and_its_stream_are_the_same_response() -> None:
    events = response_events(RESPONSE)
    documents = _documents(events)
    assert [d["sequence_number"] for d in documents] == list(range(len(documents)))
    assert all(
        event.startswith(f"event: {d['type']}\n".encode())
        for event, d in zip(events, documents, strict=True)
    )
    assert response_from_events(events) == RESPONSE
    assert response_completed(events)

    def joined(kind: str) -> str:
        return "".join(d["delta"] for d in documents if d["type"] == kind)

    assert joined("response.reasoning_summary_text.delta") == "First, then."
    assert joined("response.reasoning_text.delta") == "4 + 6 = 10"
    assert joined("response.output_text.delta") == "Hello"
    assert joined("response.refusal.delta") == "Not that."
    assert joined("response.function_call_arguments.delta") == '{"a": 4}'
    assert joined("response.custom_tool_call_input.delta") == "y"
    added = [d["item"] for d in documents if d["type"] == "response.output_item.added"]
    assert added[0]["summary"] == added[0]["content"] == [] and added[2]["content"] == []
    # Nothing of it streamed: added whole, in progress.
    assert added[1] == {**RESPONSE["output"][1], "status": "in_progress"}
    (annotation,) = [d for d in documents if d["type"] == "response.output_text.annotation.added"]
    assert annotation["annotation"] == CITATION


def test_a_stream_whose_completion_leaves_the_output_out_takes_the_done_items() -> None:
    events = response_events(RESPONSE)
    last = orjson.loads(event_data(events[-1]) or b"")
    terse = {key: value for key, value in RESPONSE.items() if key != "output"}
    cut = (*events[:-1], b"data: " + orjson.dumps({**last, "response": terse}) + b"\n\n")
    assert response_from_events(cut) == RESPONSE


def test_only_a_stream_that_completed_is_complete() -> None:
    incomplete = {**RESPONSE, "status": "incomplete"}
    event = b"data: " + orjson.dumps({"type": "response.incomplete", "response": incomplete})
    assert not response_completed((*response_events(RESPONSE)[:-1], event + b"\n\n"))
    assert not response_completed(response_events(RESPONSE)[:-1])  # cut before its end


def test_an_entry_keeps_its_form_and_an_older_entry_is_read() -> None:
    body = orjson.dumps(RESPONSE)
    entry = Entry(stored_at=0, ttl=1, usage=USAGE, body=body, form="responses")
    assert decode_entry(encode_entry(entry)) == entry
    streamed = Entry(stored_at=0, ttl=1, usage=USAGE, events=entry.chunk_events(), form="responses")
    assert orjson.loads(streamed.json_body()) == RESPONSE
    document = orjson.loads(encode_entry(entry))
    del document["form"]
    for messages, form in ((True, "messages"), (False, "chat")):
        older = decode_entry(orjson.dumps({**document, "messages": messages}))
        assert older is not None and older.form == form
    assert decode_entry(orjson.dumps({**document, "form": "a later one"})) is None
