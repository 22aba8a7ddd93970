"""OpenAI chat completions ⇄ Google's Gemini ``generateContent`` (the Gemini API's and Vertex AI's
Gemini models): pure functions and a small state machine, no I/O.

    gemini_request       a chat completions body       → a generateContent body
    completion_from_gemini a GenerateContentResponse    → a chat completion
    GeminiChunks         streamGenerateContent's answers → chat completion chunks, one by one

Gemini gives each function call a ``thoughtSignature`` (opaque) that must come back on the same part
in the next request, or multi-turn tool use with thinking fails; chat callers send back only a tool
call's id, name and arguments, so the signature rides in the id (``call_<n>.<signature>``) and is
put back on the ``functionCall`` part it came with. Chat's tool result names no function, Gemini's
``functionResponse`` must: the name is the one of the call with that id, earlier in the history.

Dropped, not refused: ``n``, ``logprobs``, the penalties, ``user``, ``parallel_tool_calls``,
``reasoning_content`` replayed in history (its signature never reached chat). An image by URL is
refused (Gemini takes inline data, or files it stores, which a caller cannot name here).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

import orjson

from llmgw.errors import InvalidRequest
from llmgw.translation.chat_chunk import ChatChunkHead

__all__ = [
    "THINKING_BUDGETS",
    "GeminiChunks",
    "completion_from_gemini",
    "gemini_error_body",
    "gemini_request",
]

# The thinking budget each reasoning_effort asks for (Gemini 2.5's range is 0-24576 tokens).
THINKING_BUDGETS: Final = {"minimal": 0, "low": 1024, "medium": 8192, "high": 24576}
_SIGNATURE_MARK: Final = "."
_BLOCKED: Final = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"}
)
_DATA_URL: Final = "data:"


# -- Request: chat → Gemini -----------------------------------------------------------------------


def gemini_request(body: dict[str, Any]) -> dict[str, Any]:
    """The generateContent body asking what the chat request ``body`` asks (the model is in the
    URL); InvalidRequest names a chat field Gemini cannot carry in the shape given."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: must be a list.", param="messages")
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id → function name, for the results
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"{where}: must be an object.", param=where)
        role = message.get("role")
        if role in ("system", "developer"):
            system.extend(_parts(message.get("content"), f"{where}.content"))
        elif role == "user":
            _append(contents, "user", _parts(message.get("content"), f"{where}.content"))
        elif role == "assistant":
            _append(contents, "model", _model_parts(message, where, names))
        elif role == "tool":
            _append(contents, "user", [_function_response(message, where, names)])
        else:
            raise InvalidRequest(
                f"{where}.role: must be 'system', 'developer', 'user', 'assistant' or 'tool'.",
                param=f"{where}.role",
            )
    request: dict[str, Any] = {"contents": contents}
    if system:
        request["systemInstruction"] = {"parts": system}
    tools = _tools(body.get("tools"))
    if tools:
        request["tools"] = [{"functionDeclarations": tools}]
        choice = _tool_config(body.get("tool_choice"))
        if choice is not None:
            request["toolConfig"] = {"functionCallingConfig": choice}
    config = _generation_config(body)
    if config:
        request["generationConfig"] = config
    return request


def _append(contents: list[dict[str, Any]], role: str, parts: list[dict[str, Any]]) -> None:
    """Consecutive turns of one role become one (tool results after their calls, above all)."""
    if not parts:
        return
    if contents and contents[-1]["role"] == role:
        contents[-1]["parts"].extend(parts)
    else:
        contents.append({"role": role, "parts": parts})


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    if content is None:
        return []
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: must be a string or a list of parts.", param=where)
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            if part["text"]:
                parts.append({"text": part["text"]})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            parts.append({"inlineData": _inline(url, f"{at}.image_url.url")})
        elif kind == "file":
            file = part.get("file")
            data = file.get("file_data") if isinstance(file, dict) else None
            if isinstance(data, str):
                parts.append({"inlineData": _inline(data, f"{at}.file.file_data")})
    return parts


def _inline(url: Any, where: str) -> dict[str, str]:
    if isinstance(url, str) and url.startswith(_DATA_URL):
        media_type, marker, data = url[len(_DATA_URL) :].partition(";base64,")
        if marker:
            return {"mimeType": media_type, "data": data}
    raise InvalidRequest(
        f"{where}: Gemini takes images and files as base64 data URLs here, not by URL.",
        param=where,
    )


