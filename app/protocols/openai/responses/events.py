"""The Responses API's stream events, built in one place for the live stream (`exchange`) and
for a stored response replayed (`replay`), so both speak exactly one shape.

`Events` numbers every event it builds (`sequence_number`, from 0, one per event, as the
openai SDK's `starting_after` counts them) and returns `(name, body)` pairs: the SSE event
name is the body's `type`. Bodies are fresh dicts that the builder never touches again
(a background run keeps them to replay to late readers); the items and parts they carry
must not be mutated by the caller afterwards either.

Plain dicts, no models: the text delta is built once per token.
"""

from __future__ import annotations

from typing import Any

from app.errors import SwitchboardError
from app.protocols.exchange import Event
from app.protocols.openai.errors import error_type

Body = dict[str, Any]
Built = tuple[str, Body]  # an `Event` whose body is still ours to complete


def part_text(part: Body) -> str:
    return str(part.get("text") or "")


class Events:
    def __init__(self) -> None:
        self.next = 0

    def _event(self, body: Body) -> Built:
        body["sequence_number"] = self.next
        self.next += 1
        return body["type"], body

    def lifecycle(self, kind: str, response: Body) -> Built:
        return self._event({"type": kind, "response": response})

    def item_added(self, index: int, item: Body) -> Built:
        return self._event(
            {"type": "response.output_item.added", "output_index": index, "item": item}
        )

    def item_done(self, index: int, item: Body) -> Built:
        return self._event(
            {"type": "response.output_item.done", "output_index": index, "item": item}
        )

    def part(self, done: bool, item_id: str, index: int, content_index: int, part: Body) -> Built:
        kind = "response.content_part.done" if done else "response.content_part.added"
        return self._event(
            {
                "type": kind,
                "item_id": item_id,
                "output_index": index,
                "content_index": content_index,
                "part": part,
            }
        )

    def text_delta(
        self, item_id: str, index: int, delta: str, logprobs: list[Body] | None = None
    ) -> Built:
        body = {
            "type": "response.output_text.delta",
            "item_id": item_id,
            "output_index": index,
            "content_index": 0,
            "delta": delta,
            "logprobs": logprobs or [],
            "sequence_number": self.next,
        }
        self.next += 1
        return "response.output_text.delta", body

    def text_done(
        self, item_id: str, index: int, text: str, logprobs: list[Body] | None = None
    ) -> Built:
        return self._event(
            {
                "type": "response.output_text.done",
                "item_id": item_id,
                "output_index": index,
                "content_index": 0,
                "text": text,
                "logprobs": logprobs or [],
            }
        )

    def reasoning_delta(self, item_id: str, index: int, delta: str) -> Built:
        return self._event(
            {
                "type": "response.reasoning_text.delta",
                "item_id": item_id,
                "output_index": index,
                "content_index": 0,
                "delta": delta,
            }
        )

    def reasoning_done(self, item_id: str, index: int, text: str) -> Built:
        return self._event(
            {
                "type": "response.reasoning_text.done",
                "item_id": item_id,
                "output_index": index,
                "content_index": 0,
                "text": text,
            }
        )

    def arguments_delta(self, item_id: str, index: int, delta: str) -> Built:
        return self._event(
            {
                "type": "response.function_call_arguments.delta",
                "item_id": item_id,
                "output_index": index,
                "delta": delta,
            }
        )

    def arguments_done(self, item_id: str, index: int, name: str, arguments: str) -> Built:
        return self._event(
            {
                "type": "response.function_call_arguments.done",
                "item_id": item_id,
                "output_index": index,
                "name": name,
                "arguments": arguments,
            }
        )

    def error(self, error: SwitchboardError) -> Built:
        code = error.code if error.code is not None else str(error.http_status)
        return self.error_event(code, error.message, error.param, error_type(error))

    def error_event(
        self, code: str | None, message: str, param: str | None, kind: str = "server_error"
    ) -> Built:
        """OpenAI's error event (`code`, `message`, `param` at its top, as the openai SDK
        reads it) that is also the Open Responses spec's (the same in `error`, with the
        error's `type`)."""
        payload = {"type": kind, "code": code, "message": message, "param": param}
        return self._event(
            {"type": "error", "code": code, "message": message, "param": param, "error": payload}
        )


def response_error(error: SwitchboardError) -> Body:
    """A failed response's `error`, in the codes OpenAI's `ResponseError` knows (the
    Codex CLI retries `server_error` and `rate_limit_exceeded`)."""
    if error.http_status == 503 or error.http_status == 429:
        code = "rate_limit_exceeded"
    elif 400 <= error.http_status < 500:
        code = "invalid_prompt"
    else:
        code = "server_error"
    return {"code": code, "message": error.message}


def item_shell(item: Body) -> Body:
    """An output item as `response.output_item.added` shows it: nothing generated yet."""
    kind = item["type"]
    if kind == "message":
        return {**item, "status": "in_progress", "content": []}
    if kind == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return {**item, "status": "in_progress", "content": []}


def part_shell(part: Body) -> Body:
    """A content part as `response.content_part.added` shows it: empty."""
    if part["type"] == "output_text":
        return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return {**part, "text": ""}


def replay_item(events: Events, index: int, item: Body) -> list[Event]:
    """Every event of one finished output item, its text in one delta per part."""
    out: list[Event] = [events.item_added(index, item_shell(item))]
    kind, item_id = item["type"], item["id"]
    if kind == "function_call":
        out.append(events.arguments_delta(item_id, index, item["arguments"]))
        out.append(events.arguments_done(item_id, index, item["name"], item["arguments"]))
    else:
        for j, part in enumerate(item.get("content") or ()):
            out.append(events.part(False, item_id, index, j, part_shell(part)))
            text = part_text(part)
            if kind == "message":
                logprobs = part.get("logprobs")
                out.append(_at(events.text_delta(item_id, index, text, logprobs), j))
                out.append(_at(events.text_done(item_id, index, text, logprobs), j))
            else:
                out.append(_at(events.reasoning_delta(item_id, index, text), j))
                out.append(_at(events.reasoning_done(item_id, index, text), j))
            out.append(events.part(True, item_id, index, j, part))
    out.append(events.item_done(index, item))
    return out


def _at(event: Built, content_index: int) -> Built:
    event[1]["content_index"] = content_index
    return event


def replay(response: Body) -> list[Event]:
    """A stored response as the events a stream of it would have sent: created and in
    progress, each item whole, then the terminal event of its status (none while it is
    still queued or in progress)."""
    events = Events()
    status = response["status"]
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    out: list[Event] = [events.lifecycle("response.created", opening)]
    out.append(events.lifecycle("response.in_progress", opening))
    for index, item in enumerate(response.get("output") or ()):
        out.extend(replay_item(events, index, item))
    terminal = {
        "completed": "response.completed",
        "incomplete": "response.incomplete",
        "cancelled": "response.incomplete",
        "failed": "response.failed",
    }.get(status)
    if status == "failed":
        error = response.get("error") or {}
        out.append(events.error_event(error.get("code"), str(error.get("message")), None))
    if terminal is not None:
        out.append(events.lifecycle(terminal, response))
    return out
