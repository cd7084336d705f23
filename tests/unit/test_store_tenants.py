"""Stored state by tenant (`app.store`): stored responses and conversations, on SQLite and a
real redis-server. Each record is its tenant's: another tenant's id reads, deletes and
writes as one never stored; a tenant at its quota, or at the store's bound, evicts only
its own records, oldest first, and is refused rather than evict another's; one record
may not be as large as the store; the bookkeeping of each tenant stays exact under
concurrent writers; and records stored before tenants are the default tenant's, moved
into its order and totals when a store first opens them.

How these fail when the store is wrong: another tenant's record returned, deleted or
replaced; a tenant's write evicting another's record (asserted by id); a per-tenant
total that no longer matches its records (`per_tenant`); an old store's records lost or
left outside the default tenant's quota.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis

from app.errors import ResourceExhausted
from app.store import open_conversations, open_store
from app.store.base import ResponseStore
from app.store.conversations import ConversationStore
from app.store.redis import RedisStore
from app.store.redis_conversations import RedisConversations
from app.store.sqlite import SqliteStore
from app.store.sqlite_conversations import SqliteConversations
from app.tenants import DEFAULT_TENANT
from tests.redis_server import sorted_set
from tests.store_backends import Clock, location

A, B = "acme", "beta"


@pytest.fixture(params=["sqlite", "redis"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return location(request, tmp_path)


@pytest.fixture
async def closing() -> AsyncIterator[list[Any]]:
    stores: list[Any] = []
    yield stores
    for store in stores:
        await store.close()


def responses(
    where: str, closing: list[Any], *, max_bytes: int = 10_000, max_record_bytes: int = 0
) -> ResponseStore:
    store = open_store(
        where, ttl_s=60, max_bytes=max_bytes, max_record_bytes=max_record_bytes, clock=Clock()
    )
    closing.append(store)
    return store


def conversations(
    where: str, closing: list[Any], *, max_bytes: int = 10_000, max_record_bytes: int = 0
) -> ConversationStore:
    store = open_conversations(
        where, ttl_s=60, max_bytes=max_bytes, max_record_bytes=max_record_bytes, clock=Clock()
    )
    closing.append(store)
    return store


def per_tenant(store: ResponseStore | ConversationStore) -> dict[str, tuple[int, int, set[str]]]:
    """Each tenant's (total kept, bytes its records hold, ids in its order)."""
    out: dict[str, tuple[int, int, set[str]]] = {}
    if isinstance(store, (SqliteStore, SqliteConversations)):
        table, totals = (
            ("responses", "tenant_totals")
            if isinstance(store, SqliteStore)
            else ("conversations", "conversation_tenants")
        )
        with sqlite3.connect(store.path) as db:
            kept = dict(db.execute(f"SELECT tenant, bytes FROM {totals}").fetchall())
            held: dict[str, tuple[int, set[str]]] = {}
            for tenant, key, size in db.execute(f"SELECT tenant, id, size FROM {table}"):
                size_sum, ids = held.get(tenant, (0, set()))
                held[tenant] = (size_sum + size, ids | {key})
        for tenant in {*kept, *held}:
            size_sum, ids = held.get(tenant, (0, set()))
            out[tenant] = (int(kept.get(tenant, 0)), size_sum, ids)
        return {t: v for t, v in out.items() if v != (0, 0, set())}
    assert isinstance(store, (RedisStore, RedisConversations))
    client = redis.Redis.from_url(store.url)
    owners = {_text(k): _text(v) for k, v in client.hgetall(store.prefix + "tenants").items()}
    sizes = {_text(k): int(v) for k, v in client.hgetall(store.prefix + "sizes").items()}
    for tenant in set(owners.values()):
        ids = {key for key, owner in owners.items() if owner == tenant}
        total = int(client.get(store.prefix + "total:" + tenant) or 0)
        assert set(sorted_set(client, store.prefix + "index:" + tenant)) == ids
        out[tenant] = (total, sum(sizes[key] for key in ids), ids)
    return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def consistent(store: ResponseStore | ConversationStore) -> dict[str, set[str]]:
    """Each tenant's ids, once its total is checked against what its records hold."""
    found = per_tenant(store)
    for tenant, (kept, held, _) in found.items():
        assert kept == held, (tenant, kept, held)
    return {tenant: ids for tenant, (_, _, ids) in found.items()}


# -- stored responses --------------------------------------------------------------------


async def test_a_response_is_its_tenants(where: str, closing: list[Any]) -> None:
    store = responses(where, closing)
    await store.put(A, "resp_1", b"acme's")
    assert await store.get(A, "resp_1") == b"acme's"
    for other in (B, DEFAULT_TENANT):
        assert await store.get(other, "resp_1") is None
        assert not await store.delete(other, "resp_1")
    assert await store.get(A, "resp_1") == b"acme's"
    assert await store.delete(A, "resp_1")
    assert await store.get(A, "resp_1") is None


