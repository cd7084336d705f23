"""The batches' store contract (app/store/batches.py), held on both stores: SQLite on a
file and a real redis-server.

How these fail when a store is wrong: a page that skips or repeats a document, or lists
an expired one; a swap that overwrites a change it did not see; a second result for a
request kept (so the output would hold it twice) or a tally that does not match the
results; a chunk handed to two owners at once, or an abandoned one never handed out
again; an upload past the bound accepted, or a total that no longer matches what is held
(`held_bytes`) after expiry and deletion; parts whose document never came kept forever.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from app.errors import ResourceExhausted
from app.store import open_batches
from app.store.batches import UPLOAD_S, BatchStore
from app.store.redis_batches import RedisBatches
from app.store.sqlite_batches import SqliteBatches
from tests.store_backends import Clock, location

Factory = Callable[..., BatchStore]


@pytest.fixture(params=["sqlite", "redis"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Stores of one backend, all on the same file or Redis database (fresh per test)."""
    where = location(request, tmp_path)

    def factory(clock: Clock, *, max_bytes: int = 10_000) -> BatchStore:
        return open_batches(where, max_bytes=max_bytes, clock=clock)

    yield factory


@pytest.fixture
async def closing() -> AsyncIterator[list[BatchStore]]:
    stores: list[BatchStore] = []
    yield stores
    for store in stores:
        await store.close()


def held_bytes(store: BatchStore) -> tuple[int, int]:
    """(the total the store keeps, the bytes its parts and results actually hold)."""
    if isinstance(store, SqliteBatches):
        with sqlite3.connect(store.path) as db:
            total = db.execute("SELECT bytes FROM batch_total").fetchone()[0]
            held = db.execute(
                "SELECT (SELECT COALESCE(SUM(LENGTH(data)), 0) FROM batch_parts)"
                " + (SELECT COALESCE(SUM(LENGTH(data)), 0) FROM batch_results)"
            ).fetchone()[0]
            return int(total), int(held)
    assert isinstance(store, RedisBatches)
    client = redis.Redis.from_url(store.url)
    total = int(client.get(store.prefix + "total") or 0)
    held = 0
    for key in client.scan_iter(store.prefix + "p:*"):
        held += sum(len(v) for v in client.hvals(key))
    for key in client.scan_iter(store.prefix + "r:*"):
        held += sum(len(v) for v in client.hvals(key))
    return total, held


async def _open(make: Factory, closing: list[BatchStore], clock: Clock, **kw: Any) -> BatchStore:
    store = make(clock, **kw)
    closing.append(store)
    return store


async def test_documents_are_created_swapped_and_deleted(
    make: Factory, closing: list[BatchStore]
) -> None:
    clock = Clock()
    store = await _open(make, closing, clock)
    assert await store.get("batch_1") is None
    await store.create("batch_1", b"v1", expires=clock.now + 60, indexes={"batches:t": 1.0})
    assert await store.get("batch_1") == b"v1"
    assert await store.swap("batch_1", b"v1", b"v2")
    assert not await store.swap("batch_1", b"v1", b"v3")  # a change it did not see
    assert await store.get("batch_1") == b"v2"
    assert not await store.swap("gone", b"", b"x")
    assert await store.delete("batch_1")
    assert not await store.delete("batch_1")
    assert await store.get("batch_1") is None
    assert await store.page("batches:t", after=None, limit=5, desc=True) == ([], False)


async def test_pages_walk_an_index_newest_or_oldest_first(
    make: Factory, closing: list[BatchStore]
) -> None:
    clock = Clock()
    store = await _open(make, closing, clock)
    # Equal scores are ordered by key, the same on both stores.
    for key, score in [("a", 1.0), ("b", 2.0), ("c", 2.0), ("d", 3.0), ("e", 4.0)]:
        await store.create(key, key.encode(), expires=clock.now + 60, indexes={"x": score})
    await store.create("other", b"o", expires=clock.now + 60, indexes={"y": 1.0})

    async def walk(desc: bool, limit: int) -> list[bytes]:
        seen: list[bytes] = []
        after: str | None = None
        while True:
            page = await store.page("x", after=after, limit=limit, desc=desc)
            assert page is not None
            docs, more = page
            seen += docs
            if not more:
                return seen
            after = docs[-1].decode()

    assert await walk(True, 2) == [b"e", b"d", b"c", b"b", b"a"]
    assert await walk(False, 3) == [b"a", b"b", b"c", b"d", b"e"]
    assert await store.page("x", after="nope", limit=2, desc=True) is None
    assert await store.keys("x") == ["a", "b", "c", "d", "e"]
    await store.listed("x", "c", None)
    await store.listed("y", "a", 0.5)
    assert await store.keys("x") == ["a", "b", "d", "e"]
    assert await store.keys("y") == ["a", "other"]
    assert await store.delete("a")  # out of every index with it
    assert await store.keys("y") == ["other"]


