"""Anthropic Messages ⇄ AWS Bedrock's Converse API: pure functions and a small state machine, no I/O.

    converse_request      a Messages request body     → a Converse / ConverseStream request body
    message_from_converse a Converse answer            → a Messages ``message`` object
    ConverseEvents        ConverseStream's events       → Messages stream events, one by one

Converse is Messages' shape with other names (content blocks, tool use and results, reasoning with
its signature, cache points), so a chat or Responses request reaches it through
``chat_to_messages`` and its answer goes back through ``messages_to_chat``: one translation per
direction, shared with the Anthropic kind. Dropped, not refused: server tools and the blocks only
they produce, ``metadata``, ``container``, ``mcp_servers``, ``context_management``, citations;
``tool_choice: none`` (Converse has no such choice: the tools stay offered). Tools used in the
history but not offered are declared again (Converse refuses their blocks otherwise). An image or
document by URL is refused: Converse takes their bytes (or S3 locations, which a caller cannot
name here).
"""

from __future__ import annotations

import base64
import re
import secrets
from typing import Any, Final

from llmgw.errors import InvalidRequest

__all__ = [
    "STOP_REASONS",
    "ConverseEvents",
    "converse_request",
    "converse_usage",
    "message_from_converse",
]

# Converse's stopReason → Messages' stop_reason (a refusal by a guardrail or a filter is a refusal).
STOP_REASONS: Final = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "guardrail_intervened": "refusal",
    "content_filtered": "refusal",
    "model_context_window_exceeded": "model_context_window_exceeded",
}
_CACHE_POINT: Final = {"cachePoint": {"type": "default"}}
_IMAGE_FORMATS: Final = frozenset({"png", "jpeg", "gif", "webp"})
_DOCUMENT_FORMATS: Final = {
    "application/pdf": "pdf",
    "text/plain": "txt",
    "text/csv": "csv",
    "text/html": "html",
    "text/markdown": "md",
    "application/msword": "doc",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.ms-excel": "xls",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
}
# A document's name may hold only these (Converse's DocumentBlock.name), one space at a time.
_NAME_REFUSED: Final = re.compile(r"[^A-Za-z0-9\s\-()\[\]]")


# -- Request: Messages → Converse -----------------------------------------------------------------


