"""The conversations' store on Redis: keys of their own in the Redis every replica shares
(`--responses-store`), so a conversation written on one replica is read on any.

Keys, under a prefix (`switchboard:conversations:` by default):

    c:<id>      hash {exp: expiry in ms of the callers' clock, size: the conversation's
                bytes, data: its object, next: the next item's place}
    d:<id>      hash item id -> item
    o:<id>      sorted set of item ids by place: the order
    index       sorted set of conversation ids by expiry: the order of eviction and expiry
    total       the bytes every conversation holds

Every call is one Lua script, so concurrent writers on any number of replicas keep the
order, the ids and the bookkeeping exact: a write removes expired conversations, checks
its change (the conversation there, its ids new, its size within the bound), evicts the
conversations written longest ago until the total fits, writes, and renews the
conversation's expiry (Redis's own too, so it frees what expires by itself). A read
compares the expiry with the caller's clock, as the response store's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from app.store.base import DEFAULT_CLOCK, Clock, full, too_large
from app.store.conversations import Item, Order, Page, encoded, repeated, unknown_after
from app.store.redis_connection import RedisConnection

_COMMON = """
local p = ARGV[1]
local function drop(id)
    local size = tonumber(redis.call('HGET', p .. 'c:' .. id, 'size') or '0')
    redis.call('DEL', p .. 'c:' .. id, p .. 'd:' .. id, p .. 'o:' .. id)
    redis.call('ZREM', p .. 'index', id)
    redis.call('DECRBY', p .. 'total', size)
end
local function expire(now)
    for _, old in ipairs(redis.call('ZRANGEBYSCORE', p .. 'index', '-inf', now)) do
        drop(old)
    end
end
local function live(id, now)
    return tonumber(redis.call('HGET', p .. 'c:' .. id, 'exp') or '-1') > now
end
local function fit(keep, grown, max)
    while tonumber(redis.call('GET', p .. 'total') or '0') + grown > max do
        local oldest = redis.call('ZRANGE', p .. 'index', 0, 1)
        local victim = oldest[1]
        if victim == keep then victim = oldest[2] end
        if not victim then return end
        drop(victim)
    end
end
local function renew(id, exp, ttl)
    redis.call('HSET', p .. 'c:' .. id, 'exp', exp)
    redis.call('ZADD', p .. 'index', exp, id)
    for _, key in ipairs({'c:', 'd:', 'o:'}) do
        redis.call('PEXPIRE', p .. key .. id, ttl)
    end
end
"""

# The shebang makes Redis refuse a writing script when it is out of memory (one without it
# writes past maxmemory).
_WRITE = "#!lua\n" + _COMMON

# ARGV: prefix, id, data, exp, now, ttl, max, then item ids, then items.
_CREATE = (
    _WRITE
    + """
