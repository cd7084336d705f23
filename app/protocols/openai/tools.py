"""OpenAI Chat's tool calling, translated: `tools` / `tool_choice` -> the neutral
`ToolSpec`s and `ToolChoice` (`app.engine.tools`), history messages with `tool_calls`
and `tool` messages -> neutral `ChatMessage`s, and parsed calls -> `message.tool_calls`
and streamed `delta.tool_calls` (index, then id, type and name once, then argument
fragments: what the OpenAI SDK's stream accumulator expects).

`finish_reason` is `tool_calls` when calls were made, except for a named choice, which
finishes with `stop` (OpenAI's rule, and vllm serve's).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.engine.tools import NamedTool, ToolCall, ToolCallDelta, ToolChoice, ToolSpec
from app.errors import InvalidRequest
from app.wire_text import load_json

_CHOICES = ("none", "auto", "required")


def tool_specs(tools: Sequence[Any] | None) -> tuple[ToolSpec, ...]:
    """Chat's `tools` (`{"type": "function", "function": {"name", "description",
    "parameters", "strict"}}`) as neutral specs."""
    specs = []
    for i, tool in enumerate(tools or ()):
        where = f"tools.{i}"
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise InvalidRequest(
                f"{where} must be a function tool: "
                '{"type": "function", "function": {"name": ..., "parameters": ...}}',
                param="tools",
            )
        parameters = function.get("parameters")
        description = function.get("description")
        strict = function.get("strict")
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidRequest(f"{where}.function.parameters must be an object", param="tools")
        if description is not None and not isinstance(description, str):
            raise InvalidRequest(f"{where}.function.description must be a string", param="tools")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidRequest(f"{where}.function.strict must be a boolean", param="tools")
        specs.append(ToolSpec(function["name"], description, parameters, strict))
    return tuple(specs)


def tool_choice(value: str | dict[str, Any] | None) -> ToolChoice | None:
    """Chat's `tool_choice`: none, auto, required, or `{"type": "function", "function":
    {"name": ...}}`."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in _CHOICES:
            raise InvalidRequest(
                f"tool_choice {value!r} is not one of none, auto, required or a named function",
                param="tool_choice",
            )
        return value  # type: ignore[return-value]  # one of the literals, checked above
    function = value.get("function")
    if value.get("type") != "function" or not isinstance(function, dict):
        raise InvalidRequest(
            'a named tool_choice is {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    name = function.get("name")
    if not isinstance(name, str):
        raise InvalidRequest("tool_choice.function needs a name", param="tool_choice")
    return NamedTool(name)


def history_calls(index: int, calls: Sequence[Any]) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls`, each with its arguments as JSON text."""
    out = []
    for i, call in enumerate(calls):
        param = f"messages.{index}.tool_calls.{i}"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"{param} needs function.name", param=param)
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                load_json(arguments or "{}")
            except ValueError as exc:
                raise InvalidRequest(
                    f"{param}.function.arguments is not JSON", param=param
                ) from exc
        else:
            arguments = json.dumps(arguments)
        out.append(ToolCall(str(call.get("id") or ""), function["name"], arguments or "{}"))
    return tuple(out)


def call_body(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def delta_body(delta: ToolCallDelta) -> dict[str, Any]:
    out: dict[str, Any] = {"index": delta.index}
    if delta.id is not None:
        out["id"] = delta.id
        out["type"] = "function"
    function: dict[str, Any] = {}
    if delta.name is not None:
        function["name"] = delta.name
    if delta.arguments is not None:
        function["arguments"] = delta.arguments
    out["function"] = function
    return out
