"""The conversations' store on SQLite: tables of their own in the response store's file
(`--responses-store`), so one file holds a replica's stored state.

    conversations        id, expires, size (the object's and its items' bytes), data,
                         tenant
    conversation_items   (conversation, seq) -> id, size, data; (conversation, id) unique
    conversations_total  the bytes every conversation holds
    conversation_tenants the bytes each tenant's conversations hold

Each write is one `BEGIN IMMEDIATE` transaction, in the file's own thread
(`app.store.sqlite.SqliteFile`): expired conversations out, the change checked (the
conversation there and the caller's tenant's, its ids new, its size within one record's
bound), the tenant's conversations written longest ago out until the change fits its
quota and the store's bound, then the change, the conversation's expiry renewed and the
totals kept, so writers in several processes keep them exact. A page of items is read
in one read transaction, a snapshot. A file written before tenants gains the `tenant`
column as it opens, its conversations the default tenant's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from functools import partial

import orjson

from app.store.conversations import Item, Order, Page, encoded, repeated, unknown_after
from app.store.sqlite import SqliteBoundedStore, TenantTables, transaction
from app.tenants import DEFAULT_TENANT

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, expires REAL NOT NULL, size INTEGER NOT NULL, data BLOB NOT NULL,
    tenant TEXT NOT NULL DEFAULT '{default}'
);
CREATE INDEX IF NOT EXISTS conversations_by_expiry ON conversations (expires);
CREATE TABLE IF NOT EXISTS conversation_items (
    conversation TEXT NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL,
    size INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (conversation, seq)
);
CREATE UNIQUE INDEX IF NOT EXISTS conversation_items_by_id
    ON conversation_items (conversation, id);
CREATE TABLE IF NOT EXISTS conversations_total (
    one INTEGER PRIMARY KEY CHECK (one = 1), bytes INTEGER NOT NULL
);
INSERT OR IGNORE INTO conversations_total VALUES (1, 0);
CREATE TABLE IF NOT EXISTS conversation_tenants (tenant TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
""".replace("{default}", DEFAULT_TENANT)
_TABLES = TenantTables(_SCHEMA, "conversation-store", "conversations", "conversation_tenants")


