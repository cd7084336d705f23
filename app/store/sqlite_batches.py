"""The batches' store on SQLite: tables of their own in the store's file (the Responses
store's by default), so one file holds a replica's stored state.

    batch_docs      key, expires, data: a file's or a batch's object
    batch_index     (name, key) -> score: the lists, and the active batches
    batch_parts     (key, part) -> data: a file's bytes, a batch's requests
    batch_results   (key, idx) -> outcome, size, data, input and output tokens
    batch_chunks    (key, chunk) -> owner, until: the chunks handed out and not finished
    batch_handed    key -> chunks handed out so far
    batch_leases    key -> owner, until: a key's own lease
    batch_total     the bytes every part and result holds
    batch_owners    key -> owner: whose upload it is; batch_owned: owner -> bytes

Each write is one `BEGIN IMMEDIATE` transaction in the file's own thread
(`app.store.sqlite.SqliteFile`); the writes that may grow the store remove what has
expired first (every row under an expired document's key), so writers in several
processes keep the total exact. Tallies are counted from the results' rows (indexed by
key), so they always match them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from app.store.base import DEFAULT_CLOCK, Clock, full, too_large
from app.store.batches import STORE, UPLOAD_S, Leases, Tally, over, over_quota
from app.store.sqlite import SqliteFile, transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_docs (key TEXT PRIMARY KEY, expires REAL NOT NULL, data BLOB);
CREATE INDEX IF NOT EXISTS batch_docs_by_expiry ON batch_docs (expires);
CREATE TABLE IF NOT EXISTS batch_index (
    name TEXT NOT NULL, key TEXT NOT NULL, score REAL NOT NULL, PRIMARY KEY (name, key)
);
CREATE INDEX IF NOT EXISTS batch_index_by_score ON batch_index (name, score, key);
CREATE TABLE IF NOT EXISTS batch_parts (
    key TEXT NOT NULL, part INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (key, part)
);
CREATE TABLE IF NOT EXISTS batch_results (
    key TEXT NOT NULL, idx INTEGER NOT NULL, outcome TEXT NOT NULL, size INTEGER NOT NULL,
    data BLOB NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    PRIMARY KEY (key, idx)
);
CREATE TABLE IF NOT EXISTS batch_chunks (
    key TEXT NOT NULL, chunk INTEGER NOT NULL, owner TEXT NOT NULL, until REAL NOT NULL,
    PRIMARY KEY (key, chunk)
);
CREATE TABLE IF NOT EXISTS batch_handed (key TEXT PRIMARY KEY, handed INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batch_leases (
    key TEXT PRIMARY KEY, owner TEXT NOT NULL, until REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_total (one INTEGER PRIMARY KEY CHECK (one = 1), bytes INTEGER);
INSERT OR IGNORE INTO batch_total VALUES (1, 0);
CREATE TABLE IF NOT EXISTS batch_owners (key TEXT PRIMARY KEY, owner TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batch_owned (owner TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
"""

_UNDER_KEY = (
    "batch_index",
    "batch_parts",
    "batch_results",
    "batch_chunks",
    "batch_handed",
    "batch_leases",
)


