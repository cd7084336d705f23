"""The embedded response store: one SQLite file (the default, under the state directory),
surviving restarts, shareable by processes on one machine.

Every call runs in the store's own thread (one connection, in WAL mode, waiting up to
`busy_timeout_s` for another process's write lock), never on the event loop. Writes are
committed in groups: the `put`s that arrive while none is being written, or while one
group is, wait for the next group, and a group is one `BEGIN IMMEDIATE` transaction:
expired rows out, then each record in turn in (its older copy out, the oldest rows out
until the total fits); the total is kept in a one-row table inside the same transaction,
so writers in several processes keep it exact. Why groups: streams that share engine
steps end together (16 of them at once at 16 clients), and a transaction and a thread
hand-off each (150-200 us of CPU) were most of a stored response's cost over an unstored
one. A group that fails fails each of its `put`s with the same error.

SQLite's own failures are the store's: a full disk (`SQLITE_FULL`) is `store_full`; a
file that cannot be opened, a lock held past the timeout or a corrupt file is
`store_unavailable`, for that call. `SqliteFile` (the connection, its thread, that
mapping) and `transaction` serve the conversations' store on the same file too
(`app.store.sqlite_conversations`).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TypeVar

from app.store.base import DEFAULT_CLOCK, Clock, full, too_large, unavailable

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, expires REAL NOT NULL, size INTEGER NOT NULL, data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_expiry ON responses (expires);
CREATE TABLE IF NOT EXISTS total (one INTEGER PRIMARY KEY CHECK (one = 1), bytes INTEGER NOT NULL);
INSERT OR IGNORE INTO total VALUES (1, 0);
CREATE TABLE IF NOT EXISTS cancels (id TEXT PRIMARY KEY, expires REAL NOT NULL);
"""


class SqliteFile:
    """One SQLite file, opened on first use with `schema`, and used from one thread of its
    own (one connection, in WAL mode, waiting up to `busy_timeout_s` for another process's
    write lock), never from the event loop. SQLite's failures become the store's: a full
    disk (`SQLITE_FULL`) is `store_full`, anything else (a file that cannot be opened, a
    lock held past the timeout, a corrupt file) `store_unavailable`."""

    def __init__(self, path: Path, schema: str, *, busy_timeout_s: float, name: str) -> None:
        self.path = path
        self._schema = schema
        self._busy_timeout_s = busy_timeout_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._db: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(self._schema)
            self._db = db
        return self._db

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, self._call, work)
        except (sqlite3.Error, OSError) as exc:
            if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == 13:
                raise full(str(self.path), str(exc)) from exc  # SQLITE_FULL
            raise unavailable(str(self.path), exc) from exc

    def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return work(self._connection())

    async def close(self) -> None:
        def close(db: sqlite3.Connection) -> None:
            db.close()

        if self._db is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, close, self._db)
            self._db = None
        self._thread.shutdown(wait=False)


class SqliteStore:
    def __init__(
        self,
        path: Path,
        *,
        ttl_s: float,
        max_bytes: int,
        clock: Clock = DEFAULT_CLOCK,
        busy_timeout_s: float = 5.0,
    ) -> None:
        self.path = path
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._file = SqliteFile(path, _SCHEMA, busy_timeout_s=busy_timeout_s, name="response-store")
        self._run = self._file.run
        self._waiting: list[tuple[str, bytes, bool, asyncio.Future[bool]]] = []
        self._writer: asyncio.Task[None] | None = None

    # -- the contract (app.store.base) ------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        now = self._clock()

        def get(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT data FROM responses WHERE id = ? AND expires > ?", (key, now)
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._run(get)

    async def put(self, key: str, data: bytes, *, unless_cancelled: bool = False) -> bool:
        if len(data) > self.max_bytes:
            raise full(str(self.path), too_large(len(data), self.max_bytes))
        written = asyncio.get_running_loop().create_future()
        self._waiting.append((key, data, unless_cancelled, written))
        if self._writer is None:  # it starts next turn: this turn's puts join its group
            self._writer = asyncio.create_task(self._write_groups(), name="response-store")
        return bool(await written)

    async def _write_groups(self) -> None:
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                records = [(key, data, conditional) for key, data, conditional, _ in group]
                try:
                    done = await self._run(
                        partial(self._put_all, records=records, now=self._clock())
                    )
                    results = list(zip(group, done, strict=True))
                except Exception as exc:
                    for *_, written in group:
                        if not written.done():
                            written.set_exception(exc)
                else:
                    for (*_, written), stored in results:
                        if not written.done():  # a writer that was cancelled meanwhile
                            written.set_result(stored)
        finally:
            self._writer = None

    def _put_all(
        self, db: sqlite3.Connection, records: list[tuple[str, bytes, bool]], now: float
    ) -> list[bool]:
        done = []
        with transaction(db):
            freed = _remove(db, "expires <= ?", (now,))
            total = db.execute("SELECT bytes FROM total").fetchone()[0] - freed
            for key, data, unless_cancelled in records:
                if (
                    unless_cancelled
                    and db.execute(
                        "SELECT 1 FROM cancels WHERE id = ? AND expires > ?", (key, now)
                    ).fetchone()
                ):
                    done.append(False)
                    continue
                size = len(data)
                total -= _remove(db, "id = ?", (key,))
                while total + size > self.max_bytes:
                    oldest = db.execute(
                        "SELECT id, size FROM responses ORDER BY expires, rowid LIMIT 64"
                    ).fetchall()
                    for row_id, row_size in oldest:
                        if total + size <= self.max_bytes:
                            break
                        db.execute("DELETE FROM responses WHERE id = ?", (row_id,))
                        total -= row_size
                db.execute(
                    "INSERT INTO responses VALUES (?, ?, ?, ?)", (key, now + self.ttl_s, size, data)
                )
                total += size
                done.append(True)
            db.execute("UPDATE total SET bytes = ?", (total,))
            db.execute("DELETE FROM cancels WHERE expires <= ?", (now,))
        return done

    async def delete(self, key: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            with transaction(db):
                existed = db.execute(
                    "SELECT 1 FROM responses WHERE id = ? AND expires > ?", (key, self._clock())
                ).fetchone()
                freed = _remove(db, "id = ?", (key,))
                db.execute("UPDATE total SET bytes = bytes - ?", (freed,))
                db.execute("DELETE FROM cancels WHERE id = ?", (key,))
            return existed is not None

        return await self._run(delete)

    async def request_cancel(self, key: str) -> None:
        expires = self._clock() + self.ttl_s

        def flag(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR REPLACE INTO cancels VALUES (?, ?)", (key, expires))

        await self._run(flag)

    async def cancel_requested(self, key: str) -> bool:
        now = self._clock()

        def read(db: sqlite3.Connection) -> bool:
            row = db.execute(
                "SELECT 1 FROM cancels WHERE id = ? AND expires > ?", (key, now)
            ).fetchone()
            return row is not None

        return await self._run(read)

    async def close(self) -> None:
        if self._writer is not None:
            await asyncio.wait([self._writer])
        await self._file.close()


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, taking the write lock at once (another process's writes
    wait for it, up to the busy timeout, rather than failing mid-way)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _remove(db: sqlite3.Connection, where: str, args: tuple[object, ...]) -> int:
    """Delete the rows `where` selects; the bytes they held."""
    freed = db.execute(f"SELECT COALESCE(SUM(size), 0) FROM responses WHERE {where}", args)
    total = int(freed.fetchone()[0])
    db.execute(f"DELETE FROM responses WHERE {where}", args)
    return total
