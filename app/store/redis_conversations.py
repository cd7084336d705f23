"""The conversations' store on Redis: keys of their own in the Redis every replica shares
(`--responses-store`), so a conversation written on one replica is read on any.

Keys, under a prefix (`switchboard:conversations:` by default):

    c:<id>          hash {exp: expiry in ms of the callers' clock, size: the
                    conversation's bytes, data: its object, next: the next item's place,
                    tenant: its tenant}
    d:<id>          hash item id -> item
    o:<id>          sorted set of item ids by place: the order
    index           sorted set of conversation ids by expiry: the order of expiry
    index:<tenant>  the same of one tenant's conversations: the order of its evictions
    sizes, tenants  hashes id -> bytes, id -> tenant (kept apart from `c:<id>`, which
                    Redis may free by itself at its expiry)
    total           the bytes every conversation holds
    total:<tenant>  the bytes one tenant's conversations hold
    schema          "2" once conversations stored before tenants are the default's

Every call is one Lua script, so concurrent writers on any number of replicas keep the
order, the ids and the bookkeeping exact: a write removes expired conversations, checks
its change (the conversation there and the caller's tenant's, its ids new, its size
within one record's bound), evicts the tenant's conversations written longest ago until
the change fits the tenant's quota and the store's bound (never another tenant's),
writes, and renews the conversation's expiry (Redis's own too, so it frees what expires
by itself). A read compares the expiry with the caller's clock, as the response store's
does, and the owner with the caller's tenant. A store from before tenants is brought up
to date the first time a replica uses it, in chunks (each one script).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from app.store.conversations import Item, Order, Page, encoded, repeated, unknown_after
from app.store.redis import RedisBoundedStore
from app.tenants import DEFAULT_TENANT

# Every script's ARGV begins: prefix, the caller's tenant, the default tenant.
_COMMON = """
local p, tenant, default = ARGV[1], ARGV[2], ARGV[3]
local function size_of(id)
    return tonumber(redis.call('HGET', p .. 'sizes', id)
        or redis.call('HGET', p .. 'c:' .. id, 'size') or '0')
end
local function drop(id)
    local size = size_of(id)
    local owner = redis.call('HGET', p .. 'tenants', id)
    redis.call('DEL', p .. 'c:' .. id, p .. 'd:' .. id, p .. 'o:' .. id)
    redis.call('ZREM', p .. 'index', id)
    redis.call('HDEL', p .. 'sizes', id)
    redis.call('HDEL', p .. 'tenants', id)
    redis.call('DECRBY', p .. 'total', size)
    if owner then
        redis.call('ZREM', p .. 'index:' .. owner, id)
        redis.call('DECRBY', p .. 'total:' .. owner, size)
    end
end
local function expire(now)
    for _, old in ipairs(redis.call('ZRANGEBYSCORE', p .. 'index', '-inf', now)) do
        drop(old)
    end
end
local function owner_of(id)
    return redis.call('HGET', p .. 'tenants', id)
        or redis.call('HGET', p .. 'c:' .. id, 'tenant') or default
end
local function live(id, now)
    return tonumber(redis.call('HGET', p .. 'c:' .. id, 'exp') or '-1') > now
        and owner_of(id) == tenant
end
local function adopt(id)
    -- a conversation stored before tenants, written again: into its tenant's bookkeeping
    if redis.call('HEXISTS', p .. 'tenants', id) == 0 then
        local size = tonumber(redis.call('HGET', p .. 'c:' .. id, 'size') or '0')
        redis.call('HSET', p .. 'tenants', id, tenant)
        redis.call('HSET', p .. 'sizes', id, size)
        redis.call('HSET', p .. 'c:' .. id, 'tenant', tenant)
        redis.call('INCRBY', p .. 'total:' .. tenant, size)
    end
end
local function totals()
    return tonumber(redis.call('GET', p .. 'total') or '0'),
        tonumber(redis.call('GET', p .. 'total:' .. tenant) or '0')
