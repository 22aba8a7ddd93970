"""OpenAI Responses ⇄ OpenAI chat completions, for providers that only speak chat completions.

Pure functions: ``to_chat`` (a Responses request, with the stored history it continues, as a chat
body), ``from_chat`` (a chat completion as a Response object), and ``native_request`` (the same
request for a provider that speaks Responses itself, with the history and ``instructions`` folded
in). The stream state machine is ``llmgw.translation.responses_stream``.

Tools chat completions cannot offer (hosted ones such as ``web_search``) are left out and named, as
``llmgw.translation.responses_tools`` says; a namespace's tools are offered one by one. Input that
cannot be expressed is refused with a 400 naming the field (``item_reference``, file ids,
``background``) rather than dropped; what chat completions cannot echo back is documented as lossy:
reasoning items sent back as input are dropped, ``allowed_tools`` becomes its ``mode``, and
``include``, ``truncation``, ``service_tier`` and the like are not sent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from llmgw.accounting.usage import reported_count, reported_usage
from llmgw.errors import InvalidRequest
from llmgw.translation.chat_answer import first_choice, tool_name
from llmgw.translation.responses_tools import ChatTools, as_chat_function, chat_name, chat_tools

__all__ = [
    "IdFactory",
    "ResponseIds",
    "call_id",
    "chat_tools",
    "chat_usage_to_responses",
    "from_chat",
    "function_call_item",
    "message_item",
    "native_request",
    "reasoning_item",
    "response_envelope",
    "status_for_finish",
    "to_chat",
    "validate_request",
]

IdFactory = Callable[[str], str]  # a prefix ("msg", "fc", "rs") -> a fresh id


def random_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(16).hex()}"


class ResponseIds:
    """Where a translation takes its ids and clock from (golden tests pass fixed ones)."""

    def __init__(self, new_id: IdFactory = random_id, clock: Callable[[], float] = time.time):
        self.new_id = new_id
        self.clock = clock


# Request fields copied to chat completions under the same name.
_SAME_NAME = ("temperature", "top_p", "parallel_tool_calls", "user", "prompt_cache_key")


def validate_request(body: dict[str, Any]) -> tuple[str, bool]:
    """Check the fields the gateway reads; return (model, stream)."""
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("'model' must be a non-empty string.", param="model")
    inputs = body.get("input")
    if not isinstance(inputs, str | list):
        raise InvalidRequest("'input' must be a string or a list of items.", param="input")
    for index, item in enumerate(inputs if isinstance(inputs, list) else ()):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input[{index}] must be an object.", param=f"input[{index}]")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be true or false.", param="stream")
    for field in ("store", "background"):
        if body.get(field) is not None and not isinstance(body.get(field), bool):
            raise InvalidRequest(f"'{field}' must be true or false.", param=field)
    if body.get("background") is True:
        raise InvalidRequest(
            "'background' responses are not supported by this gateway.", param="background"
        )
    if body.get("conversation") is not None:
        raise InvalidRequest(
            "'conversation' is not supported by this gateway; use 'previous_response_id'.",
            param="conversation",
        )
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidRequest(
            "'previous_response_id' must be a string.", param="previous_response_id"
        )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("'instructions' must be a string.", param="instructions")
    return model, stream


def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``input`` as a list of items (a string is one user message)."""
    inputs = body.get("input")
    if isinstance(inputs, str):
        return [{"type": "message", "role": "user", "content": inputs}]
    return list(inputs) if isinstance(inputs, list) else []


# ---------------------------------------------------------------------------------------------
# Request: Responses -> chat completions


