"""Input items: what a client sends as `input` (and what a stored conversation holds), read
into one normal form, and that form turned into the conversation core's neutral messages.

`read_input(value)` checks a body's `input` (a string, or a list of items) and gives each
item its normal form with an id (and a message, call or output its `status`, completed),
as `GET /v1/responses/{id}/input_items` lists them:

- `message` (`type` may be left out): role user, assistant, system or developer; content
  a string (one `input_text` part, or `output_text` for an assistant) or a list of parts
  `input_text`, `output_text`, `refusal`, `input_image` (a `data:` URL: the server fetches
  nothing, as the other APIs here); an assistant's `phase` (`commentary`, `final_answer`)
  is kept;
- `function_call` (`call_id`, `name`, `arguments` as JSON text): a call the model made;
- `function_call_output` (`call_id`, `output`: a string or a list of parts): its answer;
- `reasoning`: reasoning text given back (its `content` parts' text);
- `compaction`: what `POST /v1/responses/compact` made of earlier turns (`compaction_item`):
  its summary, read back as an assistant's turn.

Every error is an `InvalidRequest` naming the item and field as the client wrote them
(`input.2.call_id`). Output items of a stored response (`message`, `function_call`,
`reasoning`) are already in this form, so a conversation continued from a stored
response is the stored items plus the new ones, read by `messages(...)` alike.

`messages(items, info, ...)` groups them as a chat template expects them: an assistant's
text, reasoning and calls of one turn form one assistant message (the calls as its
`tool_calls`), each `function_call_output` a `tool` message. It decodes images, so it is
blocking: call it where the conversation is planned, off the event loop.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from app.engine.base import ChatMessage, EngineInfo, ImagePart, TextPart
from app.engine.tools import ToolCall
from app.errors import InvalidRequest
from app.protocols.conversation.bound import PromptBound
from app.protocols.conversation.images import PromptImages
from app.wire_text import load_json

Item = dict[str, Any]
ROLES = ("user", "assistant", "system", "developer")
# An assistant message's label (kept and given back, never shown to the model).
PHASES = ("commentary", "final_answer")
_TEXT_PARTS = ("input_text", "output_text", "refusal")
_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "compaction": "cmp",
}
_KINDS = ", ".join(_PREFIXES)
# A compaction's `encrypted_content`: this mark, then the summary's UTF-8 in base64url.
# Opaque to clients, not secret (the summary is text a client could send as a message).
_COMPACTED = "sbc1."
# How a compaction's summary reads to the model, as the assistant's turn it stands for.
SUMMARY_HEAD = "A summary of the conversation before this point:\n"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _fail(where: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: {message}", param=where)


def compaction_item(summary: str) -> Item:
    """The item a compaction's `summary` travels in, as clients give it back."""
    data = base64.urlsafe_b64encode(summary.encode("utf-8", "surrogatepass")).decode("ascii")
    return {"id": new_id("cmp"), "type": "compaction", "encrypted_content": _COMPACTED + data}


def compacted_summary(item: Item, where: str = "input") -> str:
    """The summary a `compaction` item carries; an `InvalidRequest` naming `where` if
    this server did not make it."""
    content = item.get("encrypted_content")
    if isinstance(content, str) and content.startswith(_COMPACTED):
        try:
            raw = base64.urlsafe_b64decode(content[len(_COMPACTED) :].encode("ascii"))
            return raw.decode("utf-8", "surrogatepass")
        except (ValueError, UnicodeError):
            pass
    raise _fail(
        f"{where}.encrypted_content",
        "is not a compaction made by this server (POST /v1/responses/compact)",
    )


def _string(item: Item, key: str, where: str, *, empty: bool = True) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (not empty and not value):
        kind = "a string" if empty else "a non-empty string"
        raise _fail(f"{where}.{key}", f"must be {kind}")
    return value


