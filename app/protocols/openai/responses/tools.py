"""The Responses API's tool fields, translated: `tools` (flat function tools: `{"type":
"function", "name", "description", "parameters", "strict"}`) and `tool_choice` (`none`,
`auto`, `required`, or `{"type": "function", "name"}`) -> the neutral `ToolSpec`s and
`ToolChoice` (`app.engine.tools`).

Only function tools are served: OpenAI's hosted tools (web search, file search, computer
use, ...) run on OpenAI's side and have nothing to run here, so naming one is a 400 that
says so, not a tool silently dropped. `strict` defaults to true, as the Responses API
defines it (Chat's default is false): with a forced call (`required` or named) a strict
tool's arguments are decoded to match its schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.engine.tools import NamedTool, ToolChoice, ToolSpec
from app.errors import InvalidRequest

_CHOICES = ("none", "auto", "required")


def tool_specs(tools: Sequence[Any] | None) -> tuple[ToolSpec, ...]:
    specs = []
    for i, tool in enumerate(tools or ()):
        where = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InvalidRequest(
                f"{where}.type: only function tools are served here (got {kind!r}); "
                'a tool is {"type": "function", "name": ..., "parameters": ...}',
                param=f"{where}.type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"{where}.name must be a non-empty string", param=f"{where}.name")
        parameters = tool.get("parameters")
        description = tool.get("description")
        strict = tool.get("strict", True)
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidRequest(
                f"{where}.parameters must be an object", param=f"{where}.parameters"
            )
        if description is not None and not isinstance(description, str):
            raise InvalidRequest(
                f"{where}.description must be a string", param=f"{where}.description"
            )
        if strict is not None and not isinstance(strict, bool):
            raise InvalidRequest(f"{where}.strict must be a boolean", param=f"{where}.strict")
        specs.append(ToolSpec(name, description, parameters, strict))
    return tuple(specs)


def tool_choice(value: str | dict[str, Any] | None) -> ToolChoice | None:
    if value is None:
        return None
    if isinstance(value, str):
        if value not in _CHOICES:
            raise InvalidRequest(
                f"tool_choice {value!r} is not one of none, auto, required or "
                '{"type": "function", "name": ...}',
                param="tool_choice",
            )
        return value  # type: ignore[return-value]  # one of the literals, checked above
    name = value.get("name")
    if value.get("type") != "function" or not isinstance(name, str):
        raise InvalidRequest(
            'a named tool_choice is {"type": "function", "name": ...}', param="tool_choice"
        )
    return NamedTool(name)


def echoed_tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The tools as a response object lists them."""
    return [
        {
            "type": "function",
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
            "strict": spec.strict,
        }
        for spec in specs
    ]


def echoed_choice(choice: ToolChoice | None) -> str | dict[str, Any]:
    if isinstance(choice, NamedTool):
        return {"type": "function", "name": choice.name}
    return choice or "auto"
