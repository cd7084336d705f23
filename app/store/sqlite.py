"""The embedded response store: one SQLite file (the default, under the state directory),
surviving restarts, shareable by processes on one machine.

Every call runs in the store's own thread (one connection, in WAL mode, waiting up to
`busy_timeout_s` for another process's write lock), never on the event loop. Writes are
committed in groups: the `put`s that arrive while none is being written, or while one
group is, wait for the next group, and a group is one `BEGIN IMMEDIATE` transaction:
expired rows out, then each record in turn in (its older copy out, its tenant's oldest
rows out until the record fits its tenant's quota and the store's bound); the total, and
each tenant's (`tenant_totals`), are kept in tables inside the same transaction, so
writers in several processes keep them exact. Why groups: streams that share engine
steps end together (16 of them at once at 16 clients), and a transaction and a thread
hand-off each (150-200 us of CPU) were most of a stored response's cost over an unstored
one. A group that fails fails each of its `put`s with the same error. A file written
before tenants gains the `tenant` column as it opens, its records the default tenant's.

SQLite's own failures are the store's: a full disk (`SQLITE_FULL`) is `store_full`; a
file that cannot be opened, a lock held past the timeout or a corrupt file is
`store_unavailable`, for that call. `SqliteFile` (the connection, its thread, that
mapping), `transaction`, `TenantTables` (a store's tables: each tenant's total, the move
of a file from before tenants) and `SqliteBoundedStore` (a store's bounds and file) serve
the conversations' store on the same file too (`app.store.sqlite_conversations`).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar, TypeVar, Unpack

from app.errors import ResourceExhausted
from app.store.base import BoundedStore, Bounds, full, unavailable
from app.tenants import DEFAULT_TENANT

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, expires REAL NOT NULL, size INTEGER NOT NULL, data BLOB NOT NULL,
    tenant TEXT NOT NULL DEFAULT '{default}'
);
CREATE INDEX IF NOT EXISTS responses_by_expiry ON responses (expires);
CREATE TABLE IF NOT EXISTS total (one INTEGER PRIMARY KEY CHECK (one = 1), bytes INTEGER NOT NULL);
INSERT OR IGNORE INTO total VALUES (1, 0);
CREATE TABLE IF NOT EXISTS cancels (id TEXT PRIMARY KEY, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tenant_totals (tenant TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
""".replace("{default}", DEFAULT_TENANT)


class SqliteFile:
    """One SQLite file, opened on first use with `schema`, and used from one thread of its
    own (one connection, in WAL mode, waiting up to `busy_timeout_s` for another process's
    write lock), never from the event loop. SQLite's failures become the store's: a full
    disk (`SQLITE_FULL`) is `store_full`, anything else (a file that cannot be opened, a
    lock held past the timeout, a corrupt file) `store_unavailable`. `migrate` brings a
    file written by an earlier release up to `schema`, in one transaction, as it opens."""

    def __init__(
        self,
        path: Path,
        schema: str,
        *,
        busy_timeout_s: float,
        name: str,
        migrate: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        self.path = path
        self._schema = schema
        self._migrate = migrate
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
            _into_wal(db, self._busy_timeout_s)
            db.execute("PRAGMA synchronous=NORMAL")
            # The schema in one write transaction taking the lock at once (so the busy
            # wait applies), not statement by statement beside other connections opening.
            db.executescript(f"BEGIN IMMEDIATE;\n{self._schema}\nCOMMIT;")
            if self._migrate is not None:
                with transaction(db):
                    self._migrate(db)
            self._db = db
        return self._db

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, self._call, work)
        except (sqlite3.Error, OSError) as exc:
            if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == 13:
                raise full(f"{self.path}: {exc!r}", "it has no room left") from exc  # SQLITE_FULL
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


