"""Anthropic Messages ⇄ OpenAI chat completions: pure functions, no I/O.

    messages_to_chat      a Messages request body  → a chat completions body
    message_from_chat     a chat completion         → a Messages ``message`` object
    error_body            a status and message      → Anthropic's error object

What has no chat equivalent is dropped, never refused (Claude Code sends many such fields):
``thinking``/``redacted_thinking`` blocks in history, server tools, ``cache_control`` on tools,
``container``, ``mcp_servers``, ``context_management`` and the like. ``thinking`` becomes the
chat ``reasoning_effort`` (bucketed from ``budget_tokens``), which the route sends only to a
deployment declared to take it (``Capabilities.reasoning``); images inside a ``tool_result`` move to
a user message after the tool messages, because chat tool messages carry text only.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from typing import Any, Final, TypeGuard

import orjson

from llmgw.accounting.usage import reported_usage
from llmgw.errors import InvalidRequest
from llmgw.translation.chat_answer import first_choice, tool_name

__all__ = [
    "error_body",
    "error_type",
    "is_one_of",
    "message_from_chat",
    "messages_to_chat",
    "new_message_id",
    "new_tool_use_id",
    "stop_reason",
    "tool_input",
    "usage_fields",
    "validate_count_tokens_request",
    "validate_messages_request",
]

# Budget tokens at or below which thinking is asked for with the given effort; above: "high".
_EFFORT_BUDGETS: Final = ((2048, "low"), (8192, "medium"))
_EFFORTS: Final = frozenset({"low", "medium", "high"})
_MEDIA_TYPES: Final = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_STOP_REASONS: Final = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def new_message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def new_tool_use_id() -> str:
    return "toolu_" + secrets.token_hex(12)


# ---------------------------------------------------------------------------------------------
# Validation of what the gateway itself reads


def _require_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("model: must be a non-empty string.", param="model")
    return model


def _require_messages(body: dict[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: must be a non-empty list.", param="messages")
    return messages


def validate_messages_request(body: dict[str, Any]) -> tuple[str, bool]:
    """(model, stream) of a ``POST /v1/messages`` body; the rest is checked by ``messages_to_chat``."""
    model = _require_model(body)
    _require_messages(body)
    max_tokens = body.get("max_tokens")
    if not _is_int(max_tokens) or max_tokens < 0:
        raise InvalidRequest("max_tokens: must be a non-negative integer.", param="max_tokens")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("stream: must be true or false.", param="stream")
    return model, stream is True


def validate_count_tokens_request(body: dict[str, Any]) -> str:
    """The model of a ``POST /v1/messages/count_tokens`` body (which has no ``max_tokens``)."""
    _require_messages(body)
    return _require_model(body)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_one_of(value: Any, allowed: AbstractSet[str]) -> TypeGuard[str]:
    """``value`` is one of the strings ``allowed`` (a list or an object is not, and is not hashed)."""
    return isinstance(value, str) and value in allowed


# ---------------------------------------------------------------------------------------------
# Request: Messages → chat completions


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A chat completions body asking for what ``body`` asks; InvalidRequest names a bad field."""
    chat: dict[str, Any] = {"model": body.get("model")}
    messages = list(_system_messages(body.get("system")))
    for index, message in enumerate(_require_messages(body)):
        messages.extend(_chat_messages(message, f"messages[{index}]"))
    chat["messages"] = messages
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        chat.update(_tool_choice(body.get("tool_choice")))
    max_tokens = body.get("max_tokens")
    if _is_int(max_tokens):
        # Venice ignores max_tokens when max_completion_tokens is set; OpenAI deprecated it.
        chat["max_completion_tokens"] = max_tokens
    stop = body.get("stop_sequences")
    if isinstance(stop, list) and stop:
        chat["stop"] = [_string(item, "stop_sequences[]") for item in stop]
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    effort = _reasoning_effort(body.get("thinking"), body.get("output_config"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    response_format = _response_format(body.get("output_config"))
    if response_format is not None:
        chat["response_format"] = response_format
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}: must be a string.", param=where)
    return value


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A content value as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: must be a string or a list of blocks.", param=where)
    for index, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidRequest(
                f"{where}[{index}]: must be an object with a type.", param=f"{where}[{index}]"
            )
    return content


def _text_part(block: dict[str, Any], where: str) -> dict[str, Any] | None:
    """A text block as a chat text part, or None when empty (Venice refuses empty text)."""
    text = _string(block.get("text"), f"{where}.text")
    if not text:
        return None
    part: dict[str, Any] = {"type": "text", "text": text}
    if isinstance(block.get("cache_control"), dict):
        part["cache_control"] = block["cache_control"]
    return part


def _system_messages(system: Any, where: str = "system") -> Iterator[dict[str, Any]]:
    if system is None:
        return
    if isinstance(system, str):
        if system:
            yield {"role": "system", "content": system}
        return
    parts = []
    for index, block in enumerate(_blocks(system, where)):
        if block["type"] != "text":
            raise InvalidRequest(f"{where}[{index}]: must be a text block.", param=where)
        part = _text_part(block, f"{where}[{index}]")
        if part is not None:
            parts.append(part)
    if parts:
        yield {"role": "system", "content": parts}


def _chat_messages(message: Any, where: str) -> Iterator[dict[str, Any]]:
    if not isinstance(message, dict):
        raise InvalidRequest(f"{where}: must be an object.", param=where)
    role = message.get("role")
    content = message.get("content")
    if role == "system":
        # Claude Code's mid-conversation system messages (beta mid-conversation-system-2026-04-07).
        yield from _system_messages(content, f"{where}.content")
        return
    if role in ("user", "assistant") and isinstance(content, str):
        yield {"role": role, "content": content}  # a plain string stays one, as chat has it
        return
    blocks = _blocks(content, f"{where}.content")
    if role == "user":
        yield from _user_messages(blocks, f"{where}.content")
    elif role == "assistant":
        assistant = _assistant_message(blocks, f"{where}.content")
        if assistant is not None:
            yield assistant
    else:
        raise InvalidRequest(
            f"{where}.role: must be 'user', 'assistant' or 'system'.", param=f"{where}.role"
        )


def _user_messages(blocks: list[dict[str, Any]], where: str) -> Iterator[dict[str, Any]]:
    """Tool results first (chat wants them right after the calls), then the rest as one message."""
    parts: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        at = f"{where}[{index}]"
        if block["type"] == "tool_result":
            text, images = _tool_result(block, at)
            yield {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}
            parts.extend(images)
        else:
            part = _user_part(block, at)
            if part is not None:
                parts.append(part)
    if parts:
        yield {"role": "user", "content": parts}


def _user_part(block: dict[str, Any], where: str) -> dict[str, Any] | None:
    kind = block["type"]
    if kind == "text":
        return _text_part(block, where)
    if kind == "image":
        return _image_part(block, where)
    if kind == "document":
        return _document_part(block, where)
    return None  # thinking, server-tool results and newer blocks have no chat equivalent


def _source(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise InvalidRequest(f"{where}.source: must be an object.", param=f"{where}.source")
    return source


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = _source(block, where)
    if source.get("type") == "url":
        url = _string(source.get("url"), f"{where}.source.url")
    elif source.get("type") == "base64":
        media_type = source.get("media_type")
        if not is_one_of(media_type, _MEDIA_TYPES):
            raise InvalidRequest(
                f"{where}.source.media_type: must be one of {', '.join(sorted(_MEDIA_TYPES))}.",
                param=f"{where}.source.media_type",
            )
        url = f"data:{media_type};base64,{_string(source.get('data'), f'{where}.source.data')}"
    else:
        raise InvalidRequest(
            f"{where}.source.type: must be 'base64' or 'url'.", param=f"{where}.source.type"
        )
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
    if isinstance(block.get("cache_control"), dict):
        part["cache_control"] = block["cache_control"]
    return part


def _document_part(block: dict[str, Any], where: str) -> dict[str, Any] | None:
    """A PDF as a chat file part, plain text as a text part; other sources are dropped."""
    source = _source(block, where)
    kind = source.get("type")
    if kind == "text":
        text = _string(source.get("data"), f"{where}.source.data")
        return {"type": "text", "text": text} if text else None
    if kind == "base64":
        media_type = _string(source.get("media_type"), f"{where}.source.media_type")
        data = _string(source.get("data"), f"{where}.source.data")
        file: dict[str, Any] = {"file_data": f"data:{media_type};base64,{data}"}
        if isinstance(block.get("title"), str):
            file["filename"] = block["title"]
        return {"type": "file", "file": file}
    return None


def _tool_result(block: dict[str, Any], where: str) -> tuple[str, list[dict[str, Any]]]:
    """The tool message's text (chat tool content is text only) and the images it carried."""
    _string(block.get("tool_use_id"), f"{where}.tool_use_id")
    content = block.get("content")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    if content is not None:
        for index, inner in enumerate(_blocks(content, f"{where}.content")):
            at = f"{where}.content[{index}]"
            if inner["type"] == "text":
                texts.append(_string(inner.get("text"), f"{at}.text"))
            elif inner["type"] == "image":
                images.append(_image_part(inner, at))
    text = "\n".join(texts)
    if block.get("is_error") is True:
        text = f"Error: {text}" if text else "Error"
    return text, images


def _assistant_message(blocks: list[dict[str, Any]], where: str) -> dict[str, Any] | None:
    """Text joined, every tool_use as one of the message's tool calls; thinking is dropped."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        at = f"{where}[{index}]"
        if block["type"] == "text":
            texts.append(_string(block.get("text"), f"{at}.text"))
        elif block["type"] == "tool_use":
            arguments = block.get("input", {})
            calls.append(
                {
                    "id": _string(block.get("id"), f"{at}.id"),
                    "type": "function",
                    "function": {
                        "name": _string(block.get("name"), f"{at}.name"),
                        "arguments": orjson.dumps(arguments).decode(),
                    },
                }
            )
    text = "".join(texts)
    if not text and not calls:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Client tools as functions; server tools (web search, bash, …) have no chat form: dropped."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("tools: must be a list.", param="tools")
    functions = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"{where}: must be an object.", param=where)
        if tool.get("type") not in (None, "custom"):
            continue
        function: dict[str, Any] = {"name": _string(tool.get("name"), f"{where}.name")}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise InvalidRequest(
                f"{where}.input_schema: must be an object.", param=f"{where}.input_schema"
            )
        # Only the schema itself: merging the tool's other fields into it breaks providers.
        function["parameters"] = schema
        if isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: Any) -> dict[str, Any]:
    if not isinstance(choice, dict):
        return {}
    kind = choice.get("type")
    fields: dict[str, Any] = {}
    if kind == "auto":
        fields["tool_choice"] = "auto"
    elif kind == "any":
        fields["tool_choice"] = "required"
    elif kind == "none":
        fields["tool_choice"] = "none"
    elif kind == "tool":
        name = _string(choice.get("name"), "tool_choice.name")
        fields["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise InvalidRequest(
            "tool_choice.type: must be 'auto', 'any', 'tool' or 'none'.", param="tool_choice.type"
        )
    if choice.get("disable_parallel_tool_use") is True:
        fields["parallel_tool_calls"] = False
    return fields


def _reasoning_effort(thinking: Any, output_config: Any) -> str | None:
    """Chat's reasoning_effort for Anthropic's thinking; lossy: a budget becomes a bucket."""
    if not isinstance(thinking, dict):
        return None
    kind = thinking.get("type")
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if not _is_int(budget):
            return "medium"
        return next((effort for limit, effort in _EFFORT_BUDGETS if budget <= limit), "high")
    if kind == "adaptive":
        effort = output_config.get("effort") if isinstance(output_config, dict) else None
        return effort if is_one_of(effort, _EFFORTS) else "medium"
    return None  # disabled: the model's own default


def _response_format(output_config: Any) -> dict[str, Any] | None:
    if not isinstance(output_config, dict):
        return None
    output_format = output_config.get("format")
    if not isinstance(output_format, dict) or not isinstance(output_format.get("schema"), dict):
        return None
    return {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": output_format["schema"], "strict": True},
    }


# ---------------------------------------------------------------------------------------------
# Response: chat completion → Message


def stop_reason(finish_reason: Any) -> str:
    """Anthropic's stop_reason for a chat finish_reason (never null: end_turn by default)."""
    if isinstance(finish_reason, str):
        return _STOP_REASONS.get(finish_reason, "end_turn")
    return "end_turn"


def usage_fields(document: dict[str, Any]) -> dict[str, int] | None:
    """Anthropic's usage from a chat document's: input excludes cache reads and writes.

    A count that is no count (negative, fractional, absurd) is unreported: 0 in its field, and
    None (as if no usage came) when neither input nor output was reported.
    """
    usage = reported_usage(document)
    if usage is None:
        return None
    cache_read = usage.cache_read_input_tokens or 0
    cache_creation = usage.cache_creation_input_tokens or 0
    return {
        "input_tokens": max(0, (usage.input_tokens or 0) - cache_read - cache_creation),
        "output_tokens": usage.output_tokens or 0,
        "cache_creation_input_tokens": cache_creation,
        "cache_read_input_tokens": cache_read,
    }


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as the tool_use input object ({} when they are not one)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = orjson.loads(arguments) if isinstance(arguments, str | bytes) else None
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _matched_stop_sequence(choice: dict[str, Any], request: dict[str, Any]) -> str | None:
    # vLLM-style backends name the stop string that ended generation in choice.stop_reason.
    matched = choice.get("stop_reason")
    sequences = request.get("stop_sequences")
    if isinstance(matched, str) and isinstance(sequences, list) and matched in sequences:
        return matched
    return None


def message_from_chat(
    completion: dict[str, Any],
    *,
    request: dict[str, Any],
    message_id: str,
    new_tool_id: Callable[[], str] = new_tool_use_id,
) -> dict[str, Any]:
    """The Messages answer for a non-streamed chat completion of ``request``."""
    choice, message = first_choice(completion)
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        # The provider gives no signature; "" tells Anthropic-aware clients there is none.
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        call_id = call.get("id")
        content.append(
            {
                "type": "tool_use",
                "id": call_id if isinstance(call_id, str) and call_id else new_tool_id(),
                "name": tool_name(function.get("name")),
                "input": tool_input(function.get("arguments")),
            }
        )
    reason = stop_reason(choice.get("finish_reason"))
    sequence = _matched_stop_sequence(choice, request) if reason == "end_turn" else None
    if any(block["type"] == "tool_use" for block in content):
        reason = "tool_use"  # some backends end tool calls with "stop"
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": request.get("model"),
        "content": content,
        "stop_reason": "stop_sequence" if sequence is not None else reason,
        "stop_sequence": sequence,
        "usage": usage_fields(completion) or _no_usage(),
    }


def _no_usage() -> dict[str, int]:
    return {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


# ---------------------------------------------------------------------------------------------
# Errors


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}