def _part(part: Any, where: str, role: str) -> Item:
    if not isinstance(part, dict):
        raise _fail(where, "a content part must be an object")
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        key = "refusal" if kind == "refusal" else "text"
        return {"type": kind, key: _string(part, key, where)}
    if kind == "input_image":
        if role == "assistant":
            raise _fail(f"{where}.type", "an assistant message holds no images")
        url = part.get("image_url")
        if not isinstance(url, str):
            raise _fail(
                f"{where}.image_url",
                "an input_image needs image_url (a data:<mime>;base64,... URL; file_id is "
                "not served)",
            )
        return {"type": "input_image", "image_url": url, "detail": part.get("detail", "auto")}
    raise _fail(
        f"{where}.type",
        f"content part type {kind!r} is not one of {(*_TEXT_PARTS, 'input_image')}",
    )


def _content(value: Any, where: str, role: str) -> list[Item]:
    if isinstance(value, str):
        kind = "output_text" if role == "assistant" else "input_text"
        return [{"type": kind, "text": value}]
    if not isinstance(value, list):
        raise _fail(where, "must be a string or a list of content parts")
    return [_part(part, f"{where}.{j}", role) for j, part in enumerate(value)]


def _arguments(item: Item, where: str) -> str:
    arguments = _string(item, "arguments", where)
    try:
        load_json(arguments or "{}")
    except ValueError as exc:
        raise _fail(f"{where}.arguments", "is not JSON text") from exc
    return arguments