@dataclass(frozen=True, slots=True)
class TenantTables:
    """A store's tables in its SQLite file, by tenant: its `schema`, its thread's name,
    the table of its `records` (id, expires, size, data, tenant) and the table of each
    tenant's total (tenant, bytes)."""

    schema: str
    thread: str
    records: str
    tenant_totals: str

    def tenant_total(self, db: sqlite3.Connection, tenant: str) -> int:
        row = db.execute(
            f"SELECT bytes FROM {self.tenant_totals} WHERE tenant = ?", (tenant,)
        ).fetchone()
        return 0 if row is None else int(row[0])

    def add_to_tenant(self, db: sqlite3.Connection, tenant: str, size: int) -> None:
        db.execute(
            f"INSERT INTO {self.tenant_totals} VALUES (?, ?) "
            "ON CONFLICT (tenant) DO UPDATE SET bytes = bytes + excluded.bytes",
            (tenant, size),
        )

    def with_tenants(self, db: sqlite3.Connection) -> None:
        """A file from before tenants: its records become the default tenant's (the
        column's default), counted in its total; then the index of each tenant's order."""
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({self.records})")}
        if "tenant" not in columns:
            db.execute(
                f"ALTER TABLE {self.records} "
                f"ADD COLUMN tenant TEXT NOT NULL DEFAULT '{DEFAULT_TENANT}'"
            )
            db.execute(
                f"INSERT OR REPLACE INTO {self.tenant_totals} "
                f"SELECT tenant, SUM(size) FROM {self.records} GROUP BY tenant"
            )
        db.execute(
            f"CREATE INDEX IF NOT EXISTS {self.records}_by_tenant "
            f"ON {self.records} (tenant, expires)"
        )


class SqliteBoundedStore(BoundedStore):
    """A store by tenant in an SQLite file: its `TABLES`, through a `SqliteFile` of its
    own (waiting up to `busy_timeout_s` for another process's write lock)."""

    TABLES: ClassVar[TenantTables]

    def __init__(
        self, path: Path, *, busy_timeout_s: float = 5.0, **bounds: Unpack[Bounds]
    ) -> None:
        super().__init__(str(path), **bounds)
        self.path = path
        self._file = SqliteFile(
            path,
            self.TABLES.schema,
            busy_timeout_s=busy_timeout_s,
            name=self.TABLES.thread,
            migrate=self.TABLES.with_tenants,
        )


_TABLES = TenantTables(_SCHEMA, "response-store", "responses", "tenant_totals")