async def test_a_tenant_at_its_quota_evicts_only_its_own_responses(
    where: str, closing: list[Any]
) -> None:
    store = responses(where, closing)
    await store.put(B, "theirs", b"b" * 2_000, quota=3_000)
    for n in range(6):
        await store.put(A, f"mine{n}", b"a" * 1_000, quota=3_000)
    assert consistent(store) == {A: {"mine3", "mine4", "mine5"}, B: {"theirs"}}
    with pytest.raises(ResourceExhausted, match="your quota of 3000"):
        await store.put(A, "huge", b"a" * 3_001, quota=3_000)
    assert await store.get(B, "theirs") == b"b" * 2_000


async def test_at_the_stores_bound_a_tenant_is_refused_rather_than_evict_anothers(
    where: str, closing: list[Any]
) -> None:
    store = responses(where, closing, max_bytes=3_000)  # quotas of 3,000 each: overcommitted
    await store.put(B, "theirs", b"b" * 2_500)
    with pytest.raises(ResourceExhausted, match="other tenants' records") as refused:
        await store.put(A, "mine", b"a" * 1_000)
    assert refused.value.code == "store_full"
    await store.put(A, "small", b"a" * 400)
    with pytest.raises(ResourceExhausted):
        await store.put(A, "more", b"a" * 600)  # not even with its own 400 evicted
    assert await store.get(A, "small") == b"a" * 400  # all or nothing: still there
    assert await store.get(B, "theirs") == b"b" * 2_500
    assert consistent(store) == {A: {"small"}, B: {"theirs"}}


async def test_one_response_may_not_be_as_large_as_the_store(
    where: str, closing: list[Any]
) -> None:
    store = responses(where, closing, max_bytes=10_000, max_record_bytes=1_000)
    await store.put(A, "fits", b"x" * 1_000)
    with pytest.raises(ResourceExhausted, match="bound of one record"):
        await store.put(A, "too-big", b"x" * 1_001)
    assert await store.get(A, "fits") == b"x" * 1_000


async def test_tenants_writing_at_once_keep_each_total_exact(
    where: str, closing: list[Any]
) -> None:
    stores = [responses(where, closing, max_bytes=6_000) for _ in range(3)]

    async def write(n: int) -> None:
        tenant = (A, B, DEFAULT_TENANT)[n % 3]
        with contextlib.suppress(ResourceExhausted):  # no room this tenant may make
            await stores[n % 3].put(tenant, f"r{n}", b"z" * (100 + 37 * n), quota=2_000)

    await asyncio.gather(*(write(n) for n in range(60)))
    totals = per_tenant(stores[0])
    for tenant, (kept, held, _) in totals.items():
        assert kept == held <= 2_000, tenant


async def test_responses_stored_before_tenants_are_the_default_tenants(
    where: str, closing: list[Any], tmp_path: Path
) -> None:
    if where.startswith("redis"):
        client = redis.Redis.from_url(where)
        prefix = "switchboard:responses:"
        far = 10**15  # an expiry in ms far past the test clock's now
        for key, data in (("old1", b"one"), ("old2", b"two!")):
            client.hset(prefix + "r:" + key, mapping={"exp": far, "data": data})
            client.zadd(prefix + "index", {key: far})
            client.hset(prefix + "sizes", key, len(data))
            client.incrby(prefix + "total", len(data))
    else:
        with sqlite3.connect(where) as db:  # the schema of the release before tenants
            db.executescript(
                """
                CREATE TABLE responses (id TEXT PRIMARY KEY, expires REAL NOT NULL,
                    size INTEGER NOT NULL, data BLOB NOT NULL);
                CREATE TABLE total (one INTEGER PRIMARY KEY CHECK (one = 1),
                    bytes INTEGER NOT NULL);
                INSERT INTO total VALUES (1, 7);
                CREATE TABLE cancels (id TEXT PRIMARY KEY, expires REAL NOT NULL);
                INSERT INTO responses VALUES ('old1', 1e12, 3, x'6f6e65');
                INSERT INTO responses VALUES ('old2', 1e12, 4, x'74776f21');
                """
            )
    store = responses(where, closing)
    assert await store.get(DEFAULT_TENANT, "old1") == b"one"
    assert await store.get(A, "old1") is None
    assert consistent(store) == {DEFAULT_TENANT: {"old1", "old2"}}
    # In the default tenant's order: its quota evicts them, oldest first.
    await store.put(DEFAULT_TENANT, "new", b"n" * 998, quota=1_003)
    assert await store.get(DEFAULT_TENANT, "old1") is None
    assert consistent(store) == {DEFAULT_TENANT: {"old2", "new"}}
    again = responses(where, closing)  # a second opening moves nothing twice
    assert await again.get(DEFAULT_TENANT, "old2") == b"two!"
    assert consistent(again) == {DEFAULT_TENANT: {"old2", "new"}}


# -- conversations ------------------------------------------------------------------------


def _items(*ids: str, pad: int = 0) -> list[dict[str, Any]]:
    return [{"id": i, "type": "message", "text": "x" * pad} for i in ids]