def to_chat(body: dict[str, Any], history: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The chat completions body for ``body``, continuing the stored ``history`` items."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    items = [*history, *input_items(body)]
    first_new = len(history)
    for index, item in enumerate(items):
        where = f"input[{index - first_new}]" if index >= first_new else "previous_response_id"
        _append_item(messages, item, where)
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    for field in _SAME_NAME:
        if body.get(field) is not None:
            chat[field] = body[field]
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    tools = chat_tools(body.get("tools")).functions
    choice = None if body.get("tool_choice") is None else _chat_tool_choice(body["tool_choice"])
    if tools:
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
    # Without tools (all of them left out) a tool_choice is refused by strict providers: not sent.
    chat.update(_chat_text_options(body.get("text")))
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        chat["reasoning_effort"] = reasoning["effort"]
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _text_of(content: Any) -> str:
    """A tool output or message content flattened to text (chat tool messages are text only)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return "" if content is None else orjson.dumps(content).decode()


def _chat_part(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise InvalidRequest(f"{where} must be an object.", param=where)
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": part.get("text", "")}
    if kind in ("input_image", "image_url"):
        image = part.get("image_url")
        detail = part.get("detail")
        if isinstance(image, dict):  # Venice's and chat's object form
            detail = image.get("detail", detail)
            image = image.get("url")
        if not isinstance(image, str):
            raise InvalidRequest(
                f"{where}: only image_url images are supported (no file_id).", param=where
            )
        url: dict[str, Any] = {"url": image}
        if isinstance(detail, str):
            url["detail"] = detail
        return {"type": "image_url", "image_url": url}
    if kind == "input_file":
        if not isinstance(part.get("file_data"), str):
            raise InvalidRequest(
                f"{where}: only inline files (file_data) are supported, not file_id or file_url.",
                param=where,
            )
        file = {"file_data": part["file_data"]}
        if isinstance(part.get("filename"), str):
            file["filename"] = part["filename"]
        return {"type": "file", "file": file}
    raise InvalidRequest(f"{where}: content part type {kind!r} is not supported.", param=where)


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise InvalidRequest(
            f"{where}.role must be user, assistant, system or developer.", param=f"{where}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise InvalidRequest(
            f"{where}.content must be a string or a list of parts.", param=f"{where}.content"
        )
    parts = [_chat_part(part, f"{where}.content[{i}]") for i, part in enumerate(content)]
    if role != "user" and all(part["type"] == "text" for part in parts):
        # Assistant and system history as plain text: every chat provider accepts that.
        return {"role": role, "content": "".join(part["text"] for part in parts)}
    return {"role": role, "content": parts}


def _tool_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name, namespace = item.get("call_id"), item.get("name"), item.get("namespace")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise InvalidRequest(f"{where} needs a string call_id and name.", param=where)
    if namespace is not None and not isinstance(namespace, str):
        raise InvalidRequest(f"{where}.namespace must be a string.", param=where)
    arguments: Any = item.get("arguments")
    if item.get("type") == "custom_tool_call":
        arguments = orjson.dumps({"input": _text_of(item.get("input"))}).decode()
    elif not isinstance(arguments, str):
        raise InvalidRequest(f"{where}.arguments must be a JSON string.", param=where)
    function = {"name": chat_name(namespace, name), "arguments": arguments}
    return {"id": call_id, "type": "function", "function": function}


def _append_item(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        messages.append(_message(item, where))
    elif kind in ("function_call", "custom_tool_call"):
        call = _tool_call(item, where)
        last = messages[-1] if messages else None
        # Consecutive calls, and the assistant text just before them, are one assistant turn.
        if (
            last is not None
            and last["role"] == "assistant"
            and isinstance(last.get("content"), str | None)
        ):
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind in ("function_call_output", "custom_tool_call_output"):
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise InvalidRequest(f"{where}.call_id must be a string.", param=where)
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": _text_of(item.get("output"))}
        )
    elif kind == "reasoning":
        return  # lossy: chat completions take no reasoning input
    elif kind == "item_reference":
        raise InvalidRequest(
            f"{where}: item_reference is not supported; send the item or use previous_response_id.",
            param=where,
        )
    else:
        raise InvalidRequest(
            f"{where}: item type {kind!r} is not supported by this provider.", param=where
        )


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("function", "custom") and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if kind == "function" and isinstance(choice.get("function"), dict):
        return choice
    if kind == "allowed_tools" and isinstance(choice.get("mode"), str):
        return choice["mode"]  # lossy: the subset of allowed tools is not expressible
    raise InvalidRequest(
        f"tool_choice of type {kind!r} is not supported by this provider.", param="tool_choice"
    )


def _chat_text_options(text: Any) -> dict[str, Any]:
    if not isinstance(text, dict):
        return {}
    options: dict[str, Any] = {}
    if isinstance(text.get("verbosity"), str):
        options["verbosity"] = text["verbosity"]
    form = text.get("format")
    kind = form.get("type") if isinstance(form, dict) else None
    if kind == "json_object":
        options["response_format"] = {"type": "json_object"}
    elif kind == "json_schema":
        assert isinstance(form, dict)
        schema = {k: form[k] for k in ("name", "schema", "strict", "description") if k in form}
        options["response_format"] = {"type": "json_schema", "json_schema": schema}
    return options


# ---------------------------------------------------------------------------------------------
# Request: Responses -> a provider's own Responses endpoint


def native_request(body: dict[str, Any], history: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """``body`` for a provider that serves Responses statelessly (Venice): the stored history is
    sent in full, ``instructions`` become a leading developer message, tools and ``tool_choice``
    take the nested chat shape Venice documents, and fields it does not know are left out."""
    items = [*history, *input_items(body)]
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        items.insert(0, {"type": "message", "role": "developer", "content": instructions})
    native = {
        key: value
        for key, value in body.items()
        if key not in _NATIVE_DROPPED and value is not None
    }
    native["input"] = items
    tools = body.get("tools")
    if isinstance(tools, list):
        # Flat function tools in Venice's nested shape; its own tools (web_search...) as they are.
        native["tools"] = [
            as_chat_function(tool, f"tools[{index}]")
            if isinstance(tool, dict) and tool.get("type") in ("function", "custom")
            else tool
            for index, tool in enumerate(tools)
        ]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        native["tool_choice"] = _chat_tool_choice(choice)
    return native


# The gateway keeps the state itself; the rest is what Venice's ResponsesRequest lacks.
_NATIVE_DROPPED = frozenset(
    {
        "instructions", "store", "previous_response_id", "conversation", "text", "metadata",
        "parallel_tool_calls", "truncation", "service_tier", "user", "safety_identifier",
        "prompt_cache_key", "prompt_cache_retention", "background", "prompt", "max_tool_calls",
        "context_management", "moderation", "stream_options", "top_logprobs",
    }
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Response: chat completion -> Response object


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def function_call_item(
    item_id: str,
    call_id: str,
    name: str,
    arguments: str,
    *,
    tools: ChatTools,
    status: str = "completed",
) -> dict[str, Any]:
    """The item of a chat tool call to ``name``: a function_call, or a custom_tool_call when it
    names a custom tool of ``tools``; a namespaced tool's with its ``name`` and ``namespace``."""
    tool = tools.call(name)
    item: dict[str, Any] = {"id": item_id, "status": status, "call_id": call_id}
    if tool.namespace is not None:
        item["namespace"] = tool.namespace
    if not tool.custom:
        return {**item, "type": "function_call", "name": tool.name, "arguments": arguments}
    try:
        decoded = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        decoded = None
    text = decoded.get("input") if isinstance(decoded, dict) else None
    return {
        **item,
        "type": "custom_tool_call",
        "name": tool.name,
        "input": text if isinstance(text, str) else arguments,
    }


def call_id(call: dict[str, Any], ids: ResponseIds) -> str:
    """A tool call's id as the provider gave it, or a fresh one when it gave none."""
    given = call.get("id")
    return given if isinstance(given, str) and given else ids.new_id("call")


def status_for_finish(finish_reason: Any) -> tuple[str, dict[str, str] | None]:
    """A chat finish_reason as the Response's (status, incomplete_details)."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def chat_usage_to_responses(usage: Any) -> dict[str, Any] | None:
    """The Responses ``usage`` of a chat one; None when it reports neither input nor output.

    A count that is no count (negative, fractional, absurd) is unreported: 0 in its field, and the
    total is then the sum of the parts rather than the provider's.
    """
    parsed = reported_usage({"usage": usage})
    if parsed is None:
        return None
    input_tokens, output_tokens = parsed.input_tokens, parsed.output_tokens
    total = reported_count(usage.get("total_tokens"))
    if input_tokens is None or output_tokens is None or total is None:
        total = (input_tokens or 0) + (output_tokens or 0)
    return {
        "input_tokens": input_tokens or 0,
        "input_tokens_details": {"cached_tokens": parsed.cache_read_input_tokens or 0},
        "output_tokens": output_tokens or 0,
        "output_tokens_details": {"reasoning_tokens": parsed.reasoning_output_tokens or 0},
        "total_tokens": total,
    }


def response_envelope(
    request: dict[str, Any], *, response_id: str, created_at: int, model: str | None = None
) -> dict[str, Any]:
    """A Response object with everything but its outcome: what the request set, echoed back
    (the SDK's model marks ``tools``, ``tool_choice``, ``parallel_tool_calls`` required)."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata") or {},
        "model": model or request.get("model"),
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": request.get("reasoning") or {"effort": None, "summary": None},
        "store": request.get("store", True),
        "temperature": request.get("temperature"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": request.get("truncation", "disabled"),
        "usage": None,
        "user": request.get("user"),
    }


def from_chat(
    completion: dict[str, Any], *, request: dict[str, Any], response_id: str, ids: ResponseIds
) -> dict[str, Any]:
    """A non-streamed chat completion as the Response object of ``request``."""
    choice, message = first_choice(completion)
    status, incomplete = status_for_finish(choice.get("finish_reason"))
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        output.append(reasoning_item(ids.new_id("rs"), reasoning))
    content = message.get("content")
    if isinstance(content, str) and content:
        output.append(message_item(ids.new_id("msg"), content, status=_item_status(status)))
    tools = chat_tools(request.get("tools"))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        arguments = function.get("arguments")
        output.append(
            function_call_item(
                ids.new_id("fc"),
                call_id(call, ids),
                tool_name(function.get("name")),
                arguments if isinstance(arguments, str) else "",
                tools=tools,
            )
        )
    created = completion.get("created")
    response = response_envelope(
        request,
        response_id=response_id,
        created_at=created if isinstance(created, int) else int(ids.clock()),
        model=completion.get("model") if isinstance(completion.get("model"), str) else None,
    )
    response.update(
        status=status,
        incomplete_details=incomplete,
        output=output,
        usage=chat_usage_to_responses(completion.get("usage")),
    )
    return response


def _item_status(response_status: str) -> str:
    return "incomplete" if response_status == "incomplete" else "completed"
