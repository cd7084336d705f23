"""The Responses API's tool fields, translated: `tools` (flat function tools: `{"type":
"function", "name", "description", "parameters", "strict"}`) and `tool_choice` (`none`,
`auto`, `required`, or `{"type": "function", "name"}`) -> the neutral `ToolSpec`s and
`ToolChoice` (`app.engine.tools`).

Function tools are served, alone or grouped in a `namespace` tool (its function members
are offered by name, and a call of one says its `namespace`, as OpenAI's do). Every other
kind (OpenAI's hosted tools: web search, file search, code interpreter, computer use,
image generation, MCP, shell; and freeform `custom` tools) is accepted and not offered to
the model: there is nothing here to run it, and clients such as the Codex CLI send some
by default (`vllm serve` drops them too). A `tool_choice` naming one is a 400.

`strict` defaults to true, as the Responses API defines it (Chat's default is false):
with a forced call (`required` or named) a strict tool's arguments are decoded to match
its schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.engine.tools import NamedTool, ToolChoice, ToolSpec
from app.errors import InvalidRequest

_CHOICES = ("none", "auto", "required")


@dataclass(frozen=True, slots=True)
class Tools:
    """The tools offered to the model, and the namespace of each that is in one."""

    specs: tuple[ToolSpec, ...] = ()
    namespaces: Mapping[str, str] = field(default_factory=dict)


def tool_specs(tools: Sequence[Any] | None) -> Tools:
    specs: list[ToolSpec] = []
    namespaces: dict[str, str] = {}
    for i, tool in enumerate(tools or ()):
        where = f"tools.{i}"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise InvalidRequest(
                f"{where} must be a tool object with a type", param=f"{where}.type"
            )
        if tool["type"] == "function":
            specs.append(_function(tool, where))
        elif tool["type"] == "namespace":
            namespace = tool.get("name")
            members = tool.get("tools")
            if not isinstance(namespace, str) or not isinstance(members, list):
                raise InvalidRequest(
                    f"{where}: a namespace tool has a name and a list of tools", param=where
                )
            for j, member in enumerate(members):
                if isinstance(member, dict) and member.get("type") == "function":
                    spec = _function(member, f"{where}.tools.{j}")
                    specs.append(spec)
                    namespaces[spec.name] = namespace
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise InvalidRequest("tools: two function tools have the same name", param="tools")
    return Tools(tuple(specs), namespaces)


def _function(tool: dict[str, Any], where: str) -> ToolSpec:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}.name must be a non-empty string", param=f"{where}.name")
    parameters = tool.get("parameters")
    description = tool.get("description")
    strict = tool.get("strict", True)
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidRequest(f"{where}.parameters must be an object", param=f"{where}.parameters")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(f"{where}.description must be a string", param=f"{where}.description")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest(f"{where}.strict must be a boolean", param=f"{where}.strict")
    return ToolSpec(name, description, parameters, strict)


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
    """The tools offered to the model, as a response object lists them."""
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
