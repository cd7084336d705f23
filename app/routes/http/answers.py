"""What /openapi.json says an API's routes answer, written once for every API: its error
bodies (4XX and 5XX in the API's own shape) and its server-sent events (bare `data:`
events, as OpenAI's Chat and Completions stream, or named ones, as the Responses API and
Anthropic's do).

Documentation only: the handlers return ready responses, never validated through these
models.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.routes.http.bodies import documented

Answers = dict[int | str, Any]


def error_answers(body: type[BaseModel], shape: str, server: str) -> Answers:
    """4XX and 5XX, each `body` (the API's error model): `shape` names it, `server` says
    what its 5XX mean (overloaded, draining...)."""
    content = {"application/json": {"schema": documented(body)}}
    return {
        "4XX": {"description": shape, "content": content},
        "5XX": {"description": f"{shape} ({server})", "content": content},
    }


def event_stream(*events: type[BaseModel], named: bool, done: bool = False) -> dict[str, Any]:
    """A `text/event-stream` of `events`: each `event: <type>` and `data: <its JSON>`
    (`named`), or a bare `data: <its JSON>`, ending with `data: [DONE]` (`done`)."""
    data: dict[str, Any] = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": documented(*events),
    }
    if done:
        json_data = {k: v for k, v in data.items() if k != "type"}
        data = {"type": "string", "anyOf": [{"const": "[DONE]"}, json_data]}
    properties: dict[str, Any] = {"data": data}
    if named:
        properties = {
            "event": {"type": "string", "description": "the event's `type`"},
            **properties,
        }
    item = {"type": "object", "required": list(properties), "properties": properties}
    return {"text/event-stream": {"itemSchema": item}}
