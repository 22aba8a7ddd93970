"""A Responses request's tools offered through chat completions, and the model's calls mapped back.

Chat completions know one kind of tool, the function. For a provider that speaks only chat:

- ``function`` tools are sent as functions (Responses' flat shape, nested the chat way);
- ``custom`` tools (free text, Codex's ``apply_patch``) as functions taking one string, ``input``;
  a call comes back as a ``custom_tool_call``;
- a ``namespace``'s function and custom tools one by one, named ``<namespace>__<name>`` (Codex's own
  flat spelling); a call comes back with ``name`` and ``namespace`` apart, as the Responses API
  returns it (Codex dispatches on both), and such a call in the history goes back under the flat
  name. The namespace's own description is not sent;
- every other tool is left out: the hosted ones (``web_search``, ``file_search``,
  ``code_interpreter``, ``image_generation``, ``computer_use_preview``, ``mcp``, ...) run on
  OpenAI's side, and the client ones with call items of their own (``local_shell``, ``shell``,
  ``apply_patch``, ``tool_search``) have no chat form. The model does not get them, as when a tool
  is unavailable, and ``ChatTools.omitted`` names their types so the caller is told.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from llmgw.errors import InvalidRequest

__all__ = ["ChatTools", "OfferedTool", "as_chat_function", "chat_name", "chat_tools"]

# Codex's delimiter between a namespace and a tool name (``ToolName::canonical_flat_name``).
_NAMESPACE_DELIMITER = "__"
_FUNCTION_LIKE = ("function", "custom")
_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
}


@attrs.frozen
class OfferedTool:
    """A function or custom tool, as the Responses API names it."""

    name: str
    namespace: str | None = None
    custom: bool = False


@attrs.frozen
class ChatTools:
    functions: list[dict[str, Any]]  # the chat ``tools``
    omitted: tuple[str, ...]  # the types of the tools left out, each once, in order
    offered: Mapping[str, OfferedTool]  # by the name the chat model calls it

    def call(self, name: str) -> OfferedTool:
        """The tool a chat tool call names (a name the request did not offer stays a function)."""
        return self.offered.get(name) or OfferedTool(name)


def chat_name(namespace: str | None, name: str) -> str:
    """The name chat completions know a tool by: namespaced ones flattened."""
    return name if namespace is None else f"{namespace}{_NAMESPACE_DELIMITER}{name}"


def as_chat_function(
    tool: dict[str, Any], where: str, namespace: str | None = None
) -> dict[str, Any]:
    """A function or custom tool in the chat shape (a top-level one already in it is kept)."""
    if (
        namespace is None
        and tool.get("type") == "function"
        and isinstance(tool.get("function"), dict)
    ):
        return tool  # the chat shape already (Venice's Responses accepts it too)
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}.name must be a non-empty string.", param=where)
    function: dict[str, Any] = {"name": chat_name(namespace, name)}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    if tool.get("type") == "custom":
        function["parameters"] = _CUSTOM_PARAMETERS
    else:
        function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def chat_tools(tools: Any) -> ChatTools:
    """What of ``tools`` chat completions can offer, and what they cannot (left out, named)."""
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be a list.", param="tools")
    plan = _Plan()
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        kind = _kind(tool, where)
        if kind in _FUNCTION_LIKE:
            plan.offer(tool, where)
        elif kind == "namespace":
            plan.offer_namespace(tool, where)
        else:
            plan.omitted[kind] = None
    return ChatTools(plan.functions, tuple(plan.omitted), plan.offered)


def _kind(tool: Any, where: str) -> str:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if not isinstance(kind, str):
        raise InvalidRequest(f"{where} must be an object with a string 'type'.", param=where)
    return kind


class _Plan:
    def __init__(self) -> None:
        self.functions: list[dict[str, Any]] = []
        self.omitted: dict[str, None] = {}  # an ordered set
        self.offered: dict[str, OfferedTool] = {}

    def offer(self, tool: dict[str, Any], where: str, namespace: str | None = None) -> None:
        function = as_chat_function(tool, where, namespace)
        name = function["function"].get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"{where}.function.name must be a non-empty string.", param=where)
        if name in self.offered:
            raise InvalidRequest(f"{where}: a tool named {name!r} is offered twice.", param=where)
        own_name = name if namespace is None else tool["name"]
        self.offered[name] = OfferedTool(own_name, namespace, tool.get("type") == "custom")
        self.functions.append(function)

    def offer_namespace(self, tool: dict[str, Any], where: str) -> None:
        namespace, members = tool.get("name"), tool.get("tools")
        if not isinstance(namespace, str) or not namespace or not isinstance(members, list):
            raise InvalidRequest(
                f"{where}: a namespace needs a non-empty string 'name' and a list of 'tools'.",
                param=where,
            )
        for index, member in enumerate(members):
            inner = f"{where}.tools[{index}]"
            kind = _kind(member, inner)
            if kind in _FUNCTION_LIKE:
                self.offer(member, inner, namespace)
            else:
                self.omitted[kind] = None
