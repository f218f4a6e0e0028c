"""Content parts, tools and tool calls of the Responses and Messages APIs in OpenAI chat form.

The canonical request keeps a message's content as a string when it is one piece of text
(the form every chat template renders) and as a list of OpenAI chat parts otherwise
(``{"type": "text", "text"}``, ``{"type": "image_url", "image_url": {"url"}}``), so text
is never joined with a separator the harness did not send.
"""

from __future__ import annotations

from typing import Any

from ._types import invalid

__all__ = ["chat_call", "chat_content", "function_tools", "require_str", "tool_message"]


def require_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise invalid(f"{where}: expected a string, got {type(value).__name__}")
    return value


def chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """One text part becomes a string (none: the empty string); several parts, or an
    image, stay a list."""
    if not parts:
        return ""
    if len(parts) == 1 and parts[0]["type"] == "text":
        text: str = parts[0]["text"]
        return text
    return parts


def chat_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """An OpenAI ``tool_calls`` entry (``arguments`` as JSON text)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_message(call_id: str, content: Any, call_names: dict[str, str]) -> dict[str, Any]:
    """A tool result as a ``tool`` message, named after its call when the call was seen."""
    message = {"role": "tool", "tool_call_id": call_id, "content": content}
    if call_id in call_names:
        message["name"] = call_names[call_id]
    return message


def function_tools(
    tools: list[dict[str, Any]], *, kinds: tuple[Any, ...], schema: str
) -> tuple[dict[str, Any], ...]:
    """The tools the harness runs (their ``type`` one of ``kinds``) as OpenAI function tools;
    ``schema``: the key of their parameters' JSON schema."""
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") not in kinds:
            raise invalid(
                f"tools[{i}]: {tool.get('type')!r} tools are not supported; the gateway serves "
                f"{kinds[-1]} tools, which the harness runs"
            )
        function: dict[str, Any] = {"name": require_str(tool.get("name"), f"tools[{i}].name")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        function["parameters"] = tool.get(schema) or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return tuple(out)
