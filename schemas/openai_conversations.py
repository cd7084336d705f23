"""The OpenAI Conversations API as pydantic models: the request bodies of
`/v1/conversations` and its items (validated here: types only; the items themselves are
read by `app.protocols.openai.conversations`, so that an error names the item and field),
and the objects /openapi.json documents for its answers (documentation only, open to
extra keys as OpenAI's own are).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from schemas.openai_responses import InputItem


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ConversationCreate(_Body):
    """POST /v1/conversations: its first items (up to 20) and its metadata."""

    items: list[InputItem] | None = None
    metadata: dict[str, str] | None = None


class ConversationUpdate(_Body):
    """POST /v1/conversations/{id}: its metadata, replaced."""

    metadata: dict[str, str]


class ConversationItemsCreate(_Body):
    """POST /v1/conversations/{id}/items: 1 to 20 items, added at the end."""

    items: list[InputItem]


class Conversation(_Open):
    id: str
    object: Literal["conversation"]
    created_at: int
    metadata: dict[str, str]


class ConversationDeleted(_Open):
    id: str
    object: Literal["conversation.deleted"]
    deleted: Literal[True]


class ConversationItemList(_Open):
    """A page of a conversation's items (input and output items of the Responses API, each
    with its id)."""

    object: Literal["list"]
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
