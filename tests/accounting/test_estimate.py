"""Token estimates and the worst case a reservation holds."""

from __future__ import annotations

from llmgw.accounting.estimate import (
    estimate_input_tokens,
    estimate_output_tokens,
    worst_case_output_tokens,
)


def test_input_is_the_serialized_prompt_over_four() -> None:
    body = {"messages": [{"role": "user", "content": "x" * 100}], "temperature": 1}
    assert estimate_input_tokens(body) == 33  # 130 bytes of JSON
    assert estimate_input_tokens({}) == 1
    assert estimate_output_tokens(9) == 3


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
