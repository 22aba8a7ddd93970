"""OpenAI chat completions → Anthropic Messages: a chat request as the Messages request an Anthropic
upstream is sent (the inverse of ``anthropic.messages_to_chat``). Pure functions, no I/O.

What Messages has no field for is dropped, not refused, like the other translations: ``n``,
``logprobs``, ``seed``, ``presence_penalty``/``frequency_penalty``, ``response_format``,
``reasoning_content`` replayed in history (a thinking block needs the signature chat never had).
"""

from __future__ import annotations

from typing import Any, Final

from llmgw.errors import InvalidRequest
from llmgw.translation.anthropic import is_one_of, tool_input

__all__ = ["DEFAULT_MAX_TOKENS", "THINKING_BUDGETS", "chat_to_messages", "trims_prefill"]

# Messages requires max_tokens; chat does not. 4096 is what every Claude model can produce.
DEFAULT_MAX_TOKENS: Final = 4096
# The thinking budget each reasoning_effort asks for: the top of the bucket that
# anthropic.messages_to_chat maps back to the same effort (a budget of 2048 is "low" there).
THINKING_BUDGETS: Final = {"low": 2048, "medium": 8192, "high": 16384}
_DATA_URL_PREFIX: Final = "data:"


def chat_to_messages(body: dict[str, Any]) -> dict[str, Any]:
    """The Messages request asking what the chat request ``body`` asks; InvalidRequest names a
    chat field Messages cannot carry in the shape given."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: must be a list.", param="messages")
    system, turns = _turns(messages)
    request: dict[str, Any] = {"model": body.get("model")}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    request["max_tokens"] = max_tokens if _is_count(max_tokens) else DEFAULT_MAX_TOKENS
    if system is not None:
        request["system"] = system
    request["messages"] = turns
    stop = body.get("stop")
    if isinstance(stop, str):
        request["stop_sequences"] = [stop]
    elif isinstance(stop, list) and stop:
        request["stop_sequences"] = stop
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            request[name] = body[name]
    if isinstance(body.get("user"), str):
        request["metadata"] = {"user_id": body["user"]}
    tools = _tools(body.get("tools"))
    if tools:
        request["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
        if choice is not None:
            request["tool_choice"] = choice
    _thinking(body, request)
    if body.get("stream") is True:
        request["stream"] = True
    return request


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _thinking(body: dict[str, Any], request: dict[str, Any]) -> None:
    """``reasoning_effort`` (or Responses' ``reasoning.effort``) as a thinking budget. Thinking
    counts against max_tokens, which must exceed the budget: the answer keeps the room asked for."""
    effort = body.get("reasoning_effort")
    reasoning = body.get("reasoning")
    if effort is None and isinstance(reasoning, dict):
        effort = reasoning.get("effort")
    if not is_one_of(effort, THINKING_BUDGETS.keys()):
        return  # none/minimal (or absent): the model does not think
    budget = THINKING_BUDGETS[effort]
    request["thinking"] = {"type": "enabled", "budget_tokens": budget}
    if request["max_tokens"] <= budget:
        request["max_tokens"] += budget


def _turns(messages: list[Any]) -> tuple[str | list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """The system prompt (system and developer messages, wherever they are) and the turns."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"{where}: must be an object.", param=where)
        role = message.get("role")
        if role in ("system", "developer"):
            system.extend(_text_blocks(message.get("content"), f"{where}.content"))
        elif role == "user":
            _append(turns, "user", _user_content(message.get("content"), f"{where}.content"))
        elif role == "assistant":
            _append(turns, "assistant", _assistant_content(message, where))
        elif role == "tool":
            _append(turns, "user", [_tool_result(message, where)])
        else:
            raise InvalidRequest(
                f"{where}.role: must be 'system', 'developer', 'user', 'assistant' or 'tool'.",
                param=f"{where}.role",
            )
    if turns and turns[-1]["role"] == "assistant":
        _trim_prefill(turns[-1])
    if not system:
        return None, turns
    if len(system) == 1 and set(system[0]) == {"type", "text"}:
        return system[0]["text"], turns  # one plain prompt stays a string, as it came
    return system, turns


def _append(turns: list[dict[str, Any]], role: str, content: str | list[dict[str, Any]]) -> None:
    """Tool results go in the user turn right after the calls: consecutive tool messages, and a
    user message after them, become one turn. Other turns stay as they came (Anthropic reads two
    turns of one role as one)."""
    if not content:
        return  # Anthropic refuses empty content
    previous = turns[-1] if turns else None
    if previous is not None and role == "user" and _ends_with_tool_result(previous):
        previous["content"] = previous["content"] + _as_blocks(content)
        return
    turns.append({"role": role, "content": content})


def _ends_with_tool_result(turn: dict[str, Any]) -> bool:
    content = turn["content"]
    return (
        turn["role"] == "user"
        and isinstance(content, list)
        and content[-1].get("type") == "tool_result"
    )


def _as_blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _trim_prefill(turn: dict[str, Any]) -> None:
    """A trailing assistant turn is continued (a prefill), and Anthropic refuses one that ends in
    whitespace (shared/provider-failures.md F3)."""
    content = turn["content"]
    if isinstance(content, str):
        turn["content"] = content.rstrip()
    elif content and content[-1].get("type") == "text":
        content[-1] = {**content[-1], "text": content[-1]["text"].rstrip()}


def trims_prefill(body: dict[str, Any]) -> bool:
    """Whether the chat request ends with an assistant text that ends in whitespace, which the
    Messages request is sent without (see _trim_prefill)."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return False
    content = last.get("content")
    if isinstance(content, list) and content and isinstance(content[-1], dict):
        content = content[-1].get("text")
    return isinstance(content, str) and content != content.rstrip()


def _text_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: must be a string or a list of parts.", param=where)
    blocks = []
    for index, part in enumerate(content):
        block = _part(part, f"{where}[{index}]")
        if block is not None and block["type"] == "text":
            blocks.append(block)
    return blocks


def _user_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: must be a string or a list of parts.", param=where)
    blocks = [_part(part, f"{where}[{index}]") for index, part in enumerate(content)]
    return [block for block in blocks if block is not None]


def _part(part: Any, where: str) -> dict[str, Any] | None:
    """A chat content part as a Messages block; None for what Messages cannot take (audio)."""
    if not isinstance(part, dict):
        raise InvalidRequest(f"{where}: must be an object.", param=where)
    kind = part.get("type")
    block: dict[str, Any]
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequest(f"{where}.text: must be a string.", param=f"{where}.text")
        if not text:
            return None
        block = {"type": "text", "text": text}
    elif kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise InvalidRequest(f"{where}.image_url.url: must be a string.", param=where)
        block = {"type": "image", "source": _source(url)}
    elif kind == "file":
        file = part.get("file")
        data = file.get("file_data") if isinstance(file, dict) else None
        if not isinstance(data, str) or not data.startswith(_DATA_URL_PREFIX):
            return None  # a file id names an upload Anthropic never saw
        block = {"type": "document", "source": _source(data)}
        if isinstance(file, dict) and isinstance(file.get("filename"), str):
            block["title"] = file["filename"]
    else:
        return None
    if isinstance(part.get("cache_control"), dict):
        block["cache_control"] = part["cache_control"]
    return block


def _source(url: str) -> dict[str, Any]:
    """A data URL as a base64 source, anything else as a URL source."""
    if url.startswith(_DATA_URL_PREFIX):
        media_type, marker, data = url[len(_DATA_URL_PREFIX) :].partition(";base64,")
        if marker:
            return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


def _assistant_content(message: dict[str, Any], where: str) -> str | list[dict[str, Any]]:
    content = message.get("content")
    calls = message.get("tool_calls")
    if isinstance(content, str) and not calls:
        return content
    blocks = [] if content is None else _text_blocks(content, f"{where}.content")
    if calls is None:
        return blocks
    if not isinstance(calls, list):
        raise InvalidRequest(f"{where}.tool_calls: must be a list.", param=f"{where}.tool_calls")
    for index, call in enumerate(calls):
        at = f"{where}.tool_calls[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"{at}.function.name: must be a string.", param=at)
        if not isinstance(call.get("id"), str):
            raise InvalidRequest(f"{at}.id: must be a string.", param=f"{at}.id")
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": function["name"],
                "input": tool_input(function.get("arguments")),
            }
        )
    return blocks


def _tool_result(message: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str):
        raise InvalidRequest(f"{where}.tool_call_id: must be a string.", param=where)
    content = message.get("content")
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
    if isinstance(content, str):
        if content:
            result["content"] = content
    elif content is not None:
        result["content"] = _text_blocks(content, f"{where}.content")
    return result


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("tools: must be a list.", param="tools")
    converted = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            continue  # chat's custom tools have no Messages form
        if not isinstance(function.get("name"), str):
            raise InvalidRequest(f"{where}.function.name: must be a string.", param=where)
        parameters = function.get("parameters")
        entry: dict[str, Any] = {
            "name": function["name"],
            # Messages requires a schema; chat lets a tool without parameters omit it.
            "input_schema": parameters
            if isinstance(parameters, dict)
            else {"type": "object", "properties": {}},
        }
        if isinstance(function.get("description"), str):
            entry["description"] = function["description"]
        if isinstance(function.get("strict"), bool):
            entry["strict"] = function["strict"]
        converted.append(entry)
    return converted


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    converted: dict[str, Any] | None
    if choice == "auto":
        converted = {"type": "auto"}
    elif choice == "required":
        converted = {"type": "any"}
    elif choice == "none":
        converted = {"type": "none"}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        converted = {"type": "tool", "name": choice["function"].get("name")}
    else:
        converted = None
    if parallel is False:
        converted = converted or {"type": "auto"}
        if converted["type"] != "none":
            converted["disable_parallel_tool_use"] = True
    return converted
