"""The conversations' store contract (app/store/conversations.py), held on both stores:
SQLite on a file (beside the responses' tables) and a real redis-server.

How these fail when a store is wrong: items out of order or a page that skips or repeats
one; an id held twice in a conversation after an append (or after two racing appends); a
conversation past its time to live still read, or left behind by the next write; a total
over the bound, or one that no longer matches what is held (`held_bytes`), after
concurrent writers and evictions; a conversation's items outliving it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from app.errors import InvalidRequest, ResourceExhausted, Unavailable
from app.store import open_conversations, open_store
from app.store.conversations import ConversationStore
from app.store.redis_conversations import RedisConversations
from app.store.sqlite_conversations import SqliteConversations
from app.tenants import DEFAULT_TENANT
from tests.redis_server import sorted_set
from tests.store_backends import Clock, location

Factory = Callable[..., ConversationStore]

T = DEFAULT_TENANT  # the tenant of every record here but where a test names others


@pytest.fixture(params=["sqlite", "redis"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Stores of one backend, all on the same file or Redis database (fresh per test)."""
    where = location(request, tmp_path)

    def factory(clock: Clock, *, ttl_s: float = 60.0, max_bytes: int = 10_000) -> ConversationStore:
        return open_conversations(where, ttl_s=ttl_s, max_bytes=max_bytes, clock=clock)

    yield factory


@pytest.fixture
async def closing() -> AsyncIterator[list[Any]]:
    stores: list[Any] = []
    yield stores
    for store in stores:
        await store.close()


def _items(*ids: str, pad: int = 0) -> list[dict[str, Any]]:
    return [{"id": i, "type": "message", "text": "x" * pad} for i in ids]


def held_bytes(store: ConversationStore) -> tuple[int, int]:
    """(the total the store keeps, the bytes it actually holds)."""
    if isinstance(store, SqliteConversations):
        with sqlite3.connect(store.path) as db:
            total = db.execute("SELECT bytes FROM conversations_total").fetchone()[0]
            held = (
                db.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM conversations").fetchone()[0]
                + db.execute(
                    "SELECT COALESCE(SUM(LENGTH(data)), 0) FROM conversation_items"
                ).fetchone()[0]
            )
            sizes = db.execute("SELECT COALESCE(SUM(size), 0) FROM conversations").fetchone()[0]
            assert sizes == held
            return int(total), int(held)
    assert isinstance(store, RedisConversations)
    client = redis.Redis.from_url(store.url)
    total = int(client.get(store.prefix + "total") or 0)
    held = 0
    for conversation in sorted_set(client, store.prefix + "index"):
        held += client.hstrlen(store.prefix + "c:" + conversation, "data")
        held += sum(len(v) for v in client.hvals(store.prefix + "d:" + conversation))
    return total, held


async def _ids(store: ConversationStore, key: str, **page: Any) -> list[str]:
    found = await store.items(T, key, after=page.get("after"), limit=page.get("limit", 100),
                              order=page.get("order", "asc"))  # fmt: skip
    assert found is not None
    return [item["id"] for item in found.items]


async def test_create_read_update_delete(make: Factory, closing: list[Any]) -> None:
    store = make(Clock())
    closing.append(store)
    assert await store.get(T, "conv_1") is None
    await store.create(T, "conv_1", b'{"a": 1}', _items("m1", "m2"))
    assert await store.get(T, "conv_1") == b'{"a": 1}'
    assert await store.update(T, "conv_1", b'{"a": 2}')
    assert not await store.update(T, "conv_gone", b"{}")
    assert await store.get(T, "conv_1") == b'{"a": 2}'
    assert await store.item(T, "conv_1", "m2") == _items("m2")[0]
    assert await store.item(T, "conv_1", "m3") is None
    assert await store.delete(T, "conv_1")
    assert not await store.delete(T, "conv_1")
    assert await store.get(T, "conv_1") is None
    assert await store.items(T, "conv_1", after=None, limit=10, order="asc") is None
    assert await store.item(T, "conv_1", "m2") is None
    assert held_bytes(store) == (0, 0)  # its items went with it


async def test_items_keep_their_order_and_pages_walk_them(
    make: Factory, closing: list[Any]
) -> None:
    store = make(Clock())
    closing.append(store)
    await store.create(T, "c", b"{}", _items("a", "b"))
    assert await store.append(T, "c", _items("c", "d", "e"))
    assert not await store.append(T, "gone", _items("x"))
    assert await _ids(store, "c") == ["a", "b", "c", "d", "e"]
    assert await _ids(store, "c", order="desc") == ["e", "d", "c", "b", "a"]
    first = await store.items(T, "c", after=None, limit=2, order="asc")
    assert first is not None and [i["id"] for i in first.items] == ["a", "b"] and first.has_more
    assert await _ids(store, "c", after="b", limit=2) == ["c", "d"]
    last = await store.items(T, "c", after="c", limit=2, order="asc")
    assert last is not None and [i["id"] for i in last.items] == ["d", "e"]
    assert not last.has_more
    assert await _ids(store, "c", after="c", order="desc") == ["b", "a"]
    with pytest.raises(InvalidRequest) as unknown:
        await store.items(T, "c", after="zz", limit=2, order="asc")
    assert unknown.value.param == "after"
    assert await store.delete_item(T, "c", "c")
    assert not await store.delete_item(T, "c", "c")
    assert await _ids(store, "c") == ["a", "b", "d", "e"]
    assert await store.append(T, "c", _items("c"))  # an id deleted may come back, at the end
    assert await _ids(store, "c") == ["a", "b", "d", "e", "c"]
    total, held = held_bytes(store)
    assert total == held