def _item(item: Any, where: str) -> Item:
    if not isinstance(item, dict):
        raise _fail(where, "an input item must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise _fail(f"{where}.role", f"must be one of {', '.join(ROLES)}")
        if "content" not in item:
            raise _fail(f"{where}.content", "is required")
        message = {
            "type": "message",
            "role": role,
            "content": _content(item["content"], f"{where}.content", role),
            "status": "completed",
        }
        phase = item.get("phase")
        if phase is not None:
            if role != "assistant" or phase not in PHASES:
                raise _fail(f"{where}.phase", f"an assistant message's phase is one of {PHASES}")
            message["phase"] = phase
        return message
    if kind == "function_call":
        call = {
            "type": "function_call",
            "call_id": _string(item, "call_id", where, empty=False),
            "name": _string(item, "name", where, empty=False),
            "arguments": _arguments(item, where),
            "status": "completed",
        }
        if isinstance(item.get("namespace"), str):
            call["namespace"] = item["namespace"]
        return call
    if kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            output = _content(output, f"{where}.output", "tool")
        elif not isinstance(output, str):
            raise _fail(f"{where}.output", "must be a string or a list of content parts")
        return {
            "type": "function_call_output",
            "call_id": _string(item, "call_id", where, empty=False),
            "output": output,
            "status": "completed",
        }
    if kind == "reasoning":
        content = item.get("content") or []
        if not isinstance(content, list):
            raise _fail(f"{where}.content", "must be a list of reasoning_text parts")
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise _fail(f"{where}.content.{j}", "must be {type: reasoning_text, text}")
            texts.append({"type": "reasoning_text", "text": part["text"]})
        return {"type": "reasoning", "summary": [], "content": texts}
    if kind == "compaction":
        compacted_summary(item, where)
        return {"type": "compaction", "encrypted_content": item["encrypted_content"]}
    raise _fail(f"{where}.type", f"input item type {kind!r} is not one of {_KINDS}")


def read_input(value: str | Sequence[Any] | None, field: str = "input") -> list[Item]:
    """A body's `input` (or another `field` of items) in normal form, each item with its
    id: the one it came with (an output item given back keeps its own), else a fresh one."""
    if value is None:
        return []
    items: list[Item]
    if isinstance(value, str):
        text = [{"type": "input_text", "text": value}]
        items = [{"type": "message", "role": "user", "content": text, "status": "completed"}]
    else:
        items = []
        for i, given in enumerate(value):
            item = _item(given, f"{field}.{i}")
            if isinstance(given.get("id"), str) and given["id"]:
                item["id"] = given["id"]
            items.append(item)
    return [
        {"id": item.pop("id", None) or new_id(_PREFIXES[item["type"]]), **item} for item in items
    ]


# -- normal form -> neutral messages ------------------------------------------------------


def bound_item(bound: PromptBound, item: Any) -> None:
    """What an input item, as the client sent it, adds to admission's bound
    (`app.protocols.conversation.bound`), as `messages` will write it into the prompt;
    whatever its kind, never raising (a bad item is refused when it is read)."""
    if not isinstance(item, dict):
        return
    kind = item.get("type")
    if kind == "compaction":
        try:
            summary = compacted_summary(item)
        except InvalidRequest:
            summary = str(item.get("encrypted_content"))
        bound.text(SUMMARY_HEAD + summary)
    elif kind == "function_call":
        bound.call(item.get("name"), item.get("arguments"))
    for key in ("content", "output"):  # a message's, a reasoning's, a call output's
        value = item.get(key)
        if isinstance(value, str):
            bound.text(value)
        elif isinstance(value, list):
            for part in value:
                if isinstance(part, dict):
                    text = part.get("text") or part.get("refusal")
                    bound.text(text if isinstance(text, str) else None)


def _text(parts: Sequence[Item]) -> str:
    return "".join(p.get("text") or p.get("refusal") or "" for p in parts)


def _parts(
    parts: Sequence[Item], images: PromptImages, where: str
) -> tuple[TextPart | ImagePart, ...]:
    out: list[TextPart | ImagePart] = []
    for j, part in enumerate(parts):
        if part["type"] == "input_image":
            out.append(ImagePart(images.read_url(part["image_url"], f"{where}.{j}.image_url")))
        else:
            out.append(TextPart(part.get("text") or part.get("refusal") or ""))
    return tuple(out)


class _Turns:
    """Messages being built; an assistant turn stays open for the calls that follow it."""

    def __init__(self) -> None:
        self.done: list[ChatMessage] = []
        self.text: list[str] | None = None  # the open assistant turn's text, if one is open
        self.calls: list[ToolCall] = []
        self.reasoning: list[str] = []

    def assistant(self) -> None:
        if self.text is None:
            self.text = []

    def close(self) -> None:
        if self.text is None and not self.reasoning:
            return
        self.done.append(
            ChatMessage(
                role="assistant",
                parts=(TextPart("".join(self.text or ())),) if self.text else (),
                tool_calls=tuple(self.calls),
                reasoning="".join(self.reasoning) or None,
            )
        )
        self.text, self.calls, self.reasoning = None, [], []

    def add(self, message: ChatMessage) -> None:
        self.close()
        self.done.append(message)


def messages(
    items: Sequence[Item], info: EngineInfo, where: Callable[[int], str]
) -> list[ChatMessage]:
    """`items` (normal form) as neutral messages; `where(i)` names item i for errors. A
    call's output answers a call made before it in the conversation (OpenAI's rule: a
    continuation that answers a call its response never made fails)."""
    turns = _Turns()
    images = PromptImages(info)
    called: set[str] = set()
    for i, item in enumerate(items):
        kind = item["type"]
        if (kind == "message" and item["role"] == "assistant") or kind == "compaction":
            if turns.calls:  # a new assistant message after calls: a new turn
                turns.close()
            turns.assistant()
            assert turns.text is not None
            if kind == "compaction":
                turns.text.append(SUMMARY_HEAD + compacted_summary(item, where(i)))
            else:
                turns.text.append(_text(item["content"]))
        elif kind == "message":
            parts = _parts(item["content"], images, f"{where(i)}.content")
            turns.add(ChatMessage(role=item["role"], parts=parts))
        elif kind == "function_call":
            turns.assistant()
            turns.calls.append(ToolCall(item["call_id"], item["name"], item["arguments"] or "{}"))
            called.add(item["call_id"])
        elif kind == "function_call_output":
            if item["call_id"] not in called:
                raise _fail(
                    f"{where(i)}.call_id",
                    f"no function call with call_id {item['call_id']!r} comes before this output",
                )
            output = item["output"]
            parts = (
                (TextPart(output),)
                if isinstance(output, str)
                else _parts(output, images, f"{where(i)}.output")
            )
            turns.add(ChatMessage(role="tool", parts=parts, tool_call_id=item["call_id"]))
        elif kind == "reasoning":
            if turns.text is not None and (turns.text or turns.calls):
                turns.close()
            turns.reasoning.append("".join(p["text"] for p in item.get("content") or ()))
    turns.close()
    return turns.done
