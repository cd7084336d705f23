"""The response store's contract (app/store/base.py), held on both stores: SQLite on a
file and a real redis-server (started here on a free loopback port).

Time is injected (`Clock`), so expiry is tested by moving the clock, not by waiting. How
these fail when the store is wrong: a record past its time to live still returned, or
left in the store after the next write (`stored_ids`); a total size over the bound, or a
total that no longer matches the records (`bookkeeping`), after concurrent writers; a
record lost across a reopen; a down store raising something other than `Unavailable`.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from app.errors import ResourceExhausted, Unavailable
from app.store import open_store
from app.store.base import ResponseStore
from app.store.redis import RedisStore
from app.store.sqlite import SqliteStore
from app.tenants import DEFAULT_TENANT
from tests.redis_server import keys, redis_server, sorted_set
from tests.store_backends import Clock, location

T = DEFAULT_TENANT  # the tenant of every record here but where a test names others


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


Factory = Callable[..., ResponseStore]


@pytest.fixture(params=["sqlite", "redis"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Stores of one backend, all on the same file or Redis database (fresh per test)."""
    where = location(request, tmp_path)

    def factory(clock: Clock, *, ttl_s: float = 60.0, max_bytes: int = 10_000) -> ResponseStore:
        return open_store(where, ttl_s=ttl_s, max_bytes=max_bytes, clock=clock)

    yield factory


@pytest.fixture
async def closing() -> AsyncIterator[list[ResponseStore]]:
    """Stores to close at the end of the test, on its loop."""
    stores: list[ResponseStore] = []
    yield stores
    for store in stores:
        await store.close()


