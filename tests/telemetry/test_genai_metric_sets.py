"""A request's end records its metric points with attribute sets made once per distinct set."""

from __future__ import annotations

from llmgw.telemetry import genai
from llmgw.telemetry import semconv as sc

ATTRIBUTES = {sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "m"}


def test_the_sets_of_equal_attributes_are_made_once() -> None:
    first = genai._metric_sets(dict(ATTRIBUTES), None)
    assert genai._metric_sets(dict(ATTRIBUTES), None) is first
    assert genai._metric_sets(dict(ATTRIBUTES), "503") is not first
    assert genai._metric_sets({**ATTRIBUTES, sc.GEN_AI_REQUEST_MODEL: "n"}, None) is not first


def test_only_the_operations_end_carries_the_error_type() -> None:
    sets = genai._metric_sets(dict(ATTRIBUTES), "503")
    assert sets.answered.attributes == ATTRIBUTES
    assert sets.ended.attributes == {**ATTRIBUTES, sc.ERROR_TYPE: "503"}
    assert sets.input_tokens.attributes == {
        **ATTRIBUTES,
        sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_INPUT,
    }
    assert sets.output_tokens.attributes == {
        **ATTRIBUTES,
        sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_OUTPUT,
    }
    assert sets.cost.attributes == {sc.GEN_AI_REQUEST_MODEL: "m"}
    assert sets.ended.key == frozenset(sets.ended.attributes.items())


def test_the_sets_remembered_are_bounded() -> None:
    for model in range(genai._MAX_SETS + 1):
        genai._metric_sets({**ATTRIBUTES, sc.GEN_AI_REQUEST_MODEL: str(model)}, None)
    assert len(genai._SETS) <= genai._MAX_SETS
