"""The conversations' store contract: a conversation (its object, as JSON) and its items in
order, on the same backing store as the stored responses (`--responses-store`: the
SQLite file, or the Redis every replica shares) and under the same bounds, counted apart.

Every implementation (`app.store.sqlite_conversations`, `app.store.redis_conversations`)
keeps these rules, and the tests hold both to them (tests/unit/test_conversation_store.py):

- A conversation is its tenant's (`app.tenants`): every call names the tenant with the
  id, and another tenant's conversation is, to it, one that does not exist.
- `create(tenant, id, data, items)` stores a conversation with its first items;
  `get(tenant, id)` is its object (None: never stored, expired, evicted, deleted, or
  another tenant's); `update(tenant, id, data)` replaces the object and says whether
  there was one; `delete(tenant, id)` removes the conversation and its items and says
  whether there was one.
- `append(id, items)` adds items at the end, all or none, in one transaction; False if
  the conversation is gone. An item's id is unique in its conversation: an append (or a
  create) that repeats one, of the conversation's or within itself, is refused whole
  (`InvalidRequest` naming the ids). `items(id, after=, limit=, order=)` is a page of them
  (`asc` oldest first, `desc` newest first, after the item `after`) and whether more
  follow, None if the conversation is gone; `after` that is not one of its items is an
  `InvalidRequest` (param `after`). `item(id, item_id)` is one item; `delete_item` removes
  one and says whether it was there.
- A conversation lives `ttl_s` seconds from its last write (any of the above but reads);
  past that it reads as gone, and the next write removes it. A conversation's size
  (object and items) stays within `max_record_bytes` (below the store's bound), its
  tenant's conversations within the tenant's `quota` (0: none of its own), and all
  conversations within `max_bytes`: a write that would exceed either first evicts the
  tenant's own conversations written longest ago, whole, never another tenant's; a write
  that cannot fit so is refused (`ResourceExhausted`, code `store_full`), as is one the
  backing store refuses for lack of room.
- Conversations stored before tenants are the default tenant's: the store moves them
  into its order and totals when it is first opened.
- A backing store that cannot be reached raises `Unavailable` (code `store_unavailable`),
  for that call only.
- Concurrent writers (coroutines, processes, replicas) never corrupt the order, the ids
  or the bookkeeping: each write is one transaction (SQLite) or one script (Redis).

Items are opaque JSON objects with a string `id`; what they hold is the protocol's
(`app.protocols.openai.conversations`). Time is the caller's clock, as the response
store's. No framework imports; blocking I/O never runs on the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

from app.errors import InvalidRequest

Item = dict[str, Any]
Order = Literal["asc", "desc"]


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Item]
    has_more: bool


class ConversationStore(Protocol):
    ttl_s: float
    max_bytes: int
    max_record_bytes: int

    async def create(
        self, tenant: str, key: str, data: bytes, items: Sequence[Item], *, quota: int = 0
    ) -> None: ...

    async def get(self, tenant: str, key: str) -> bytes | None: ...

    async def update(self, tenant: str, key: str, data: bytes, *, quota: int = 0) -> bool: ...

    async def delete(self, tenant: str, key: str) -> bool: ...

    async def append(
        self, tenant: str, key: str, items: Sequence[Item], *, quota: int = 0
    ) -> bool: ...

    async def items(
        self, tenant: str, key: str, *, after: str | None, limit: int, order: Order
    ) -> Page | None: ...

    async def item(self, tenant: str, key: str, item_id: str) -> Item | None: ...

    async def delete_item(self, tenant: str, key: str, item_id: str) -> bool: ...

    async def close(self) -> None: ...


def encoded(items: Sequence[Item]) -> list[tuple[str, bytes]]:
    """Each item's id and bytes; a repeated id among them is refused."""
    out = [(str(item["id"]), orjson.dumps(item)) for item in items]
    ids = [item_id for item_id, _ in out]
    if len(set(ids)) != len(ids):
        raise repeated(sorted({i for i in ids if ids.count(i) > 1}))
    return out


def repeated(ids: Sequence[str]) -> InvalidRequest:
    return InvalidRequest(f"The conversation already holds item(s) with id {', '.join(ids)}")


def unknown_after(after: str) -> InvalidRequest:
    return InvalidRequest(f"No item '{after}' in this conversation", param="after")
