"""Anthropic's usage in llmgw's convention: input counts every input token, cache reads and writes
included; a stream's later counts replace the earlier ones."""

from __future__ import annotations

from llmgw.accounting.messages_usage import MessagesUsage
from llmgw.accounting.usage import Usage, parse_usage

ANSWER_USAGE = {
    "input_tokens": 20,
    "output_tokens": 12,
    "cache_creation_input_tokens": 300,
    "cache_read_input_tokens": 1200,
    "cache_creation": {"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 100},
}


def test_input_is_every_input_token_and_the_hour_long_cache_writes_are_kept() -> None:
    assert MessagesUsage().merge(ANSWER_USAGE).usage() == Usage(
        input_tokens=1520,
        output_tokens=12,
        cache_read_input_tokens=1200,
        cache_creation_input_tokens=300,
        cache_creation_1h_input_tokens=100,
    )


def test_a_streams_counts_replace_the_earlier_ones_and_absent_ones_stay() -> None:
    usage = MessagesUsage().merge({**ANSWER_USAGE, "output_tokens": 1})
    usage.merge({"output_tokens": 40}).merge({"output_tokens": 41, "input_tokens": None})
    assert usage.usage() is not None
    assert (usage.usage().input_tokens, usage.usage().output_tokens) == (1520, 41)


def test_nothing_reported_is_no_usage() -> None:
    assert MessagesUsage().merge(None).usage() is None
    assert MessagesUsage().merge({"service_tier": "standard"}).usage() is None


def test_chat_usage_reads_back_as_the_same_usage() -> None:
    usage = MessagesUsage().merge(ANSWER_USAGE)
    assert parse_usage({"usage": usage.chat_usage()}, cost=None) == usage.usage()


def test_a_count_never_goes_down_but_a_value_that_is_no_count_is_taken() -> None:
    usage = MessagesUsage().merge(ANSWER_USAGE)
    usage.merge({"input_tokens": 1, "cache_read_input_tokens": 0, "output_tokens": 1})
    usage.merge({"cache_creation": {"ephemeral_1h_input_tokens": 5}})
    assert usage.usage() == MessagesUsage().merge(ANSWER_USAGE).usage()
    usage.merge({"output_tokens": -3})
    assert usage.usage() is not None and usage.usage().output_tokens == -3  # the charge flags it


def test_a_part_that_is_no_count_makes_the_input_none() -> None:
    usage = MessagesUsage().merge({**ANSWER_USAGE, "input_tokens": -1000}).usage()
    assert usage is not None and usage.input_tokens == -1000
    absurd = MessagesUsage().merge({**ANSWER_USAGE, "cache_read_input_tokens": 1e30}).usage()
    assert absurd is not None and absurd.input_tokens == absurd.cache_read_input_tokens == 2**63 - 1