class SqliteConversations(SqliteBoundedStore):
    TABLES = _TABLES

    # -- the contract (app.store.conversations) ----------------------------------------

    async def create(
        self, tenant: str, key: str, data: bytes, items: Sequence[Item], *, quota: int = 0
    ) -> None:
        rows = encoded(items)
        size = len(data) + sum(len(row) for _, row in rows)
        quota = self._quota(quota)
        self._check(size, quota)

        def create(db: sqlite3.Connection, now: float) -> None:
            with transaction(db):
                total = self._expire(db, now) - _drop(db, key)
                total = self._fit(db, tenant, total, size, quota, keep=key)
                db.execute(
                    "INSERT INTO conversations VALUES (?, ?, ?, ?, ?)",
                    (key, now + self.ttl_s, size, data, tenant),
                )
                _insert(db, key, 0, rows)
                _TABLES.add_to_tenant(db, tenant, size)
                _set_total(db, total + size)

        await self._file.run(partial(create, now=self._clock()))

    async def get(self, tenant: str, key: str) -> bytes | None:
        now = self._clock()

        def get(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT data FROM conversations WHERE id = ? AND tenant = ? AND expires > ?",
                (key, tenant, now),
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._file.run(get)

    async def update(self, tenant: str, key: str, data: bytes, *, quota: int = 0) -> bool:
        quota = self._quota(quota)

        def update(db: sqlite3.Connection, now: float) -> bool:
            with transaction(db):
                total = self._expire(db, now)
                row = _live(db, tenant, key, now)
                if row is None:
                    return False
                size, old = row
                grown = len(data) - old
                self._check(size + grown, quota)
                total = self._fit(db, tenant, total, grown, quota, keep=key)
                db.execute(
                    "UPDATE conversations SET data = ?, size = ?, expires = ? WHERE id = ?",
                    (data, size + grown, now + self.ttl_s, key),
                )
                _TABLES.add_to_tenant(db, tenant, grown)
                _set_total(db, total + grown)
                return True

        return await self._file.run(partial(update, now=self._clock()))

    async def delete(self, tenant: str, key: str) -> bool:
        def delete(db: sqlite3.Connection, now: float) -> bool:
            with transaction(db):
                total = self._expire(db, now)
                owned = db.execute(
                    "SELECT expires > ? FROM conversations WHERE id = ? AND tenant = ?",
                    (now, key, tenant),
                ).fetchone()
                if owned is None:
                    return False
                _set_total(db, total - _drop(db, key))
                return bool(owned[0])

        return await self._file.run(partial(delete, now=self._clock()))

    async def append(self, tenant: str, key: str, items: Sequence[Item], *, quota: int = 0) -> bool:
        rows = encoded(items)
        added = sum(len(row) for _, row in rows)
        quota = self._quota(quota)

        def append(db: sqlite3.Connection, now: float) -> bool:
            with transaction(db):
                total = self._expire(db, now)
                row = _live(db, tenant, key, now)
                if row is None:
                    return False
                marks = ",".join("?" * len(rows))
                held = db.execute(
                    f"SELECT id FROM conversation_items WHERE conversation = ? AND id IN ({marks})",
                    (key, *(item_id for item_id, _ in rows)),
                ).fetchall()
                if held:
                    raise repeated(sorted(item_id for (item_id,) in held))
                self._check(row[0] + added, quota)
                total = self._fit(db, tenant, total, added, quota, keep=key)
                last = db.execute(
                    "SELECT COALESCE(MAX(seq), -1) FROM conversation_items WHERE conversation = ?",
                    (key,),
                ).fetchone()[0]
                _insert(db, key, last + 1, rows)
                db.execute(
                    "UPDATE conversations SET size = size + ?, expires = ? WHERE id = ?",
                    (added, now + self.ttl_s, key),
                )
                _TABLES.add_to_tenant(db, tenant, added)
                _set_total(db, total + added)
                return True

        return await self._file.run(partial(append, now=self._clock()))

    async def items(
        self, tenant: str, key: str, *, after: str | None, limit: int, order: Order
    ) -> Page | None:
        now = self._clock()

        def page(db: sqlite3.Connection) -> Page | None:
            db.execute("BEGIN")  # one snapshot for the checks and the page
            try:
                if _live(db, tenant, key, now) is None:
                    return None
                start = -1 if order == "asc" else 2**62
                if after is not None:
                    found = db.execute(
                        "SELECT seq FROM conversation_items WHERE conversation = ? AND id = ?",
                        (key, after),
                    ).fetchone()
                    if found is None:
                        raise unknown_after(after)
                    start = found[0]
                beyond, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
                rows = db.execute(
                    "SELECT data FROM conversation_items WHERE conversation = ? "
                    f"AND seq {beyond} ? ORDER BY seq {direction} LIMIT ?",
                    (key, start, limit + 1),
                ).fetchall()
            finally:
                db.execute("COMMIT")
            return Page([orjson.loads(data) for (data,) in rows[:limit]], len(rows) > limit)

        return await self._file.run(page)

    async def item(self, tenant: str, key: str, item_id: str) -> Item | None:
        now = self._clock()

        def item(db: sqlite3.Connection) -> Item | None:
            row = db.execute(
                "SELECT i.data FROM conversation_items i JOIN conversations c "
                "ON c.id = i.conversation WHERE c.id = ? AND c.tenant = ? AND c.expires > ? "
                "AND i.id = ?",
                (key, tenant, now, item_id),
            ).fetchone()
            return None if row is None else dict(orjson.loads(row[0]))

        return await self._file.run(item)

    async def delete_item(self, tenant: str, key: str, item_id: str) -> bool:
        def delete(db: sqlite3.Connection, now: float) -> bool:
            with transaction(db):
                total = self._expire(db, now)
                if _live(db, tenant, key, now) is None:
                    return False
                row = db.execute(
                    "SELECT size FROM conversation_items WHERE conversation = ? AND id = ?",
                    (key, item_id),
                ).fetchone()
                if row is None:
                    return False
                db.execute(
                    "DELETE FROM conversation_items WHERE conversation = ? AND id = ?",
                    (key, item_id),
                )
                db.execute(
                    "UPDATE conversations SET size = size - ?, expires = ? WHERE id = ?",
                    (row[0], now + self.ttl_s, key),
                )
                _TABLES.add_to_tenant(db, tenant, -row[0])
                _set_total(db, total - row[0])
                return True

        return await self._file.run(partial(delete, now=self._clock()))

    async def close(self) -> None:
        await self._file.close()

    # -- bookkeeping -------------------------------------------------------------------

    def _expire(self, db: sqlite3.Connection, now: float) -> int:
        """Expired conversations out; the total left."""
        total = int(db.execute("SELECT bytes FROM conversations_total").fetchone()[0])
        for (key,) in db.execute(
            "SELECT id FROM conversations WHERE expires <= ?", (now,)
        ).fetchall():
            total -= _drop(db, key)
        return total

    def _fit(
        self, db: sqlite3.Connection, tenant: str, total: int, grown: int, quota: int, *, keep: str
    ) -> int:
        """The tenant's conversations written longest ago (but `keep`) out until `grown`
        more bytes fit its quota and the store's bound; the total left."""
        own = _TABLES.tenant_total(db, tenant)
        kept = db.execute(
            "SELECT size FROM conversations WHERE id = ? AND tenant = ?", (keep, tenant)
        ).fetchone()
        if total - own + (kept[0] if kept else 0) + grown > self.max_bytes:
            # All or nothing: even all of its own could not make the room.
            raise self._no_room(grown)
        while total + grown > self.max_bytes or own + grown > quota:
            oldest = db.execute(
                "SELECT id FROM conversations WHERE tenant = ? AND id != ? "
                "ORDER BY expires, rowid LIMIT 1",
                (tenant, keep),
            ).fetchone()
            if oldest is None:
                raise self._no_room(grown)
            freed = _drop(db, oldest[0])
            total, own = total - freed, own - freed
        return total


def _live(db: sqlite3.Connection, tenant: str, key: str, now: float) -> tuple[int, int] | None:
    """A live conversation of `tenant`: its size and its object's size."""
    row = db.execute(
        "SELECT size, LENGTH(data) FROM conversations WHERE id = ? AND tenant = ? AND expires > ?",
        (key, tenant, now),
    ).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def _drop(db: sqlite3.Connection, key: str) -> int:
    """A conversation and its items out (its tenant's total kept); the bytes they held."""
    row = db.execute("SELECT size, tenant FROM conversations WHERE id = ?", (key,)).fetchone()
    db.execute("DELETE FROM conversation_items WHERE conversation = ?", (key,))
    db.execute("DELETE FROM conversations WHERE id = ?", (key,))
    if row is None:
        return 0
    _TABLES.add_to_tenant(db, row[1], -int(row[0]))
    return int(row[0])


def _insert(db: sqlite3.Connection, key: str, first: int, rows: list[tuple[str, bytes]]) -> None:
    db.executemany(
        "INSERT INTO conversation_items VALUES (?, ?, ?, ?, ?)",
        [(key, first + i, item_id, len(data), data) for i, (item_id, data) in enumerate(rows)],
    )


def _set_total(db: sqlite3.Connection, total: int) -> None:
    db.execute("UPDATE conversations_total SET bytes = ?", (total,))