class SqliteBatches:
    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int,
        clock: Clock = DEFAULT_CLOCK,
        busy_timeout_s: float = 5.0,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._clock = clock
        self._file = SqliteFile(path, _SCHEMA, busy_timeout_s=busy_timeout_s, name="batch-store")
        self._run = self._file.run

    # -- documents ---------------------------------------------------------------------

    async def create(
        self, key: str, data: bytes, *, expires: float, indexes: dict[str, float]
    ) -> None:
        def create(db: sqlite3.Connection, now: float) -> None:
            with transaction(db):
                _expire(db, now)
                db.execute(
                    "INSERT OR REPLACE INTO batch_docs VALUES (?, ?, ?)", (key, expires, data)
                )
                db.executemany(
                    "INSERT OR REPLACE INTO batch_index VALUES (?, ?, ?)",
                    [(name, key, score) for name, score in indexes.items()],
                )

        await self._run(partial(create, now=self._clock()))

    async def get(self, key: str) -> bytes | None:
        now = self._clock()

        def get(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT data FROM batch_docs WHERE key = ? AND expires > ?", (key, now)
            ).fetchone()
            return None if row is None or row[0] is None else bytes(row[0])

        return await self._run(get)

    async def swap(self, key: str, old: bytes, new: bytes) -> bool:
        now = self._clock()

        def swap(db: sqlite3.Connection) -> bool:
            with transaction(db):
                changed = db.execute(
                    "UPDATE batch_docs SET data = ? WHERE key = ? AND data = ? AND expires > ?",
                    (new, key, old, now),
                )
                return changed.rowcount == 1

        return await self._run(swap)

    async def delete(self, key: str) -> bool:
        now = self._clock()

        def delete(db: sqlite3.Connection) -> bool:
            with transaction(db):
                _expire(db, now)
                live = _live(db, key, now)
                _drop(db, key)
                return live

        return await self._run(delete)

    async def page(
        self, index: str, *, after: str | None, limit: int, desc: bool
    ) -> tuple[list[bytes], bool] | None:
        now = self._clock()
        sign, order = ("<", "DESC") if desc else (">", "ASC")

        def page(db: sqlite3.Connection) -> tuple[list[bytes], bool] | None:
            where, args = "", tuple[object, ...]()
            if after is not None:
                row = db.execute(
                    "SELECT score FROM batch_index WHERE name = ? AND key = ?", (index, after)
                ).fetchone()
                if row is None:
                    return None
                where = f"AND (i.score {sign} ? OR (i.score = ? AND i.key {sign} ?))"
                args = (row[0], row[0], after)
            rows = db.execute(
                "SELECT d.data FROM batch_index i JOIN batch_docs d ON d.key = i.key "
                f"WHERE i.name = ? AND d.expires > ? {where} "
                f"ORDER BY i.score {order}, i.key {order} LIMIT ?",
                (index, now, *args, limit + 1),
            ).fetchall()
            return [bytes(r[0]) for r in rows[:limit]], len(rows) > limit

        return await self._run(page)

    async def listed(self, index: str, key: str, score: float | None) -> None:
        def listed(db: sqlite3.Connection) -> None:
            if score is None:
                db.execute("DELETE FROM batch_index WHERE name = ? AND key = ?", (index, key))
            else:
                db.execute(
                    "INSERT OR REPLACE INTO batch_index VALUES (?, ?, ?)", (index, key, score)
                )

        await self._run(listed)

    async def keys(self, index: str) -> list[str]:
        now = self._clock()

        def keys(db: sqlite3.Connection) -> list[str]:
            rows = db.execute(
                "SELECT i.key FROM batch_index i JOIN batch_docs d ON d.key = i.key "
                "WHERE i.name = ? AND d.expires > ? ORDER BY i.score, i.key",
                (index, now),
            ).fetchall()
            return [str(r[0]) for r in rows]

        return await self._run(keys)

    # -- parts ---------------------------------------------------------------------------

    async def put_part(
        self, key: str, index: int, data: bytes, *, bounded: bool, owner: str = "", quota: int = 0
    ) -> None:
        if bounded and len(data) > self.max_bytes:
            raise full(str(self.path), too_large(len(data), self.max_bytes), store=STORE)

        def put(db: sqlite3.Connection, now: float) -> None:
            with transaction(db):
                total = _expire(db, now)
                if bounded and total + len(data) > self.max_bytes:
                    raise full(str(self.path), over(total, len(data), self.max_bytes), store=STORE)
                old = db.execute(
                    "SELECT LENGTH(data) FROM batch_parts WHERE key = ? AND part = ?", (key, index)
                ).fetchone()
                grown = len(data) - (0 if old is None else int(old[0]))
                if bounded and owner:
                    own = _owned(db, owner)
                    if quota and own + grown > quota:
                        raise full(str(self.path), over_quota(own, len(data), quota), store=STORE)
                    db.execute("INSERT OR IGNORE INTO batch_owners VALUES (?, ?)", (key, owner))
                # Parts go before their document: a placeholder expires them if it never
                # comes (the upload's server died).
                db.execute(
                    "INSERT OR IGNORE INTO batch_docs VALUES (?, ?, NULL)", (key, now + UPLOAD_S)
                )
                db.execute(
                    "INSERT OR REPLACE INTO batch_parts VALUES (?, ?, ?)", (key, index, data)
                )
                _grow(db, grown)
                if bounded and owner:
                    _own(db, owner, grown)

        await self._run(partial(put, now=self._clock()))

    async def part(self, key: str, index: int) -> bytes | None:
        def part(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT data FROM batch_parts WHERE key = ? AND part = ?", (key, index)
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._run(part)

    # -- results -------------------------------------------------------------------------

    async def add_result(
        self, key: str, index: int, outcome: str, data: bytes, tokens: tuple[int, int] = (0, 0)
    ) -> bool:
        now = self._clock()

        def add(db: sqlite3.Connection) -> bool:
            with transaction(db):
                if not _live(db, key, now):
                    return False
                added = db.execute(
                    "INSERT OR IGNORE INTO batch_results VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (key, index, outcome, len(data), data, *tokens),
                )
                if added.rowcount != 1:
                    return False
                _grow(db, len(data))
                return True

        return await self._run(add)

    async def add_results(self, key: str, rows: Sequence[tuple[int, str, bytes]]) -> int:
        now = self._clock()

        def add(db: sqlite3.Connection) -> int:
            with transaction(db):
                if not _live(db, key, now):
                    return 0
                written = 0
                for index, outcome, data in rows:
                    added = db.execute(
                        "INSERT OR IGNORE INTO batch_results VALUES (?, ?, ?, ?, ?, 0, 0)",
                        (key, index, outcome, len(data), data),
                    )
                    if added.rowcount == 1:
                        written += 1
                        _grow(db, len(data))
                return written

        return await self._run(add)

    async def results(self, key: str, start: int, stop: int) -> list[tuple[int, str, bytes]]:
        def results(db: sqlite3.Connection) -> list[tuple[int, str, bytes]]:
            rows = db.execute(
                "SELECT idx, outcome, data FROM batch_results "
                "WHERE key = ? AND idx >= ? AND idx < ? ORDER BY idx",
                (key, start, stop),
            ).fetchall()
            return [(int(i), str(o), bytes(d)) for i, o, d in rows]

        return await self._run(results)

    async def tally(self, key: str) -> Tally:
        def tally(db: sqlite3.Connection) -> Tally:
            rows = db.execute(
                "SELECT outcome, COUNT(*), SUM(size), SUM(input_tokens), SUM(output_tokens) "
                "FROM batch_results WHERE key = ? GROUP BY outcome",
                (key,),
            ).fetchall()
            return Tally(
                counts={str(r[0]): int(r[1]) for r in rows},
                sizes={str(r[0]): int(r[2]) for r in rows},
                input_tokens=sum(int(r[3]) for r in rows),
                output_tokens=sum(int(r[4]) for r in rows),
            )

        return await self._run(tally)

    # -- work ----------------------------------------------------------------------------

    async def claim(
        self, key: str, *, chunks: int, owner: str, now: float, until: float
    ) -> int | None:
        def claim(db: sqlite3.Connection) -> int | None:
            with transaction(db):
                if not _live(db, key, now):
                    return None
                row = db.execute(
                    "SELECT chunk FROM batch_chunks WHERE key = ? AND until <= ? "
                    "ORDER BY until, chunk LIMIT 1",
                    (key, now),
                ).fetchone()
                if row is not None:
                    chunk = int(row[0])
                    db.execute(
                        "UPDATE batch_chunks SET owner = ?, until = ? WHERE key = ? AND chunk = ?",
                        (owner, until, key, chunk),
                    )
                    return chunk
                handed = _handed(db, key)
                if handed >= chunks:
                    return None
                db.execute("INSERT OR REPLACE INTO batch_handed VALUES (?, ?)", (key, handed + 1))
                db.execute(
                    "INSERT INTO batch_chunks VALUES (?, ?, ?, ?)", (key, handed, owner, until)
                )
                return handed

        return await self._run(claim)

    async def renew(self, key: str, chunk: int, *, owner: str, until: float) -> bool:
        def renew(db: sqlite3.Connection) -> bool:
            with transaction(db):
                changed = db.execute(
                    "UPDATE batch_chunks SET until = ? WHERE key = ? AND chunk = ? AND owner = ?",
                    (until, key, chunk, owner),
                )
                return changed.rowcount == 1

        return await self._run(renew)

    async def finish(self, key: str, chunk: int, *, owner: str) -> None:
        def finish(db: sqlite3.Connection) -> None:
            db.execute(
                "DELETE FROM batch_chunks WHERE key = ? AND chunk = ? AND owner = ?",
                (key, chunk, owner),
            )

        await self._run(finish)

    async def release(self, key: str, chunk: int, *, owner: str) -> None:
        def release(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE batch_chunks SET until = 0 WHERE key = ? AND chunk = ? AND owner = ?",
                (key, chunk, owner),
            )

        await self._run(release)

    async def leases(self, key: str, now: float) -> Leases:
        def leases(db: sqlite3.Connection) -> Leases:
            live, abandoned = db.execute(
                "SELECT COALESCE(SUM(until > ?), 0), COALESCE(SUM(until <= ?), 0) "
                "FROM batch_chunks WHERE key = ?",
                (now, now, key),
            ).fetchone()
            return Leases(int(live), int(abandoned), _handed(db, key))

        return await self._run(leases)

    async def lease(self, key: str, *, owner: str, now: float, until: float) -> bool:
        def lease(db: sqlite3.Connection) -> bool:
            with transaction(db):
                row = db.execute(
                    "SELECT owner, until FROM batch_leases WHERE key = ?", (key,)
                ).fetchone()
                if row is not None and row[0] != owner and row[1] > now:
                    return False
                db.execute(
                    "INSERT OR REPLACE INTO batch_leases VALUES (?, ?, ?)", (key, owner, until)
                )
                return True

        return await self._run(lease)

    async def leased(self, key: str, now: float) -> bool:
        def leased(db: sqlite3.Connection) -> bool:
            row = db.execute(
                "SELECT 1 FROM batch_leases WHERE key = ? AND until > ?", (key, now)
            ).fetchone()
            return row is not None

        return await self._run(leased)

    async def unlease(self, key: str, *, owner: str) -> None:
        def unlease(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM batch_leases WHERE key = ? AND owner = ?", (key, owner))

        await self._run(unlease)

    async def close(self) -> None:
        await self._file.close()


def _live(db: sqlite3.Connection, key: str, now: float) -> bool:
    row = db.execute(
        "SELECT 1 FROM batch_docs WHERE key = ? AND expires > ? AND data IS NOT NULL", (key, now)
    ).fetchone()
    return row is not None


def _handed(db: sqlite3.Connection, key: str) -> int:
    row = db.execute("SELECT handed FROM batch_handed WHERE key = ?", (key,)).fetchone()
    return 0 if row is None else int(row[0])


def _grow(db: sqlite3.Connection, size: int) -> None:
    db.execute("UPDATE batch_total SET bytes = bytes + ?", (size,))


def _drop(db: sqlite3.Connection, key: str) -> None:
    """Every row under `key` out, its bytes freed."""
    freed = db.execute(
        "SELECT (SELECT COALESCE(SUM(LENGTH(data)), 0) FROM batch_parts WHERE key = ?)"
        " + (SELECT COALESCE(SUM(size), 0) FROM batch_results WHERE key = ?)",
        (key, key),
    ).fetchone()[0]
    db.execute("DELETE FROM batch_docs WHERE key = ?", (key,))
    for table in _UNDER_KEY:
        db.execute(f"DELETE FROM {table} WHERE key = ?", (key,))
    _grow(db, -int(freed))
    owner = db.execute("SELECT owner FROM batch_owners WHERE key = ?", (key,)).fetchone()
    if owner is not None:
        _own(db, str(owner[0]), -int(freed))
        db.execute("DELETE FROM batch_owners WHERE key = ?", (key,))


def _owned(db: sqlite3.Connection, owner: str) -> int:
    row = db.execute("SELECT bytes FROM batch_owned WHERE owner = ?", (owner,)).fetchone()
    return 0 if row is None else int(row[0])


def _own(db: sqlite3.Connection, owner: str, size: int) -> None:
    db.execute(
        "INSERT INTO batch_owned VALUES (?, ?) "
        "ON CONFLICT (owner) DO UPDATE SET bytes = bytes + excluded.bytes",
        (owner, size),
    )


def _expire(db: sqlite3.Connection, now: float) -> int:
    """Everything under an expired document out, and leases long expired (a dead
    replica's, of a key with no document); the total then."""
    for (key,) in db.execute("SELECT key FROM batch_docs WHERE expires <= ?", (now,)).fetchall():
        _drop(db, str(key))
    db.execute("DELETE FROM batch_leases WHERE until <= ?", (now - UPLOAD_S,))
    return int(db.execute("SELECT bytes FROM batch_total").fetchone()[0])