def converse_request(body: dict[str, Any]) -> dict[str, Any]:
    """The Converse request asking what the Messages request ``body`` asks (its model goes in the
    URL, and ``stream`` is the operation's choice); InvalidRequest names what Converse cannot take."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: must be a list.", param="messages")
    request: dict[str, Any] = {
        "messages": [_message(message, f"messages[{i}]") for i, message in enumerate(messages)]
    }
    system = _system(body.get("system"))
    if system:
        request["system"] = system
    inference = _inference_config(body)
    if inference:
        request["inferenceConfig"] = inference
    tools = _tool_config(body.get("tools"), body.get("tool_choice"))
    if tools is None:
        tools = _tools_of_history(request["messages"])
    if tools is not None:
        request["toolConfig"] = tools
    # Model-specific fields Converse has no name for go to the model as they are (Claude's).
    extra = {name: body[name] for name in ("thinking", "top_k") if body.get(name) is not None}
    if extra:
        request["additionalModelRequestFields"] = extra
    return request


def _system(system: Any) -> list[dict[str, Any]]:
    if isinstance(system, str):
        return [{"text": system}] if system else []
    if not isinstance(system, list):
        return []
    blocks: list[dict[str, Any]] = []
    for block in system:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            blocks.append({"text": block["text"]})
            if isinstance(block.get("cache_control"), dict):
                blocks.append(_CACHE_POINT)
    return blocks


def _inference_config(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for ours, theirs in (
        ("max_tokens", "maxTokens"),
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("stop_sequences", "stopSequences"),
    ):
        if body.get(ours) is not None:
            config[theirs] = body[ours]
    return config


def _message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise InvalidRequest(f"{where}: must be a user or assistant message.", param=where)
    content = message.get("content")
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str):
        blocks.append({"text": content})
    elif isinstance(content, list):
        for index, block in enumerate(content):
            blocks.extend(_block(block, f"{where}.content[{index}]"))
    else:
        raise InvalidRequest(f"{where}.content: must be a string or a list.", param=where)
    return {"role": message["role"], "content": blocks}


def _block(block: Any, where: str) -> list[dict[str, Any]]:
    """A Messages content block as Converse blocks: itself, then a cache point if it asks one."""
    if not isinstance(block, dict):
        raise InvalidRequest(f"{where}: must be an object.", param=where)
    kind = block.get("type")
    converted: dict[str, Any] | None
    if kind == "text":
        converted = {"text": _string(block.get("text"), f"{where}.text")}
    elif kind == "image":
        converted = {"image": _image(block, where)}
    elif kind == "document":
        converted = {"document": _document(block, where)}
    elif kind == "tool_use":
        converted = {
            "toolUse": {
                "toolUseId": _string(block.get("id"), f"{where}.id"),
                "name": _string(block.get("name"), f"{where}.name"),
                "input": block.get("input") if isinstance(block.get("input"), dict) else {},
            }
        }
    elif kind == "tool_result":
        converted = {"toolResult": _tool_result(block, where)}
    elif kind == "thinking":
        text: dict[str, Any] = {"text": _string(block.get("thinking"), f"{where}.thinking")}
        if isinstance(block.get("signature"), str):
            text["signature"] = block["signature"]
        converted = {"reasoningContent": {"reasoningText": text}}
    elif kind == "redacted_thinking":
        converted = {"reasoningContent": {"redactedContent": block.get("data")}}
    else:
        converted = None  # server tools' blocks, search results: nothing Converse takes
    if converted is None:
        return []
    if isinstance(block.get("cache_control"), dict):
        return [converted, _CACHE_POINT]
    return [converted]


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}: must be a string.", param=where)
    return value


def _base64_source(block: dict[str, Any], where: str) -> tuple[str, str]:
    """The media type and the base64 data of a block's source (text documents are encoded)."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise InvalidRequest(f"{where}.source: must be an object.", param=f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media_type = source.get("media_type")
        return (
            media_type if isinstance(media_type, str) else "",
            _string(source.get("data"), f"{where}.source.data"),
        )
    if kind == "text":
        data = _string(source.get("data"), f"{where}.source.data")
        return "text/plain", base64.b64encode(data.encode()).decode()
    raise InvalidRequest(
        f"{where}.source: Bedrock takes images and documents as base64 data, not as a "
        f"{kind!s} source.",
        param=f"{where}.source",
    )


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    media_type, data = _base64_source(block, where)
    image_format = media_type.removeprefix("image/")
    if image_format not in _IMAGE_FORMATS:
        raise InvalidRequest(
            f"{where}.source.media_type: Bedrock takes png, jpeg, gif or webp images.",
            param=f"{where}.source.media_type",
        )
    return {"format": image_format, "source": {"bytes": data}}


def _document(block: dict[str, Any], where: str) -> dict[str, Any]:
    media_type, data = _base64_source(block, where)
    document_format = _DOCUMENT_FORMATS.get(media_type)
    if document_format is None:
        raise InvalidRequest(
            f"{where}.source.media_type: Bedrock takes no documents of type {media_type!r}.",
            param=f"{where}.source.media_type",
        )
    title = block.get("title")
    name = " ".join(_NAME_REFUSED.sub(" ", title).split()) if isinstance(title, str) else ""
    return {"format": document_format, "name": name or "document", "source": {"bytes": data}}


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    result: dict[str, Any] = {"toolUseId": _string(block.get("tool_use_id"), f"{where}.id")}
    content = block.get("content")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        parts.append({"text": content})
    elif isinstance(content, list):
        for index, item in enumerate(content):
            at = f"{where}.content[{index}]"
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text":
                parts.append({"text": _string(item.get("text"), f"{at}.text")})
            elif kind == "image":
                parts.append({"image": _image(item, at)})
            elif kind == "document":
                parts.append({"document": _document(item, at)})
    result["content"] = parts or [{"text": ""}]
    if block.get("is_error") is True:
        result["status"] = "error"
    return result