async def test_a_conversation_is_its_tenants(where: str, closing: list[Any]) -> None:
    store = conversations(where, closing)
    await store.create(A, "conv_1", b'{"a": 1}', _items("m1"))
    for other in (B, DEFAULT_TENANT):
        assert await store.get(other, "conv_1") is None
        assert not await store.update(other, "conv_1", b"{}")
        assert not await store.append(other, "conv_1", _items("m2"))
        assert await store.items(other, "conv_1", after=None, limit=10, order="asc") is None
        assert await store.item(other, "conv_1", "m1") is None
        assert not await store.delete_item(other, "conv_1", "m1")
        assert not await store.delete(other, "conv_1")
    assert await store.get(A, "conv_1") == b'{"a": 1}'
    page = await store.items(A, "conv_1", after=None, limit=10, order="asc")
    assert page is not None and [item["id"] for item in page.items] == ["m1"]
    assert consistent(store) == {A: {"conv_1"}}


async def test_a_tenant_at_its_quota_evicts_only_its_own_conversations(
    where: str, closing: list[Any]
) -> None:
    store = conversations(where, closing)
    await store.create(B, "theirs", b"{}", _items("b", pad=1_500), quota=3_000)
    for n in range(6):
        await store.create(A, f"mine{n}", b"{}", _items("a", pad=900), quota=3_000)
    assert consistent(store) == {A: {"mine3", "mine4", "mine5"}, B: {"theirs"}}
    # Growing one past the quota evicts its own others, never the one it grows.
    assert await store.append(A, "mine5", _items("more", pad=1_500), quota=3_000)
    assert consistent(store) == {A: {"mine5"}, B: {"theirs"}}
    with pytest.raises(ResourceExhausted, match="your quota of 3000"):
        await store.append(A, "mine5", _items("past", pad=1_000), quota=3_000)
    assert await store.get(B, "theirs") == b"{}"


async def test_at_the_stores_bound_a_conversation_evicts_nothing_of_anothers(
    where: str, closing: list[Any]
) -> None:
    store = conversations(where, closing, max_bytes=3_000)
    await store.create(B, "theirs", b"{}", _items("b", pad=2_400))
    with pytest.raises(ResourceExhausted, match="other tenants' records"):
        await store.create(A, "mine", b"{}", _items("a", pad=900))
    assert consistent(store) == {B: {"theirs"}}


async def test_one_conversation_may_not_be_as_large_as_the_store(
    where: str, closing: list[Any]
) -> None:
    store = conversations(where, closing, max_bytes=10_000, max_record_bytes=1_000)
    await store.create(A, "c", b"{}", _items("first", pad=500))
    with pytest.raises(ResourceExhausted, match="bound of one record"):
        await store.append(A, "c", _items("second", pad=500))
    with pytest.raises(ResourceExhausted, match="bound of one record"):
        await store.create(A, "big", b"{}", _items("x", pad=1_000))
    page = await store.items(A, "c", after=None, limit=10, order="asc")
    assert page is not None and [item["id"] for item in page.items] == ["first"]


async def test_conversations_stored_before_tenants_are_the_default_tenants(
    where: str, closing: list[Any]
) -> None:
    if where.startswith("redis"):
        client = redis.Redis.from_url(where)
        prefix = "switchboard:conversations:"
        far = 10**15
        item = b'{"id":"m1","type":"message"}'
        client.hset(prefix + "c:old", mapping={"exp": far, "size": 2 + len(item), "data": b"{}"})
        client.hset(prefix + "c:old", "next", 1)
        client.hset(prefix + "d:old", "m1", item)
        client.zadd(prefix + "o:old", {"m1": 0})
        client.zadd(prefix + "index", {"old": far})
        client.incrby(prefix + "total", 2 + len(item))
    else:
        with sqlite3.connect(where) as db:  # the schema of the release before tenants
            db.executescript(
                """
                CREATE TABLE conversations (id TEXT PRIMARY KEY, expires REAL NOT NULL,
                    size INTEGER NOT NULL, data BLOB NOT NULL);
                CREATE TABLE conversation_items (conversation TEXT NOT NULL,
                    seq INTEGER NOT NULL, id TEXT NOT NULL, size INTEGER NOT NULL,
                    data BLOB NOT NULL, PRIMARY KEY (conversation, seq));
                CREATE TABLE conversations_total (one INTEGER PRIMARY KEY CHECK (one = 1),
                    bytes INTEGER NOT NULL);
                INSERT INTO conversations VALUES ('old', 1e12, 2, x'7b7d');
                INSERT INTO conversations_total VALUES (1, 2);
                """
            )
    store = conversations(where, closing)
    assert await store.get(DEFAULT_TENANT, "old") == b"{}"
    assert await store.get(A, "old") is None
    assert await store.append(DEFAULT_TENANT, "old", _items("m2"))
    assert consistent(store) == {DEFAULT_TENANT: {"old"}}


def test_the_per_record_bound_defaults_below_the_stores() -> None:
    from app.config import Settings

    settings = Settings(model="m")
    assert 0 < settings.responses_store_max_record_bytes < settings.responses_store_max_bytes