async def test_an_id_is_held_once(make: Factory, closing: list[Any]) -> None:
    store = make(Clock())
    closing.append(store)
    await store.create(T, "c", b"{}", _items("a"))
    for repeat in (_items("b", "a"), _items("b", "b")):
        with pytest.raises(InvalidRequest):
            await store.append(T, "c", repeat)
    assert await _ids(store, "c") == ["a"]  # all or nothing
    with pytest.raises(InvalidRequest):
        await store.create(T, "d", b"{}", _items("x", "x"))
    # Racing appends of the same id: one wins, the other is refused.
    other = make(Clock())
    closing.append(other)
    results = await asyncio.gather(
        store.append(T, "c", _items("z")), other.append(T, "c", _items("z")), return_exceptions=True
    )
    assert sorted(type(r).__name__ for r in results) == ["InvalidRequest", "bool"]
    assert await _ids(store, "c") == ["a", "z"]


async def test_conversations_expire_from_their_last_write(
    make: Factory, closing: list[Any]
) -> None:
    clock = Clock()
    store = make(clock, ttl_s=10)
    closing.append(store)
    await store.create(T, "old", b"{}", _items("a"))
    await store.create(T, "kept", b"{}", _items("a"))
    clock.now += 6
    assert await store.append(T, "kept", _items("b"))  # renews it
    clock.now += 6
    assert await store.get(T, "old") is None
    assert await store.items(T, "old", after=None, limit=5, order="asc") is None
    assert await store.get(T, "kept") == b"{}"
    await store.create(T, "new", b"{}", [])  # the next write removes what expired
    assert held_bytes(store)[0] == held_bytes(store)[1]
    assert not await store.update(T, "old", b"{}") and not await store.delete(T, "old")


async def test_the_bound_evicts_the_conversations_written_longest_ago(
    make: Factory, closing: list[Any]
) -> None:
    clock = Clock()
    store = make(clock, max_bytes=2_000)
    closing.append(store)
    for i in range(4):
        await store.create(T, f"c{i}", b"{}", _items("a", pad=300))
        clock.now += 1
    assert await store.append(T, "c0", _items("b", pad=300))  # c0 written last now
    await store.create(T, "c4", b"{}", _items("a", pad=300))
    alive = [key for key in ("c0", "c1", "c2", "c3", "c4") if await store.get(T, key)]
    assert "c0" in alive and "c4" in alive and "c1" not in alive
    total, held = held_bytes(store)
    assert total == held <= 2_000
    with pytest.raises(ResourceExhausted) as too_large:
        await store.append(T, "c0", _items("huge", pad=3_000))
    assert too_large.value.code == "store_full"
    assert await store.item(T, "c0", "huge") is None


async def test_concurrent_writers_keep_the_books(make: Factory, closing: list[Any]) -> None:
    stores = [make(Clock(), max_bytes=6_000) for _ in range(3)]
    closing.extend(stores)

    async def writer(n: int) -> None:  # 12 conversations of ~900 bytes: evictions
        store = stores[n % 3]
        await store.create(T, f"own{n}", b"{}", _items("a", pad=400))
        await store.append(T, f"own{n}", _items("b", pad=400))

    await asyncio.gather(*(writer(n) for n in range(12)))
    total, held = held_bytes(stores[0])
    assert total == held <= 6_000
    await stores[0].create(T, "shared", b"{}", [])
    appended = await asyncio.gather(
        *(stores[n % 3].append(T, "shared", _items(f"s{n}", pad=20)) for n in range(12))
    )
    assert all(appended)
    assert sorted(await _ids(stores[0], "shared")) == sorted(f"s{n}" for n in range(12))
    total, held = held_bytes(stores[0])
    assert total == held <= 6_000


async def test_both_live_beside_the_responses(make: Factory, closing: list[Any]) -> None:
    """The conversations' tables (or keys) share the responses' file (or Redis)."""
    store = make(Clock())
    closing.append(store)
    await store.create(T, "conv_1", orjson.dumps({"id": "conv_1"}), _items("a"))
    if isinstance(store, SqliteConversations):
        location = str(store.path)
    else:
        assert isinstance(store, RedisConversations)
        location = store.url
    responses = open_store(location, ttl_s=60, max_bytes=10_000)
    closing.append(responses)
    await responses.put(T, "resp_1", b"r")
    assert await responses.get(T, "resp_1") == b"r"
    assert await store.get(T, "conv_1") == orjson.dumps({"id": "conv_1"})


async def test_a_store_that_cannot_be_reached_is_unavailable(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    stores = [
        open_conversations(str(blocked / "x.sqlite3"), ttl_s=1, max_bytes=100),
        open_conversations("redis://127.0.0.1:1", ttl_s=1, max_bytes=100),
    ]
    for store in stores:
        with pytest.raises(Unavailable) as raised:
            await store.get(T, "c")
        assert raised.value.code == "store_unavailable"
        await store.close()