class SqliteStore(SqliteBoundedStore):
    TABLES = _TABLES

    def __init__(
        self, path: Path, *, busy_timeout_s: float = 5.0, **bounds: Unpack[Bounds]
    ) -> None:
        super().__init__(path, busy_timeout_s=busy_timeout_s, **bounds)
        self._run = self._file.run
        self._waiting: list[tuple[_Put, asyncio.Future[bool]]] = []
        self._writer: asyncio.Task[None] | None = None

    # -- the contract (app.store.base) ------------------------------------------------

    async def get(self, tenant: str, key: str) -> bytes | None:
        now = self._clock()

        def get(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                "SELECT data FROM responses WHERE id = ? AND tenant = ? AND expires > ?",
                (key, tenant, now),
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._run(get)

    async def put(
        self,
        tenant: str,
        key: str,
        data: bytes,
        *,
        quota: int = 0,
        unless_cancelled: bool = False,
    ) -> bool:
        quota = self._quota(quota)
        self._check(len(data), quota)
        written = asyncio.get_running_loop().create_future()
        self._waiting.append((_Put(tenant, key, data, quota, unless_cancelled), written))
        if self._writer is None:  # it starts next turn: this turn's puts join its group
            self._writer = asyncio.create_task(self._write_groups(), name="response-store")
        return bool(await written)

    async def _write_groups(self) -> None:
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                records = [record for record, _ in group]
                try:
                    done = await self._run(
                        partial(self._put_all, records=records, now=self._clock())
                    )
                    results = list(zip(group, done, strict=True))
                except Exception as exc:
                    for _, written in group:
                        if not written.done():
                            written.set_exception(exc)
                else:
                    for (_, written), stored in results:
                        if written.done():  # a writer that was cancelled meanwhile
                            continue
                        if isinstance(stored, BaseException):
                            written.set_exception(stored)
                        else:
                            written.set_result(stored)
        finally:
            self._writer = None

    def _put_all(
        self, db: sqlite3.Connection, records: list[_Put], now: float
    ) -> list[bool | ResourceExhausted]:
        """Each record in turn, in one transaction: written (True), refused by its cancel
        flag (False), or with no room left that its tenant may make (the error)."""
        done: list[bool | ResourceExhausted] = []
        with transaction(db):
            total = _total(db) - _remove(db, "expires <= ?", (now,))
            for put in records:
                if (
                    put.unless_cancelled
                    and db.execute(
                        "SELECT 1 FROM cancels WHERE id = ? AND expires > ?", (put.key, now)
                    ).fetchone()
                ):
                    done.append(False)
                    continue
                size = len(put.data)
                total -= _remove(db, "id = ?", (put.key,))
                own = _TABLES.tenant_total(db, put.tenant)
                if total - own + size > self.max_bytes:  # all or nothing: its own cannot
                    done.append(self._no_room(size))
                    continue
                while own + size > put.quota or total + size > self.max_bytes:
                    oldest = db.execute(
                        "SELECT id, size FROM responses WHERE tenant = ? "
                        "ORDER BY expires, rowid LIMIT 64",
                        (put.tenant,),
                    ).fetchall()
                    if not oldest:
                        break
                    for row_id, row_size in oldest:
                        if own + size <= put.quota and total + size <= self.max_bytes:
                            break
                        _remove(db, "id = ?", (row_id,))
                        total, own = total - row_size, own - row_size
                if own + size > put.quota or total + size > self.max_bytes:
                    done.append(self._no_room(size))
                    continue
                db.execute(
                    "INSERT INTO responses VALUES (?, ?, ?, ?, ?)",
                    (put.key, now + self.ttl_s, size, put.data, put.tenant),
                )
                _TABLES.add_to_tenant(db, put.tenant, size)
                total += size
                done.append(True)
            db.execute("UPDATE total SET bytes = ?", (total,))
            db.execute("DELETE FROM cancels WHERE expires <= ?", (now,))
        return done

    async def delete(self, tenant: str, key: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            with transaction(db):
                owned = db.execute(
                    "SELECT expires > ? FROM responses WHERE id = ? AND tenant = ?",
                    (self._clock(), key, tenant),
                ).fetchone()
                if owned is None:
                    return False
                freed = _remove(db, "id = ?", (key,))
                db.execute("UPDATE total SET bytes = bytes - ?", (freed,))
                db.execute("DELETE FROM cancels WHERE id = ?", (key,))
            return bool(owned[0])

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


def _into_wal(db: sqlite3.Connection, timeout_s: float) -> None:
    """Switch the file to WAL mode, waiting up to `timeout_s` for the other connections
    opening it: SQLite answers the switch "database is locked" at once, without its busy
    wait, while another connection holds any lock on the file (measured: 1 open in 15
    failed so with four connections opening a new file together)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


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


@dataclass(frozen=True, slots=True)
class _Put:
    tenant: str
    key: str
    data: bytes
    quota: int
    unless_cancelled: bool


def _total(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT bytes FROM total").fetchone()[0])


def _remove(db: sqlite3.Connection, where: str, args: tuple[object, ...]) -> int:
    """Delete the rows `where` selects (their tenants' totals kept); the bytes they held.
    The caller keeps the store's total."""
    freed = db.execute(
        f"SELECT tenant, SUM(size) FROM responses WHERE {where} GROUP BY tenant", args
    ).fetchall()
    for tenant, size in freed:
        _TABLES.add_to_tenant(db, tenant, -int(size))
    db.execute(f"DELETE FROM responses WHERE {where}", args)
    return sum(int(size) for _, size in freed)
