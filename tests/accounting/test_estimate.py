"""Token estimates and the worst case a reservation holds."""

from __future__ import annotations

from llmgw.accounting.estimate import (
    answer_output_chars,
    argument_chars,
    estimate_input_tokens,
    estimate_output_tokens,
    worst_case_output_tokens,
)


def test_input_is_the_serialized_prompt_over_four() -> None:
    body = {"messages": [{"role": "user", "content": "x" * 100}], "temperature": 1}
    assert estimate_input_tokens(body) == 33  # 130 bytes of JSON
    assert estimate_input_tokens({}) == 1
    assert estimate_output_tokens(9) == 3
    # A Messages body's system prompt is input too.
    assert estimate_input_tokens({"system": "x" * 400, "messages": []}) == 101


def test_worst_case_output_follows_the_request_then_the_model_then_the_default() -> None:
    assert worst_case_output_tokens({"max_tokens": 50}, model_max=10, default_max=20) == 50
    assert (
        worst_case_output_tokens(
            {"max_completion_tokens": 5, "max_tokens": 50, "n": 3}, model_max=None, default_max=20
        )
        == 15
    )
    assert worst_case_output_tokens({}, model_max=10, default_max=20) == 10
    assert worst_case_output_tokens({"max_tokens": True}, model_max=None, default_max=20) == 20


def test_tool_call_arguments_count_and_anything_else_does_not() -> None:
    calls = [
        {"function": {"name": "weather", "arguments": '{"city":"Oslo"}'}},
        {"function": {"arguments": 42}},  # not text
        "garbage",
        {"type": "function"},
        {"function": {"arguments": "éé"}},  # characters, not bytes
    ]
    assert argument_chars(calls) == len('{"city":"Oslo"}') + 2
    assert argument_chars(None) == 0
    assert argument_chars({"function": {"arguments": "x"}}) == 0


def test_a_whole_answer_counts_what_its_model_wrote_in_either_api() -> None:
    chat = {
        "choices": [
            {"message": {"content": "four", "tool_calls": [{"function": {"arguments": "{}"}}]}}
        ]
    }
    assert answer_output_chars(chat) == 6
    message = {
        "type": "message",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "not written by the model"},
            {"type": "text", "text": "four"},
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 4}},
            "garbage",
        ],
    }
    assert answer_output_chars(message) == 3 + 4 + len('{"a":4}')
    assert answer_output_chars({"content": [{"type": "text", "text": "x"}]}) == 0  # no message