local id, data = ARGV[2], ARGV[3]
local exp, now = tonumber(ARGV[4]), tonumber(ARGV[5])
local ttl, max = tonumber(ARGV[6]), tonumber(ARGV[7])
local n = (#ARGV - 7) / 2
local size = string.len(data)
for i = 1, n do size = size + string.len(ARGV[7 + n + i]) end
expire(now)
drop(id)
fit(id, size, max)
redis.call('HSET', p .. 'c:' .. id, 'size', size, 'data', data, 'next', n)
for i = 1, n do
    redis.call('HSET', p .. 'd:' .. id, ARGV[7 + i], ARGV[7 + n + i])
    redis.call('ZADD', p .. 'o:' .. id, i - 1, ARGV[7 + i])
end
renew(id, exp, ttl)
redis.call('INCRBY', p .. 'total', size)
return 1
"""
)

# ARGV: prefix, id, data, exp, now, ttl, max. 0: gone; -1: too large.
_UPDATE = (
    _WRITE
    + """
local id, data = ARGV[2], ARGV[3]
local exp, now = tonumber(ARGV[4]), tonumber(ARGV[5])
local ttl, max = tonumber(ARGV[6]), tonumber(ARGV[7])
expire(now)
if not live(id, now) then return 0 end
local size = tonumber(redis.call('HGET', p .. 'c:' .. id, 'size'))
local grown = string.len(data) - redis.call('HSTRLEN', p .. 'c:' .. id, 'data')
if size + grown > max then return -1 end
fit(id, grown, max)
redis.call('HSET', p .. 'c:' .. id, 'data', data, 'size', size + grown)
renew(id, exp, ttl)
redis.call('INCRBY', p .. 'total', grown)
return 1
"""
)

# ARGV: prefix, id, now
_DELETE = (
    _COMMON
    + """
local id, now = ARGV[2], tonumber(ARGV[3])
expire(now)
local existed = live(id, now)
drop(id)
if existed then return 1 end
return 0
"""
)

# ARGV: prefix, id, exp, now, ttl, max, then item ids, then items. {0}: gone; {-1}: too
# large; {2, ids...}: ids already held.
_APPEND = (
    _WRITE
    + """
local id = ARGV[2]
local exp, now = tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl, max = tonumber(ARGV[5]), tonumber(ARGV[6])
local n = (#ARGV - 6) / 2
expire(now)
if not live(id, now) then return {0} end
local held = {2}
for i = 1, n do
    if redis.call('HEXISTS', p .. 'd:' .. id, ARGV[6 + i]) == 1 then
        table.insert(held, ARGV[6 + i])
    end
end
if #held > 1 then return held end
local added = 0
for i = 1, n do added = added + string.len(ARGV[6 + n + i]) end
local size = tonumber(redis.call('HGET', p .. 'c:' .. id, 'size'))
if size + added > max then return {-1} end
fit(id, added, max)
local first = tonumber(redis.call('HGET', p .. 'c:' .. id, 'next'))
for i = 1, n do
    redis.call('HSET', p .. 'd:' .. id, ARGV[6 + i], ARGV[6 + n + i])
    redis.call('ZADD', p .. 'o:' .. id, first + i - 1, ARGV[6 + i])
end
redis.call('HSET', p .. 'c:' .. id, 'next', first + n, 'size', size + added)
renew(id, exp, ttl)
redis.call('INCRBY', p .. 'total', added)
return {1}
"""
)

# ARGV: prefix, id, now, after ('' for none), limit, order. {0}: gone; {-1}: no such
# `after`; {1, more, items...}.
_PAGE = (
    _COMMON
    + """
local id, now, after, limit = ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
if not live(id, now) then return {0} end
local order = p .. 'o:' .. id
local start = nil
if after ~= '' then
    start = redis.call('ZSCORE', order, after)
    if not start then return {-1} end
end
local ids
if ARGV[6] == 'asc' then
    ids = redis.call('ZRANGEBYSCORE', order, start and ('(' .. start) or '-inf', '+inf',
        'LIMIT', 0, limit + 1)
else
    ids = redis.call('ZREVRANGEBYSCORE', order, start and ('(' .. start) or '+inf', '-inf',
        'LIMIT', 0, limit + 1)
end
local out = {1, 0}
if #ids > limit then out[2] = 1; table.remove(ids) end
if #ids > 0 then
    for _, item in ipairs(redis.call('HMGET', p .. 'd:' .. id, unpack(ids))) do
        table.insert(out, item)
    end
end
return out
"""
)

# ARGV: prefix, id, now, item id
_ITEM = (
    _COMMON
    + """
if not live(ARGV[2], tonumber(ARGV[3])) then return false end
return redis.call('HGET', p .. 'd:' .. ARGV[2], ARGV[4])
"""
)

# ARGV: prefix, id, exp, now, ttl, item id
_DELETE_ITEM = (
    _COMMON
    + """
local id, item = ARGV[2], ARGV[6]
local exp, now, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
expire(now)
if not live(id, now) then return 0 end
local size = redis.call('HSTRLEN', p .. 'd:' .. id, item)
if redis.call('HDEL', p .. 'd:' .. id, item) == 0 then return 0 end
redis.call('ZREM', p .. 'o:' .. id, item)
redis.call('HINCRBY', p .. 'c:' .. id, 'size', -size)
renew(id, exp, ttl)
redis.call('DECRBY', p .. 'total', size)
return 1
"""
)


class RedisConversations:
    def __init__(
        self,
        url: str,
        *,
        ttl_s: float,
        max_bytes: int,
        clock: Clock = DEFAULT_CLOCK,
        prefix: str = "switchboard:conversations:",
    ) -> None:
        self.url = url
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.prefix = prefix
        self._clock = clock
        self._redis = RedisConnection(url, store="response store")

    async def _script(self, script: str, *args: Any) -> Any:
        return await self._redis.call("eval", script, 0, self.prefix, *args)

    def _times(self) -> tuple[int, int, int]:
        """Now's expiry, now and the time to live, in ms."""
        now, ttl = int(self._clock() * 1000), int(self.ttl_s * 1000)
        return now + ttl, now, ttl

    def _too_large(self, size: int) -> Exception:
        return full(self._redis.where, too_large(size, self.max_bytes))

    # -- the contract (app.store.conversations) ----------------------------------------

    async def create(self, key: str, data: bytes, items: Sequence[Item]) -> None:
        rows = encoded(items)
        size = len(data) + sum(len(row) for _, row in rows)
        if size > self.max_bytes:
            raise self._too_large(size)
        ids, datas = [item_id for item_id, _ in rows], [row for _, row in rows]
        await self._script(_CREATE, key, data, *self._times(), self.max_bytes, *ids, *datas)

    async def get(self, key: str) -> bytes | None:
        exp, data = await self._redis.call("hmget", self.prefix + "c:" + key, "exp", "data")
        if data is None or exp is None or int(exp) <= int(self._clock() * 1000):
            return None
        return bytes(data)

    async def update(self, key: str, data: bytes) -> bool:
        done = await self._script(_UPDATE, key, data, *self._times(), self.max_bytes)
        if done == -1:
            raise self._too_large(len(data))
        return bool(done)

    async def delete(self, key: str) -> bool:
        return bool(await self._script(_DELETE, key, int(self._clock() * 1000)))

    async def append(self, key: str, items: Sequence[Item]) -> bool:
        rows = encoded(items)
        ids, datas = [item_id for item_id, _ in rows], [row for _, row in rows]
        done = await self._script(_APPEND, key, *self._times(), self.max_bytes, *ids, *datas)
        if done[0] == 2:
            raise repeated([held.decode() for held in done[1:]])
        if done[0] == -1:
            raise self._too_large(sum(len(row) for row in datas))
        return bool(done[0])

    async def items(self, key: str, *, after: str | None, limit: int, order: Order) -> Page | None:
        now = int(self._clock() * 1000)
        done = await self._script(_PAGE, key, now, after or "", limit, order)
        if done[0] == 0:
            return None
        if done[0] == -1:
            raise unknown_after(after or "")
        return Page([orjson.loads(item) for item in done[2:]], bool(done[1]))

    async def item(self, key: str, item_id: str) -> Item | None:
        data = await self._script(_ITEM, key, int(self._clock() * 1000), item_id)
        return None if data is None else dict(orjson.loads(data))

    async def delete_item(self, key: str, item_id: str) -> bool:
        exp, now, ttl = self._times()
        return bool(await self._script(_DELETE_ITEM, key, exp, now, ttl, item_id))

    async def close(self) -> None:
        await self._redis.close()