def _model_parts(
    message: dict[str, Any], where: str, names: dict[str, str]
) -> list[dict[str, Any]]:
    parts = _parts(message.get("content"), f"{where}.content")
    calls = message.get("tool_calls")
    for index, call in enumerate(calls if isinstance(calls, list) else []):
        at = f"{where}.tool_calls[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"{at}.function.name: must be a string.", param=at)
        call_id = call.get("id")
        if not isinstance(call_id, str):
            raise InvalidRequest(f"{at}.id: must be a string.", param=f"{at}.id")
        names[call_id] = function["name"]
        part: dict[str, Any] = {
            "functionCall": {
                "name": function["name"],
                "args": _arguments(function.get("arguments")),
            }
        }
        signature = _signature_of(call_id)
        if signature is not None:
            part["thoughtSignature"] = signature
        parts.append(part)
    return parts


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {}
    return arguments if isinstance(arguments, dict) else {}


def _function_response(
    message: dict[str, Any], where: str, names: dict[str, str]
) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or call_id not in names:
        raise InvalidRequest(
            f"{where}.tool_call_id: must be the id of a tool call earlier in the messages.",
            param=f"{where}.tool_call_id",
        )
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return {"functionResponse": {"name": names[call_id], "response": {"result": content}}}


def _tools(tools: Any) -> list[dict[str, Any]]:
    declarations = []
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        declaration: dict[str, Any] = {"name": function["name"]}
        if isinstance(function.get("description"), str):
            declaration["description"] = function["description"]
        if isinstance(function.get("parameters"), dict):
            # JSON Schema as chat has it (``parameters`` takes only Gemini's OpenAPI subset).
            declaration["parametersJsonSchema"] = function["parameters"]
        declarations.append(declaration)
    return declarations


def _tool_config(choice: Any) -> dict[str, Any] | None:
    if choice == "auto":
        return {"mode": "AUTO"}
    if choice == "required":
        return {"mode": "ANY"}
    if choice == "none":
        return {"mode": "NONE"}
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"mode": "ANY", "allowedFunctionNames": [choice["function"].get("name")]}
    return None


def _generation_config(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        config["maxOutputTokens"] = max_tokens
    for ours, theirs in (("temperature", "temperature"), ("top_p", "topP"), ("seed", "seed")):
        if body.get(ours) is not None:
            config[theirs] = body[ours]
    stop = body.get("stop")
    if isinstance(stop, str):
        config["stopSequences"] = [stop]
    elif isinstance(stop, list) and stop:
        config["stopSequences"] = stop
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") in (
        "json_object",
        "json_schema",
    ):
        config["responseMimeType"] = "application/json"
        schema = response_format.get("json_schema")
        if isinstance(schema, dict) and isinstance(schema.get("schema"), dict):
            config["responseJsonSchema"] = schema["schema"]
    effort = body.get("reasoning_effort")
    reasoning = body.get("reasoning")
    if effort is None and isinstance(reasoning, dict):
        effort = reasoning.get("effort")
    if isinstance(effort, str) and effort in THINKING_BUDGETS:
        budget = THINKING_BUDGETS[effort]
        config["thinkingConfig"] = {"thinkingBudget": budget, "includeThoughts": budget > 0}
    return config


# -- Signatures in tool call ids ------------------------------------------------------------------


def tool_call_id(index: int, signature: Any) -> str:
    """The chat id of a function call: its position, and Gemini's signature when it has one."""
    if not isinstance(signature, str) or not signature:
        return f"call_{index}"
    encoded = base64.urlsafe_b64encode(signature.encode()).decode().rstrip("=")
    return f"call_{index}{_SIGNATURE_MARK}{encoded}"


def _signature_of(call_id: str) -> str | None:
    if not call_id.startswith("call_") or _SIGNATURE_MARK not in call_id:
        return None
    encoded = call_id.partition(_SIGNATURE_MARK)[2]
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


# -- Answer: Gemini → chat ------------------------------------------------------------------------


def _finish_reason(reason: Any, called: bool) -> str:
    if reason in _BLOCKED:
        return "content_filter"
    if reason == "MAX_TOKENS":
        return "length"
    return "tool_calls" if called else "stop"


def chat_usage(metadata: Any) -> dict[str, Any] | None:
    """Chat's usage for Gemini's ``usageMetadata``: the prompt counts its cached part, the
    completion its thoughts."""
    if not isinstance(metadata, dict):
        return None

    def count(name: str) -> int:
        value = metadata.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    prompt = count("promptTokenCount") + count("toolUsePromptTokenCount")
    thoughts = count("thoughtsTokenCount")
    completion = count("candidatesTokenCount") + thoughts
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": count("cachedContentTokenCount")},
        "completion_tokens_details": {"reasoning_tokens": thoughts},
    }