end
local function fit(keep, grown, max, quota)
    -- the tenant's own written longest ago out (never `keep`) until `grown` fits; all or
    -- nothing: false, nothing evicted, if even all of them could not make the room
    local total, own = totals()
    local kept = 0
    if redis.call('HGET', p .. 'tenants', keep) == tenant then kept = size_of(keep) end
    if total - own + kept + grown > max then return false end
    while total + grown > max or own + grown > quota do
        local oldest = redis.call('ZRANGE', p .. 'index:' .. tenant, 0, 1)
        local victim = oldest[1]
        if victim == keep then victim = oldest[2] end
        if not victim then return false end
        drop(victim)
        total, own = totals()
    end
    return true
end
local function grow(id, grown)
    redis.call('HINCRBY', p .. 'c:' .. id, 'size', grown)
    redis.call('HINCRBY', p .. 'sizes', id, grown)
    redis.call('INCRBY', p .. 'total', grown)
    redis.call('INCRBY', p .. 'total:' .. tenant, grown)
end
local function renew(id, exp, ttl)
    redis.call('HSET', p .. 'c:' .. id, 'exp', exp)
    redis.call('ZADD', p .. 'index', exp, id)
    redis.call('ZADD', p .. 'index:' .. tenant, exp, id)
    for _, key in ipairs({'c:', 'd:', 'o:'}) do
        redis.call('PEXPIRE', p .. key .. id, ttl)
    end
end
"""

# The shebang makes Redis refuse a writing script when it is out of memory (one without it
# writes past maxmemory).
_WRITE = "#!lua\n" + _COMMON

# ARGV: prefix, tenant, default, id, data, exp, now, ttl, max, quota, then item ids, then
# items. -1: no room its tenant may make; -2: the id is another tenant's.
_CREATE = (
    _WRITE
    + """
