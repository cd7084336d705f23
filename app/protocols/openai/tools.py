"""OpenAI chat tool calling: the request's `tools` / `tool_choice` /
`parallel_tool_calls` -> the engine's `ToolPlan`; history messages with `tool_calls` and
`tool` role messages -> the chat template's shape; parsed calls -> `message.tool_calls`
and streamed `delta.tool_calls` (index, then id, type and name once, then argument
fragments: what the OpenAI SDK's stream accumulator expects).

`finish_reason` is `tool_calls` when calls were made, except for a named choice, which
finishes with `stop` (OpenAI's rule, and vllm serve's).
"""

from __future__ import annotations

import json
from typing import Any

from app.engine.base import EngineInfo
from app.engine.tools import ToolCall, ToolCallDelta, ToolPlan
from app.errors import InvalidRequest
from schemas.openai import ChatCompletionRequest, ChatMessage


def tool_plan(body: ChatCompletionRequest, info: EngineInfo) -> ToolPlan | None:
    """None when the request has no tools (and names no tool choice)."""
    if not body.tools and body.tool_choice in (None, "none"):
        return None
    if body.tools and info.tools is None:
        raise InvalidRequest("this server's engine takes no tools", param="tools")
    if not body.tools:
        raise InvalidRequest("tool_choice needs tools", param="tool_choice")
    assert info.tools is not None
    return info.tools.plan(body.tools, body.tool_choice, body.parallel_tool_calls)


def is_named(body: ChatCompletionRequest) -> bool:
    return isinstance(body.tool_choice, dict)


def template_message(index: int, message: ChatMessage) -> dict[str, Any]:
    """One history message as chat templates take it: an assistant's calls with their
    arguments as objects (Qwen-style templates render them with `tojson`)."""
    out: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        calls = []
        for i, call in enumerate(message.tool_calls):
            param = f"messages.{index}.tool_calls.{i}"
            function = call.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise InvalidRequest(f"{param} needs function.name", param=param)
            arguments = function.get("arguments", "{}")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments or "{}")
                except ValueError as exc:
                    raise InvalidRequest(
                        f"{param}.function.arguments is not JSON", param=param
                    ) from exc
            calls.append(
                {
                    "id": call.get("id"),
                    "type": "function",
                    "function": {"name": function["name"], "arguments": arguments},
                }
            )
        out["tool_calls"] = calls
    return out


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