def _candidate(answer: dict[str, Any]) -> dict[str, Any]:
    candidates = answer.get("candidates")
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    return first if isinstance(first, dict) else {}


def _answer_parts(candidate: dict[str, Any]) -> list[dict[str, Any]]:
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def completion_from_gemini(answer: dict[str, Any], *, model: str, created: int) -> dict[str, Any]:
    """The chat completion for a (non-streamed) GenerateContentResponse."""
    candidate = _candidate(answer)
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in _answer_parts(candidate):
        if isinstance(part.get("functionCall"), dict):
            calls.append(_tool_call(len(calls), part))
        elif isinstance(part.get("text"), str):
            (thoughts if part.get("thought") is True else texts).append(part["text"])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    feedback = answer.get("promptFeedback")
    blocked = isinstance(feedback, dict) and feedback.get("blockReason") is not None
    reason = (
        "content_filter" if blocked else _finish_reason(candidate.get("finishReason"), bool(calls))
    )
    completion: dict[str, Any] = {
        "id": answer.get("responseId") or "chatcmpl-gemini",
        "object": "chat.completion",
        "created": created,
        "model": answer.get("modelVersion") or model,
        "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
    }
    usage = chat_usage(answer.get("usageMetadata"))
    if usage is not None:
        completion["usage"] = usage
    return completion


def _tool_call(index: int, part: dict[str, Any]) -> dict[str, Any]:
    call = part["functionCall"]
    return {
        "id": tool_call_id(index, part.get("thoughtSignature")),
        "type": "function",
        "function": {
            "name": call.get("name"),
            "arguments": orjson.dumps(call.get("args") or {}).decode(),
        },
    }


def gemini_error_body(status: int, body: bytes) -> bytes:
    """Google's error (``{"error": {"code", "message", "status"}}``) as OpenAI's error object,
    Google's status (``RESOURCE_EXHAUSTED``) as its type."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        document = None
    if isinstance(document, list) and document:  # a stream's error comes as a list of one
        document = document[0]
    error = document.get("error") if isinstance(document, dict) else None
    error = error if isinstance(error, dict) else {}
    message = error.get("message")
    kind = error.get("status")
    return orjson.dumps(
        {
            "error": {
                "message": message if isinstance(message, str) else f"Gemini answered {status}.",
                "type": kind if isinstance(kind, str) else "api_error",
                "param": None,
                "code": None,
            }
        }
    )


class GeminiChunks:
    """Turns streamGenerateContent's answers, one by one, into chat completion chunks."""

    def __init__(self, *, model: str, created: int, include_usage: bool) -> None:
        self._head = ChatChunkHead("chatcmpl-gemini", created, model)
        self._include_usage = include_usage
        self._started = False
        self._calls = 0
        self._usage: dict[str, Any] | None = None
        self.finished = False

    def feed(self, answer: dict[str, Any]) -> list[dict[str, Any] | bytes]:
        """The chunks (dicts) for one answer; ``[DONE]`` (bytes) after the one that finishes."""
        out: list[dict[str, Any] | bytes] = []
        if not self._started:
            self._started = True
            self._head.id = answer.get("responseId") or self._head.id
            self._head.model = answer.get("modelVersion") or self._head.model
            out.append(self._head.chunk({"role": "assistant", "content": ""}))
        self._usage = chat_usage(answer.get("usageMetadata")) or self._usage
        candidate = _candidate(answer)
        for part in _answer_parts(candidate):
            if isinstance(part.get("functionCall"), dict):
                call = {"index": self._calls, **_tool_call(self._calls, part)}
                self._calls += 1
                out.append(self._head.chunk({"tool_calls": [call]}))
            elif isinstance(part.get("text"), str) and part["text"]:
                field = "reasoning_content" if part.get("thought") is True else "content"
                out.append(self._head.chunk({field: part["text"]}))
        feedback = answer.get("promptFeedback")
        reason = candidate.get("finishReason")
        if isinstance(feedback, dict) and feedback.get("blockReason") is not None:
            out.append(self._head.chunk({}, "content_filter"))
        elif reason is not None:
            out.append(self._head.chunk({}, _finish_reason(reason, self._calls > 0)))
        else:
            return out
        self.finished = True
        if self._include_usage and self._usage is not None:
            out.append(self._head.usage_chunk(self._usage))
        out.append(b"[DONE]")
        return out