async def test_documents_expire_with_all_under_them(
    make: Factory, closing: list[BatchStore]
) -> None:
    clock = Clock()
    store = await _open(make, closing, clock)
    await store.put_part("f", 0, b"x" * 100, bounded=True)
    await store.create("f", b"file", expires=clock.now + 10, indexes={"files:t": 1.0})
    await store.create("b", b"batch", expires=clock.now + 100, indexes={"active": 1.0})
    assert await store.add_result("b", 0, "succeeded", b"line", (3, 4))
    clock.now += 11
    assert await store.get("f") is None
    assert await store.keys("files:t") == []
    await store.create("g", b"new", expires=clock.now + 10, indexes={})  # removes "f"
    assert await store.part("f", 0) is None
    assert held_bytes(store) == (4, 4)
    assert await store.get("b") == b"batch"
    # Parts whose document never comes expire too.
    await store.put_part("orphan", 0, b"y" * 50, bounded=True)
    clock.now += UPLOAD_S + 1
    await store.create("h", b"new", expires=clock.now + 10, indexes={})
    assert await store.part("orphan", 0) is None
    assert held_bytes(store) == (0, 0)
    assert not await store.add_result("b", 1, "succeeded", b"late")  # its batch is gone


async def test_uploads_are_bounded_and_a_batchs_own_writes_are_not(
    make: Factory, closing: list[BatchStore]
) -> None:
    clock = Clock()
    store = await _open(make, closing, clock, max_bytes=1_000)
    await store.put_part("f1", 0, b"a" * 600, bounded=True)
    await store.put_part("f1", 1, b"a" * 300, bounded=True)
    await store.create("f1", b"{}", expires=clock.now + 60, indexes={})
    with pytest.raises(ResourceExhausted) as refused:
        await store.put_part("f2", 0, b"b" * 200, bounded=True)
    assert refused.value.code == "store_full"
    with pytest.raises(ResourceExhausted):
        await store.put_part("f2", 0, b"b" * 2_000, bounded=True)
    await store.put_part("b1", 0, b"c" * 500, bounded=False)  # a batch's requests
    await store.create("b1", b"{}", expires=clock.now + 60, indexes={})
    assert await store.add_result("b1", 0, "succeeded", b"d" * 100)
    assert held_bytes(store) == (1_500, 1_500)
    assert await store.delete("f1")
    await store.put_part("f2", 0, b"b" * 200, bounded=True)  # room again
    assert await store.part("f2", 0) == b"b" * 200
    assert held_bytes(store) == (800, 800)


async def test_a_tenants_uploads_stay_within_its_quota_and_leave_the_others_room(
    make: Factory, closing: list[BatchStore]
) -> None:
    """Each owner's uploads within its quota, counted across replicas (two stores on one
    backing store) and given back when a file is deleted or expires; fails if one owner's
    uploads can take the bound from another's, or its total drifts."""
    clock = Clock()
    one, two = [await _open(make, closing, clock, max_bytes=1_000) for _ in range(2)]

    async def upload(store: BatchStore, owner: str, key: str, part: int, size: int) -> None:
        data = owner[0].encode() * size
        await store.put_part(key, part, data, bounded=True, owner=owner, quota=500)

    await upload(one, "acme", "a1", 0, 300)
    await one.create("a1", b"{}", expires=clock.now + 60, indexes={})
    await upload(two, "acme", "a2", 0, 150)  # another replica, the same total
    await two.create("a2", b"{}", expires=clock.now + 10, indexes={})
    with pytest.raises(ResourceExhausted) as refused:
        await upload(one, "acme", "a3", 0, 100)
    assert refused.value.code == "store_full" and "quota" in refused.value.message
    await upload(two, "acme", "a2", 0, 190)  # a part written again: its growth
    with pytest.raises(ResourceExhausted):
        await upload(two, "acme", "a2", 1, 20)
    # Another tenant's uploads still fit: the store holds 490 of its 1,000 bytes.
    await upload(one, "beta", "b1", 0, 500)
    await one.create("b1", b"{}", expires=clock.now + 60, indexes={})
    # Room comes back to acme as its files go: one deleted, one expired.
    assert await two.delete("a1")
    await upload(one, "acme", "a3", 0, 300)
    with pytest.raises(ResourceExhausted):
        await upload(one, "acme", "a4", 0, 100)
    clock.now += 11  # a2 (190 bytes) expires; the next write removes it
    await upload(two, "acme", "a4", 0, 190)
    assert held_bytes(one) == (300 + 500 + 190, 300 + 500 + 190)