def _tool_config(tools: Any, choice: Any) -> dict[str, Any] | None:
    if not isinstance(tools, list):
        return None
    specs: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("input_schema"), dict):
            continue  # a server tool (web search, bash, ...): no Converse form
        spec: dict[str, Any] = {
            "name": tool.get("name"),
            "inputSchema": {"json": tool["input_schema"]},
        }
        if isinstance(tool.get("description"), str) and tool["description"]:
            spec["description"] = tool["description"]
        specs.append({"toolSpec": spec})
        if isinstance(tool.get("cache_control"), dict):
            specs.append(_CACHE_POINT)
    if not specs:
        return None
    config: dict[str, Any] = {"tools": specs}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "any"):
        config["toolChoice"] = {kind: {}}
    elif kind == "tool" and isinstance(choice, dict):
        config["toolChoice"] = {"tool": {"name": choice.get("name")}}
    return config


def _tools_of_history(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Converse refuses tool use in history without a toolConfig, and callers often leave their
    tools out of the turn that only reads a tool's result: the tools used are declared again,
    with a schema that takes any input."""
    names = {
        block["toolUse"]["name"]
        for message in messages
        for block in message["content"]
        if "toolUse" in block
    }
    if not names:
        return None
    schema = {"json": {"type": "object"}}
    return {"tools": [{"toolSpec": {"name": n, "inputSchema": schema}} for n in sorted(names)]}


# -- Answer: Converse → Messages ------------------------------------------------------------------


def new_message_id() -> str:
    return "msg_bdrk_" + secrets.token_hex(12)


def converse_usage(usage: Any) -> dict[str, int]:
    """Messages' usage for Converse's: both leave the cache reads and writes out of the input."""
    usage = usage if isinstance(usage, dict) else {}

    def count(name: str) -> int:
        value = usage.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    return {
        "input_tokens": count("inputTokens"),
        "output_tokens": count("outputTokens"),
        "cache_read_input_tokens": count("cacheReadInputTokens"),
        "cache_creation_input_tokens": count("cacheWriteInputTokens"),
    }


def _stop_reason(reason: Any) -> str:
    return STOP_REASONS.get(reason, "end_turn") if isinstance(reason, str) else "end_turn"


def message_from_converse(answer: dict[str, Any], *, model: str) -> dict[str, Any]:
    """The Messages answer for a Converse answer."""
    output = answer.get("output")
    message = output.get("message") if isinstance(output, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    blocks = [
        converted
        for block in (content if isinstance(content, list) else [])
        if (converted := _answer_block(block)) is not None
    ]
    return {
        "id": new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": _stop_reason(answer.get("stopReason")),
        "stop_sequence": None,
        "usage": converse_usage(answer.get("usage")),
    }


def _answer_block(block: Any) -> dict[str, Any] | None:
    if not isinstance(block, dict):
        return None
    if isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    use = block.get("toolUse")
    if isinstance(use, dict):
        return {
            "type": "tool_use",
            "id": use.get("toolUseId"),
            "name": use.get("name"),
            "input": use.get("input") if isinstance(use.get("input"), dict) else {},
        }
    reasoning = block.get("reasoningContent")
    if isinstance(reasoning, dict):
        text = reasoning.get("reasoningText")
        if isinstance(text, dict):
            return {
                "type": "thinking",
                "thinking": text.get("text") or "",
                "signature": text.get("signature") or "",
            }
        if reasoning.get("redactedContent") is not None:
            return {"type": "redacted_thinking", "data": reasoning["redactedContent"]}
    return None  # citations, images the model made: nothing a Messages answer carries here


class ConverseEvents:
    """Turns one ConverseStream, event by event, into the Messages stream events it means.

    Converse opens a text or reasoning block with its first delta (only tool use has a start
    event), and reports usage in ``metadata`` after ``messageStop``: the stop reason is held until
    the usage comes, so ``message_delta`` carries both, as Anthropic's does.
    """

    def __init__(self, *, model: str) -> None:
        self._model = model
        self._open: dict[int, str] = {}  # Converse block index → the Messages block type open
        self._stop_reason: str | None = None
        self.finished = False  # message_stop was given

    def feed(self, kind: str, event: dict[str, Any]) -> list[dict[str, Any]]:
        """The Messages events for one Converse event of type ``kind`` (``:event-type``)."""
        if kind == "messageStart":
            return [self._message_start()]
        if kind == "contentBlockStart":
            return self._block_start(event)
        if kind == "contentBlockDelta":
            return self._block_delta(event)
        if kind == "contentBlockStop":
            index = event.get("contentBlockIndex")
            if not isinstance(index, int) or self._open.pop(index, None) is None:
                return []
            return [{"type": "content_block_stop", "index": index}]
        if kind == "messageStop":
            self._stop_reason = _stop_reason(event.get("stopReason"))
            return []
        if kind == "metadata":
            return self._finish(event.get("usage"))
        return []  # event types newer than this code

    def finish(self) -> list[dict[str, Any]]:
        """The end of a stream that stopped without its ``metadata`` (nothing if it ended)."""
        if self.finished or self._stop_reason is None:
            return []
        return self._finish(None)

    def _message_start(self) -> dict[str, Any]:
        return {
            "type": "message_start",
            "message": {
                "id": new_message_id(),
                "type": "message",
                "role": "assistant",
                "model": self._model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            },
        }

    def _finish(self, usage: Any) -> list[dict[str, Any]]:
        self.finished = True
        delta = {"stop_reason": self._stop_reason or "end_turn", "stop_sequence": None}
        return [
            {"type": "message_delta", "delta": delta, "usage": converse_usage(usage)},
            {"type": "message_stop"},
        ]

    def _block_start(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        index = event.get("contentBlockIndex")
        start = event.get("start")
        use = start.get("toolUse") if isinstance(start, dict) else None
        if not isinstance(index, int) or not isinstance(use, dict):
            return []
        self._open[index] = "tool_use"
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": use.get("toolUseId"),
            "name": use.get("name"),
            "input": {},
        }
        return [{"type": "content_block_start", "index": index, "content_block": block}]

    def _block_delta(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        index = event.get("contentBlockIndex")
        delta = event.get("delta")
        if not isinstance(index, int) or not isinstance(delta, dict):
            return []
        out: list[dict[str, Any]] = []
        converted: dict[str, Any] | None = None
        if isinstance(delta.get("text"), str):
            self._ensure_open(index, {"type": "text", "text": ""}, out)
            converted = {"type": "text_delta", "text": delta["text"]}
        elif isinstance(delta.get("toolUse"), dict):
            converted = {"type": "input_json_delta", "partial_json": delta["toolUse"].get("input")}
        elif isinstance(delta.get("reasoningContent"), dict):
            reasoning = delta["reasoningContent"]
            if reasoning.get("redactedContent") is not None:
                redacted = {"type": "redacted_thinking", "data": reasoning["redactedContent"]}
                self._ensure_open(index, redacted, out)
                return out
            self._ensure_open(index, {"type": "thinking", "thinking": "", "signature": ""}, out)
            if isinstance(reasoning.get("text"), str):
                converted = {"type": "thinking_delta", "thinking": reasoning["text"]}
            elif isinstance(reasoning.get("signature"), str):
                converted = {"type": "signature_delta", "signature": reasoning["signature"]}
        if converted is not None and index in self._open:
            out.append({"type": "content_block_delta", "index": index, "delta": converted})
        return out

    def _ensure_open(self, index: int, block: dict[str, Any], out: list[dict[str, Any]]) -> None:
        if index in self._open:
            return
        self._open[index] = block["type"]
        out.append({"type": "content_block_start", "index": index, "content_block": block})
