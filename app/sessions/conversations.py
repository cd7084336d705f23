"""The Conversations API on its store, for any transport (`app.routes.apis.conversations`),
and what a response made in a conversation reads of it and adds to it.

One `Conversations` per app (`app.objects.AppObjects`), over the conversations'
store at `--responses-store` (SQLite by default, the replicas' Redis): what one replica
writes, any other reads. Every call names its principal (`app.tenants.Principal`): a
conversation is its tenant's, another tenant's is not found, and its writes count
against the tenant's `stored_bytes`. The rules and shapes are
`app.protocols.openai.conversations`'s; this module runs them against the store, where
every write is one transaction.

A response with `conversation` starts from the conversation's items (`context`) and, once
it has ended, adds its input and output to them (`extend`), before its terminal event, as
a stored response is written: a client that has seen `response.completed` lists them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from app.errors import InvalidRequest
from app.protocols.openai import conversations as rules
from app.protocols.openai.responses.items import Item
from app.store.conversations import ConversationStore, Order
from app.tenants import Principal

_CONTEXT_PAGE = 1000  # items read at a time for a response's context


class Conversations:
    def __init__(self, store: ConversationStore) -> None:
        self.store = store

    async def create(
        self, principal: Principal, items: Sequence[Any] | None, metadata: Mapping[str, str] | None
    ) -> rules.Body:
        conversation, first = rules.new_conversation(items, metadata, created_at=int(time.time()))
        with _named("items"):
            await self.store.create(
                principal.tenant,
                conversation["id"],
                rules.encode(conversation),
                first,
                quota=principal.limits.stored_bytes,
            )
        return conversation

    async def retrieve(self, principal: Principal, conversation_id: str) -> rules.Body:
        data = await self.store.get(principal.tenant, conversation_id)
        if data is None:
            raise rules.not_found(conversation_id)
        return rules.decode(data)

    async def update(
        self, principal: Principal, conversation_id: str, metadata: Mapping[str, str]
    ) -> rules.Body:
        updated = rules.with_metadata(await self.retrieve(principal, conversation_id), metadata)
        encoded = rules.encode(updated)
        quota = principal.limits.stored_bytes
        if not await self.store.update(principal.tenant, conversation_id, encoded, quota=quota):
            raise rules.not_found(conversation_id)
        return updated

    async def delete(self, principal: Principal, conversation_id: str) -> rules.Body:
        if not await self.store.delete(principal.tenant, conversation_id):
            raise rules.not_found(conversation_id)
        return rules.deleted(conversation_id)

    async def add_items(
        self, principal: Principal, conversation_id: str, items: Sequence[Any]
    ) -> rules.Body:
        new = rules.added(items)
        with _named("items"):
            if not await self._append(principal, conversation_id, new):
                raise rules.not_found(conversation_id)
        return rules.page(new, False)

    async def list_items(
        self,
        principal: Principal,
        conversation_id: str,
        *,
        after: str | None,
        limit: int,
        order: Order,
    ) -> rules.Body:
        found = await self.store.items(
            principal.tenant, conversation_id, after=after, limit=limit, order=order
        )
        if found is None:
            raise rules.not_found(conversation_id)
        return rules.page(found.items, found.has_more)

    async def item(self, principal: Principal, conversation_id: str, item_id: str) -> Item:
        found = await self.store.item(principal.tenant, conversation_id, item_id)
        if found is None:
            await self.retrieve(principal, conversation_id)  # the conversation's 404 first
            raise rules.item_not_found(item_id)
        return found

    async def delete_item(
        self, principal: Principal, conversation_id: str, item_id: str
    ) -> rules.Body:
        if not await self.store.delete_item(principal.tenant, conversation_id, item_id):
            await self.retrieve(principal, conversation_id)
            raise rules.item_not_found(item_id)
        return await self.retrieve(principal, conversation_id)

    # -- a response in a conversation -------------------------------------------------

    async def context(self, principal: Principal, conversation_id: str) -> list[Item]:
        """Every item of the conversation, oldest first (a 404 naming `conversation`)."""
        items: list[Item] = []
        after: str | None = None
        while True:
            found = await self.store.items(
                principal.tenant, conversation_id, after=after, limit=_CONTEXT_PAGE, order="asc"
            )
            if found is None:
                raise rules.not_found(conversation_id, "conversation")
            items.extend(found.items)
            if not found.has_more:
                return items
            after = found.items[-1]["id"]

    async def extend(
        self, principal: Principal, conversation_id: str, items: Sequence[Item]
    ) -> None:
        """A response's input and output, added once it has ended."""
        with _named("input"):
            if not await self._append(principal, conversation_id, items):
                raise rules.not_found(conversation_id, "conversation")

    async def _append(
        self, principal: Principal, conversation_id: str, items: Sequence[Item]
    ) -> bool:
        return await self.store.append(
            principal.tenant, conversation_id, items, quota=principal.limits.stored_bytes
        )

    async def close(self) -> None:
        await self.store.close()


@contextmanager
def _named(param: str) -> Iterator[None]:
    """Names the field a store's refusal of repeated ids is about."""
    try:
        yield
    except InvalidRequest as exc:
        if exc.param is None:
            exc.param = param
        raise