local id, data = ARGV[4], ARGV[5]
local exp, now = tonumber(ARGV[6]), tonumber(ARGV[7])
local ttl, max, quota = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local n = (#ARGV - 10) / 2
local size = string.len(data)
for i = 1, n do size = size + string.len(ARGV[10 + n + i]) end
expire(now)
if redis.call('EXISTS', p .. 'c:' .. id) == 1 and owner_of(id) ~= tenant then return -2 end
drop(id)
if not fit(id, size, max, quota) then return -1 end
redis.call('HSET', p .. 'c:' .. id, 'size', 0, 'data', data, 'next', n, 'tenant', tenant)
redis.call('HSET', p .. 'sizes', id, 0)
redis.call('HSET', p .. 'tenants', id, tenant)
for i = 1, n do
    redis.call('HSET', p .. 'd:' .. id, ARGV[10 + i], ARGV[10 + n + i])
    redis.call('ZADD', p .. 'o:' .. id, i - 1, ARGV[10 + i])
end
grow(id, size)
renew(id, exp, ttl)
return 1
"""
)

# ARGV: prefix, tenant, default, id, data, exp, now, ttl, max, quota, record bound. 0:
# gone; -1: no room its tenant may make; -3: over one record's bound (its size then).
_UPDATE = (
    _WRITE
    + """
local id, data = ARGV[4], ARGV[5]
local exp, now = tonumber(ARGV[6]), tonumber(ARGV[7])
local ttl, max, quota = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
expire(now)
if not live(id, now) then return {0} end
adopt(id)
local size = size_of(id)
local grown = string.len(data) - redis.call('HSTRLEN', p .. 'c:' .. id, 'data')
if size + grown > tonumber(ARGV[11]) or size + grown > quota then return {-3, size + grown} end
if not fit(id, grown, max, quota) then return {-1} end
redis.call('HSET', p .. 'c:' .. id, 'data', data)
grow(id, grown)
renew(id, exp, ttl)
return {1}
"""
)

# ARGV: prefix, tenant, default, id, now
_DELETE = (
    _COMMON
    + """
local id, now = ARGV[4], tonumber(ARGV[5])
expire(now)
if owner_of(id) ~= tenant then return 0 end
local existed = live(id, now)
drop(id)
if existed then return 1 end
return 0
"""
)

# ARGV: prefix, tenant, default, id, exp, now, ttl, max, quota, record bound, then item
# ids, then items. {0}: gone; {-1}: no room its tenant may make; {-3, size}: over one
# record's bound; {2, ids...}: ids already held.
_APPEND = (
    _WRITE
    + """
local id = ARGV[4]
local exp, now = tonumber(ARGV[5]), tonumber(ARGV[6])
local ttl, max, quota = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local n = (#ARGV - 10) / 2
expire(now)
if not live(id, now) then return {0} end
local held = {2}
for i = 1, n do
    if redis.call('HEXISTS', p .. 'd:' .. id, ARGV[10 + i]) == 1 then
        table.insert(held, ARGV[10 + i])
    end
end
if #held > 1 then return held end
adopt(id)
local added = 0
for i = 1, n do added = added + string.len(ARGV[10 + n + i]) end
local size = size_of(id)
if size + added > tonumber(ARGV[10]) or size + added > quota then
    return {-3, size + added}
end
if not fit(id, added, max, quota) then return {-1} end
local first = tonumber(redis.call('HGET', p .. 'c:' .. id, 'next'))
for i = 1, n do
    redis.call('HSET', p .. 'd:' .. id, ARGV[10 + i], ARGV[10 + n + i])
    redis.call('ZADD', p .. 'o:' .. id, first + i - 1, ARGV[10 + i])
end
redis.call('HSET', p .. 'c:' .. id, 'next', first + n)
grow(id, added)
renew(id, exp, ttl)
return {1}
"""
)

# ARGV: prefix, tenant, default, id, now, after ('' for none), limit, order. {0}: gone;
# {-1}: no such `after`; {1, more, items...}.
_PAGE = (
    _COMMON
    + """
local id, now, after, limit = ARGV[4], tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
if not live(id, now) then return {0} end
local order = p .. 'o:' .. id
local start = nil
if after ~= '' then
    start = redis.call('ZSCORE', order, after)
    if not start then return {-1} end
end
local ids
if ARGV[8] == 'asc' then
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

# ARGV: prefix, tenant, default, id, now, item id
_ITEM = (
    _COMMON
    + """
if not live(ARGV[4], tonumber(ARGV[5])) then return false end
return redis.call('HGET', p .. 'd:' .. ARGV[4], ARGV[6])
"""
)

# ARGV: prefix, tenant, default, id, exp, now, ttl, item id
_DELETE_ITEM = (
    _WRITE
    + """
local id, item = ARGV[4], ARGV[8]
local exp, now, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
expire(now)
if not live(id, now) then return 0 end
adopt(id)
local size = redis.call('HSTRLEN', p .. 'd:' .. id, item)
if redis.call('HDEL', p .. 'd:' .. id, item) == 0 then return 0 end
redis.call('ZREM', p .. 'o:' .. id, item)
grow(id, -size)
renew(id, exp, ttl)
return 1
"""
)

# ARGV: prefix, the default tenant (as the caller's), the default tenant, first rank,
# count. Conversations stored before tenants become the default tenant's; {seen, moved}.
_MIGRATE = (
    _WRITE
    + """
local first, count = tonumber(ARGV[4]), tonumber(ARGV[5])
local moved = 0
local ids = redis.call('ZRANGE', p .. 'index', first, first + count - 1, 'WITHSCORES')
for i = 1, #ids, 2 do
    local id, exp = ids[i], ids[i + 1]
    if redis.call('HEXISTS', p .. 'tenants', id) == 0 then
        adopt(id)
        redis.call('ZADD', p .. 'index:' .. tenant, exp, id)
        moved = moved + 1
    end
end
return {#ids / 2, moved}
"""
)


class RedisConversations(RedisBoundedStore):
    PREFIX = "switchboard:conversations:"
    MIGRATE = _MIGRATE

    async def _script(self, script: str, tenant: str, *args: Any) -> Any:
        await self._ready()
        return await self._redis.call("eval", script, 0, self.prefix, tenant, DEFAULT_TENANT, *args)

    def _times(self) -> tuple[int, int, int]:
        """Now's expiry, now and the time to live, in ms."""
        now, ttl = self._ms(), int(self.ttl_s * 1000)
        return now + ttl, now, ttl

    # -- the contract (app.store.conversations) ----------------------------------------

    async def create(
        self, tenant: str, key: str, data: bytes, items: Sequence[Item], *, quota: int = 0
    ) -> None:
        rows = encoded(items)
        size = len(data) + sum(len(row) for _, row in rows)
        quota = self._quota(quota)
        self._check(size, quota)
        ids, datas = [item_id for item_id, _ in rows], [row for _, row in rows]
        done = await self._script(
            _CREATE, tenant, key, data, *self._times(), self.max_bytes, quota, *ids, *datas
        )
        if done == -2:
            raise RuntimeError(f"conversation {key} is another tenant's: ids must not collide")
        if done == -1:
            raise self._no_room(size)

    async def get(self, tenant: str, key: str) -> bytes | None:
        await self._ready()
        exp, data, owner = await self._redis.call(
            "hmget", self.prefix + "c:" + key, "exp", "data", "tenant"
        )
        if data is None or exp is None or int(exp) <= self._ms():
            return None
        if (owner.decode() if owner is not None else DEFAULT_TENANT) != tenant:
            return None
        return bytes(data)

    async def update(self, tenant: str, key: str, data: bytes, *, quota: int = 0) -> bool:
        quota = self._quota(quota)
        done = await self._script(
            _UPDATE, tenant, key, data, *self._times(), self.max_bytes, quota,
            self.max_record_bytes,
        )  # fmt: skip
        if done[0] == -3:
            self._check(int(done[1]), quota)
        if done[0] == -1:
            raise self._no_room(len(data))
        return bool(done[0])

    async def delete(self, tenant: str, key: str) -> bool:
        return bool(await self._script(_DELETE, tenant, key, int(self._clock() * 1000)))

    async def append(self, tenant: str, key: str, items: Sequence[Item], *, quota: int = 0) -> bool:
        rows = encoded(items)
        quota = self._quota(quota)
        ids, datas = [item_id for item_id, _ in rows], [row for _, row in rows]
        done = await self._script(
            _APPEND, tenant, key, *self._times(), self.max_bytes, quota, self.max_record_bytes,
            *ids, *datas,
        )  # fmt: skip
        if done[0] == 2:
            raise repeated([held.decode() for held in done[1:]])
        if done[0] == -3:
            self._check(int(done[1]), quota)
        if done[0] == -1:
            raise self._no_room(sum(len(row) for row in datas))
        return bool(done[0])

    async def items(
        self, tenant: str, key: str, *, after: str | None, limit: int, order: Order
    ) -> Page | None:
        now = int(self._clock() * 1000)
        done = await self._script(_PAGE, tenant, key, now, after or "", limit, order)
        if done[0] == 0:
            return None
        if done[0] == -1:
            raise unknown_after(after or "")
        return Page([orjson.loads(item) for item in done[2:]], bool(done[1]))

    async def item(self, tenant: str, key: str, item_id: str) -> Item | None:
        data = await self._script(_ITEM, tenant, key, int(self._clock() * 1000), item_id)
        return None if data is None else dict(orjson.loads(data))

    async def delete_item(self, tenant: str, key: str, item_id: str) -> bool:
        exp, now, ttl = self._times()
        return bool(await self._script(_DELETE_ITEM, tenant, key, exp, now, ttl, item_id))

    async def close(self) -> None:
        await self._redis.close()