def stored_ids(store: ResponseStore) -> set[str]:
    """Every id the backing store still holds, expired or not."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as db:
            return {row[0] for row in db.execute("SELECT id FROM responses")}
    assert isinstance(store, RedisStore)
    client = redis.Redis.from_url(store.url)
    held = {k.removeprefix(store.prefix + "r:") for k in keys(client, store.prefix + "r:*")}
    return held | set(sorted_set(client, store.prefix + "index"))


def bookkeeping(store: ResponseStore) -> tuple[int, int]:
    """(the total the store keeps, the sum of its records' sizes)."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as db:
            total = db.execute("SELECT bytes FROM total").fetchone()[0]
            actual = db.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM responses").fetchone()
            return int(total), int(actual[0])
    assert isinstance(store, RedisStore)
    client = redis.Redis.from_url(store.url)
    total = int(client.get(store.prefix + "total") or 0)
    ids = sorted_set(client, store.prefix + "index")
    actual = sum(len(client.hget(store.prefix + "r:" + i, "data") or b"") for i in ids)
    assert client.hlen(store.prefix + "sizes") == len(ids)
    return total, actual


async def test_put_get_delete(make: Factory, closing: list[Any]) -> None:
    store = make(Clock())
    closing.append(store)
    assert await store.get(T, "a") is None
    await store.put(T, "a", b"one")
    await store.put(T, "a", b"two")  # replaced
    assert await store.get(T, "a") == b"two"
    assert await store.delete(T, "a") is True
    assert await store.delete(T, "a") is False
    assert await store.get(T, "a") is None
    assert bookkeeping(store) == (0, 0)


async def test_records_expire_and_are_removed(make: Factory, closing: list[Any]) -> None:
    """Fails if an expired record is still returned, or still held after the next put."""
    clock = Clock()
    store = make(clock, ttl_s=10)
    closing.append(store)
    await store.put(T, "old", b"x" * 10)
    clock.now += 9
    assert await store.get(T, "old") == b"x" * 10
    await store.put(T, "new", b"y")
    clock.now += 2  # "old" is 11 s old, "new" 2 s
    assert await store.get(T, "old") is None
    assert await store.get(T, "new") == b"y"
    await store.put(T, "newer", b"z")
    assert stored_ids(store) == {"new", "newer"}
    assert bookkeeping(store) == (2, 2)


async def test_size_bound_evicts_the_oldest(make: Factory, closing: list[Any]) -> None:
    clock = Clock()
    store = make(clock, max_bytes=1000)
    closing.append(store)
    for name in "abcd":
        await store.put(T, name, name.encode() * 300)
        clock.now += 1
    assert stored_ids(store) == {"b", "c", "d"}
    assert await store.get(T, "a") is None
    total, actual = bookkeeping(store)
    assert total == actual == 900
    with pytest.raises(ResourceExhausted) as refused:
        await store.put(T, "huge", b"h" * 1001)
    assert refused.value.code == "store_full"
    assert stored_ids(store) == {"b", "c", "d"}


async def test_concurrent_writers_keep_the_bound_exact(make: Factory, closing: list[Any]) -> None:
    """Three stores on one backing store (three connections: processes or replicas would
    hold as many) write at once; fails if the bound is exceeded or the kept total drifts
    from the records (a put that is not one transaction)."""
    clock = Clock()
    stores = [make(clock, max_bytes=5_000) for _ in range(3)]
    closing.extend(stores)

    async def writer(n: int, store: ResponseStore) -> None:
        for i in range(40):
            await store.put(T, f"w{n}-{i}", bytes([65 + n]) * (100 + 37 * (i % 7)))
            if i % 5 == 0:
                await store.delete(T, f"w{n}-{i - 3}")

    await asyncio.gather(*(writer(n, s) for n, s in enumerate(stores)))
    total, actual = bookkeeping(stores[0])
    assert total == actual
    assert 0 < total <= 5_000


async def test_sqlite_commits_a_burst_of_puts_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Puts that arrive together (streams ending on one engine step) are one transaction:
    fails if a burst of 16 takes more than two, or if the group breaks the rules of one
    put each (the bound, the kept total, a key written twice keeping its last data, the
    oldest evicted first); a group that fails fails every put in it."""
    store = SqliteStore(tmp_path / "r.sqlite3", ttl_s=60, max_bytes=1_800, clock=Clock())
    groups: list[int] = []
    put_all = store._put_all

    def counted(db: sqlite3.Connection, records: list[Any], now: float) -> list[Any]:
        groups.append(len(records))
        return put_all(db, records=records, now=now)

    monkeypatch.setattr(store, "_put_all", counted)
    try:
        await store.put(T, "old", b"o" * 300)
        burst = [store.put(T, f"r{i}", bytes([65 + i]) * 100) for i in range(16)]
        await asyncio.gather(*burst, store.put(T, "r3", b"x" * 50))
        assert len(groups) <= 3 and sum(groups) == 18
        assert stored_ids(store) == {f"r{i}" for i in range(16)}  # "old" evicted
        assert await store.get(T, "r3") == b"x" * 50
        assert bookkeeping(store) == (1_550, 1_550)
    finally:
        await store.close()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    down = SqliteStore(blocker / "r.sqlite3", ttl_s=60, max_bytes=1000)
    try:
        results = await asyncio.gather(
            *(down.put(T, f"r{i}", b"y") for i in range(4)), return_exceptions=True
        )
        assert all(isinstance(r, Unavailable) for r in results), results
    finally:
        await down.close()


async def test_cancel_flag(make: Factory, closing: list[Any]) -> None:
    clock = Clock()
    owner, other = make(clock, ttl_s=10), make(clock, ttl_s=10)
    closing.extend([owner, other])
    assert await owner.cancel_requested("r") is False
    await other.request_cancel("r")
    assert await owner.cancel_requested("r") is True


async def test_sqlite_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state" / "responses.sqlite3"
    first = SqliteStore(path, ttl_s=60, max_bytes=10_000)
    await first.put(T, "kept", b"data")
    await first.close()
    second = SqliteStore(path, ttl_s=60, max_bytes=10_000)
    try:
        assert await second.get(T, "kept") == b"data"
    finally:
        await second.close()


async def test_sqlite_stores_opened_together_all_open(tmp_path: Path) -> None:
    """Four stores opening one new file at once (replicas starting together): each
    answers. SQLite answers the switch to WAL "database is locked" at once, without its
    busy wait, while another connection holds a lock: about one round in fifteen failed
    before the switch waited; 100 rounds catch that."""
    for round_ in range(100):
        path = tmp_path / f"r{round_}" / "responses.sqlite3"
        stores = [SqliteStore(path, ttl_s=60, max_bytes=10_000) for _ in range(4)]
        try:
            assert await asyncio.gather(*(s.get(T, "r") for s in stores)) == [None] * 4
        finally:
            await asyncio.gather(*(s.close() for s in stores))


async def test_a_store_that_cannot_be_reached_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    sqlite_store = SqliteStore(blocker / "responses.sqlite3", ttl_s=60, max_bytes=1000)
    from tests.conftest import free_port

    redis_store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", ttl_s=60, max_bytes=1000)
    for store in (sqlite_store, redis_store):
        try:
            for call in (store.get(T, "x"), store.put(T, "x", b"y"), store.delete(T, "x")):
                with pytest.raises(Unavailable) as down:
                    await call
                assert down.value.code == "store_unavailable"
                assert down.value.http_status == 503
        finally:
            await store.close()


async def test_redis_out_of_memory_is_full(tmp_path: Path) -> None:
    with redis_server(tmp_path, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction") as url:
        store = RedisStore(url, ttl_s=60, max_bytes=1 << 30)
        try:
            with pytest.raises(ResourceExhausted) as refused:
                for i in range(100):
                    await store.put(T, f"r{i}", b"x" * 100_000)
            assert refused.value.code == "store_full"
        finally:
            await store.close()
