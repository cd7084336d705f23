"""The OpenAI Conversations API's rules, sans-IO: what a conversation is, what may be put
in it, and the shapes it is answered in.

- a conversation is `{"id": "conv_...", "object": "conversation", "created_at",
  "metadata"}`; its items are Responses input and output items in their normal form
  (`app.protocols.openai.responses.items.read_input`: each with its id and, a message, a
  call or an output, its status), in the order they were added;
- `POST /v1/conversations` takes `items` (at most `MAX_ADDED`) and `metadata` (OpenAI's
  bound, as a response's); `POST /v1/conversations/{id}/items` takes 1 to `MAX_ADDED`
  items; `POST /v1/conversations/{id}` replaces `metadata`; errors name the field
  (`items.3.content`, `metadata`);
- a list of items is OpenAI's cursor page (`first_id`, `last_id`, `has_more`); a deleted
  conversation is `conversation.deleted`; an item deleted answers the conversation;
- `conversation` on `POST /v1/responses` names one, by id or as `{"id"}`; the response
  then continues its items and, once it has ended, adds its input and output to them.

An unknown (or expired, or evicted) conversation or item is a 404 naming `conversation_id`
or `item_id` (`conversation` on a response).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from app.errors import InvalidRequest, NotFound
from app.protocols.openai.responses.items import Item, new_id, read_input
from app.protocols.openai.responses.request import check_metadata

MAX_ADDED = 20  # items one call may add, as OpenAI allows

Body = dict[str, Any]


def new_conversation(
    items: Sequence[Any] | None, metadata: Mapping[str, str] | None, *, created_at: int
) -> tuple[Body, list[Item]]:
    """A conversation created with its first items, both checked."""
    check_metadata(metadata)
    first = added(items or (), allow_none=True)
    body = {
        "id": new_id("conv"),
        "object": "conversation",
        "created_at": created_at,
        "metadata": dict(metadata or {}),
    }
    return body, first


def added(items: Sequence[Any], *, allow_none: bool = False) -> list[Item]:
    """Items a call adds, in normal form."""
    if not items and not allow_none:
        raise InvalidRequest("items: at least one item is required", param="items")
    if len(items) > MAX_ADDED:
        raise InvalidRequest(f"items: at most {MAX_ADDED} items at a time", param="items")
    return read_input(list(items), "items")


def with_metadata(conversation: Body, metadata: Mapping[str, str]) -> Body:
    check_metadata(metadata)
    return {**conversation, "metadata": dict(metadata)}


def deleted(conversation_id: str) -> Body:
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


def page(items: Sequence[Item], has_more: bool) -> Body:
    return {
        "object": "list",
        "data": list(items),
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }


def encode(conversation: Body) -> bytes:
    return orjson.dumps(conversation)


def decode(data: bytes) -> Body:
    return dict(orjson.loads(data))


def conversation_id(value: str | Mapping[str, Any]) -> str:
    """`conversation` on a response: an id, or `{"id": ...}`."""
    found = value.get("id") if isinstance(value, Mapping) else value
    if not isinstance(found, str) or not found:
        raise InvalidRequest(
            'conversation is a conversation id or {"id": ...}', param="conversation"
        )
    return found


def not_found(conversation_id: str, param: str = "conversation_id") -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id}' not found.", param=param)


def item_not_found(item_id: str) -> NotFound:
    return NotFound(f"Item with id '{item_id}' not found.", param="item_id")