async def test_a_request_has_one_result_and_the_tally_counts_it(
    make: Factory, closing: list[BatchStore]
) -> None:
    clock = Clock()
    stores = [await _open(make, closing, clock) for _ in range(3)]
    await stores[0].create("b", b"{}", expires=clock.now + 60, indexes={})
    # Every replica races to answer every request: one result each, whoever wins.
    wins = await asyncio.gather(
        *(
            s.add_result("b", i, "succeeded" if i % 3 else "errored", f"{n}:{i}".encode(), (1, 2))
            for i in range(30)
            for n, s in enumerate(stores)
        )
    )
    assert sum(wins) == 30
    results = await stores[1].results("b", 0, 30)
    assert [i for i, _, _ in results] == list(range(30))
    tally = await stores[2].tally("b")
    assert tally.counts == {"succeeded": 20, "errored": 10}
    assert tally.size("succeeded", "errored") == sum(len(d) for _, _, d in results)
    assert (tally.input_tokens, tally.output_tokens) == (30, 60)
    assert await stores[0].results("b", 28, 40) == results[28:]
    rows = [(i, "expired", f"x{i}".encode()) for i in range(25, 35)]
    assert await stores[1].add_results("b", rows) == 5  # those of 30-34: the rest had one
    assert (await stores[0].tally("b")).counts == {"succeeded": 20, "errored": 10, "expired": 5}
    total, held = held_bytes(stores[0])
    assert total == held


async def test_chunks_go_to_one_owner_and_abandoned_ones_come_back(
    make: Factory, closing: list[BatchStore]
) -> None:
    clock = Clock()
    store = await _open(make, closing, clock)
    other = await _open(make, closing, clock)
    await store.create("b", b"{}", expires=clock.now + 600, indexes={})
    now = clock.now
    # Replicas racing for chunks: each handed out once.
    raced = await asyncio.gather(
        *(s.claim("b", chunks=6, owner=f"r{n % 2}", now=now, until=now + 10)
          for n, s in enumerate([store, other] * 4))
    )  # fmt: skip
    assert sorted(c for c in raced if c is not None) == list(range(6))
    assert raced.count(None) == 2
    await store.create("c", b"{}", expires=clock.now + 600, indexes={})
    mine = [await store.claim("c", chunks=4, owner="r0", now=now, until=now + 10) for _ in "ab"]
    theirs = [await other.claim("c", chunks=4, owner="r1", now=now, until=now + 10) for _ in "ab"]
    assert (mine, theirs) == ([0, 1], [2, 3])
    assert await store.leases("c", now) == _leases(4, 0, 4)
    await store.finish("c", 0, owner="r0")
    assert not await store.renew("c", 2, owner="r0", until=now + 20)  # not its own
    assert await store.renew("c", 1, owner="r0", until=now + 20)
    await other.release("c", 2, owner="r1")  # given back: handed out again at once
    assert await store.claim("c", chunks=4, owner="r0", now=now, until=now + 20) == 2
    # r1 dies: its other chunk is abandoned when its lease runs out, and handed out again.
    clock.now += 11
    assert await store.leases("c", clock.now) == _leases(2, 1, 4)
    assert await store.claim("c", chunks=4, owner="r0", now=clock.now, until=clock.now + 10) == 3
    assert not await other.renew("c", 3, owner="r1", until=clock.now + 10)
    await other.finish("c", 3, owner="r1")  # too late: not its chunk any more
    assert await store.leases("c", clock.now) == _leases(3, 0, 4)
    assert await store.claim("c", chunks=4, owner="r0", now=clock.now, until=clock.now) is None


def _leases(live: int, abandoned: int, handed: int) -> Any:
    from app.store.batches import Leases

    return Leases(live, abandoned, handed)


async def test_a_key_has_one_lease_holder(make: Factory, closing: list[BatchStore]) -> None:
    clock = Clock()
    store = await _open(make, closing, clock)
    await store.create("b", b"{}", expires=clock.now + 600, indexes={})
    now = clock.now
    assert await store.lease("b", owner="r0", now=now, until=now + 10)
    assert not await store.lease("b", owner="r1", now=now, until=now + 10)
    assert await store.lease("b", owner="r0", now=now + 5, until=now + 15)  # renewed
    assert not await store.lease("b", owner="r1", now=now + 12, until=now + 22)
    assert await store.lease("b", owner="r1", now=now + 16, until=now + 26)  # expired


async def test_a_lease_without_a_document(make: Factory, closing: list[BatchStore]) -> None:
    """A background response's: held while renewed, ended by its owner, gone once
    expired."""
    clock = Clock()
    store = await _open(make, closing, clock)
    now = clock.now
    assert not await store.leased("response:r", now)
    assert await store.lease("response:r", owner="r0", now=now, until=now + 10)
    assert await store.leased("response:r", now + 5)
    assert not await store.leased("response:r", now + 11)  # its replica died
    await store.unlease("response:r", owner="r1")  # not its: nothing
    assert await store.leased("response:r", now + 5)
    await store.unlease("response:r", owner="r0")
    assert not await store.leased("response:r", now)
