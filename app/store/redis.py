"""The shared response store: one Redis (standalone, not cluster) for every replica, so a
follow-up (`previous_response_id`), a retrieval or a cancel may land on any of them.

Keys, under a prefix (`switchboard:responses:` by default):

    r:<id>            hash {exp: expiry in ms of the callers' clock, data: the record,
                      tenant: its tenant}, with a Redis expiry of the time to live (Redis
                      frees it by itself)
    index             sorted set of ids by expiry: the order of expiry
    index:<tenant>    the same of one tenant's records: the order of its evictions
    sizes, tenants    hashes id -> bytes, id -> tenant
    total             the bytes all records hold
    total:<tenant>    the bytes one tenant's records hold
    cancel:<id>       a raised cancel flag, expiring with the time to live
    schema            "2" once records stored before tenants are the default tenant's

`put` and `delete` are Lua scripts, so concurrent writers (any number of replicas) keep
the orders, sizes and totals exact: the script removes expired ids, replaces the record,
evicts its tenant's oldest until the record fits the tenant's quota and the store's
bound (or refuses it, other tenants' records untouched), and writes, atomically. A store
from before tenants is brought up to date the first time a replica uses it: its records
become the default tenant's, in chunks (each one script), counted in its total. `get` compares the
record's expiry with the caller's clock (not only Redis's), so every replica sees the
same time to live as the SQLite store does.

Redis that cannot be reached (refused, timed out) is `store_unavailable`; a Redis out of
memory (`OOM` under `maxmemory` with `noeviction`) is `store_full`
(`app.store.redis_connection`, as for every store on Redis).

`RedisBoundedStore` (a store's bounds, connection, prefix and its one move from before
tenants) serves the conversations' store too (`app.store.redis_conversations`).
"""

from __future__ import annotations

from typing import ClassVar, Unpack

from app.store.base import BoundedStore, Bounds
from app.store.redis_connection import RedisConnection
from app.tenants import DEFAULT_TENANT

_DROP = """
local function drop(prefix, id)
    local size = redis.call('HGET', prefix .. 'sizes', id)
    local tenant = redis.call('HGET', prefix .. 'tenants', id)
    redis.call('DEL', prefix .. 'r:' .. id)
    redis.call('ZREM', prefix .. 'index', id)
    redis.call('HDEL', prefix .. 'sizes', id)
    redis.call('HDEL', prefix .. 'tenants', id)
    if tenant then
        redis.call('ZREM', prefix .. 'index:' .. tenant, id)
        if size then redis.call('DECRBY', prefix .. 'total:' .. tenant, size) end
    end
    if size then
        redis.call('DECRBY', prefix .. 'total', size)
        return 1
    end
    return 0
end
local function owner(prefix, id, default)
    return redis.call('HGET', prefix .. 'tenants', id)
        or redis.call('HGET', prefix .. 'r:' .. id, 'tenant') or default
end
"""

# ARGV: prefix, tenant, id, data, exp_ms, now_ms, ttl_ms, max_bytes, quota,
# unless_cancelled ("1": not when the id's cancel flag is raised; 0 is returned), the
# default tenant. -1: no room its tenant may make; -2: the id is another tenant's. The
# shebang makes Redis refuse the script when it is out of memory (a script without one
# writes past maxmemory).
_PUT = (
    "#!lua\n"
    + _DROP
    + """
local prefix, tenant, id, data = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local exp, now = tonumber(ARGV[5]), tonumber(ARGV[6])
local ttl, max, quota = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
if ARGV[10] == '1' and redis.call('EXISTS', prefix .. 'cancel:' .. id) == 1 then
    return 0
end
for _, old in ipairs(redis.call('ZRANGEBYSCORE', prefix .. 'index', '-inf', now)) do
    drop(prefix, old)
end
if owner(prefix, id, ARGV[11]) ~= tenant and redis.call('HEXISTS', prefix .. 'sizes', id) == 1 then
    return -2  -- another tenant's id: never replaced (ids are the server's own, random)
end
drop(prefix, id)
local size = string.len(data)
local function totals()
    return tonumber(redis.call('GET', prefix .. 'total') or '0'),
        tonumber(redis.call('GET', prefix .. 'total:' .. tenant) or '0')
end
local total, own = totals()
if total - own + size > max then return -1 end  -- all or nothing: its own cannot make room
while total + size > max or own + size > quota do
    local oldest = redis.call('ZRANGE', prefix .. 'index:' .. tenant, 0, 0)
    if #oldest == 0 then return -1 end
    drop(prefix, oldest[1])
    total, own = totals()
end
redis.call('HSET', prefix .. 'r:' .. id, 'exp', exp, 'data', data, 'tenant', tenant)
redis.call('PEXPIRE', prefix .. 'r:' .. id, ttl)
redis.call('ZADD', prefix .. 'index', exp, id)
redis.call('ZADD', prefix .. 'index:' .. tenant, exp, id)
redis.call('HSET', prefix .. 'sizes', id, size)
redis.call('HSET', prefix .. 'tenants', id, tenant)
redis.call('INCRBY', prefix .. 'total', size)
redis.call('INCRBY', prefix .. 'total:' .. tenant, size)
return 1
"""
)

# ARGV: prefix, tenant, id, now_ms, the default tenant
_DELETE = (
    _DROP
    + """
local prefix, tenant, id, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if owner(prefix, id, ARGV[5]) ~= tenant then return 0 end
local exp = tonumber(redis.call('HGET', prefix .. 'r:' .. id, 'exp') or '-1')
redis.call('DEL', prefix .. 'cancel:' .. id)
local existed = drop(prefix, id)
if exp < now then return 0 end
return existed
"""
)

# ARGV: prefix, the default tenant, the default tenant, first rank, count. Records stored
# before tenants (no owner in `tenants`) become the default tenant's; {seen, moved}.
_MIGRATE = """
local prefix, tenant = ARGV[1], ARGV[2]
local first, count = tonumber(ARGV[4]), tonumber(ARGV[5])
local moved = 0
local ids = redis.call('ZRANGE', prefix .. 'index', first, first + count - 1, 'WITHSCORES')
for i = 1, #ids, 2 do
    local id, exp = ids[i], ids[i + 1]
    if redis.call('HEXISTS', prefix .. 'tenants', id) == 0 then
        redis.call('HSET', prefix .. 'tenants', id, tenant)
        redis.call('ZADD', prefix .. 'index:' .. tenant, exp, id)
        local size = redis.call('HGET', prefix .. 'sizes', id)
        if size then redis.call('INCRBY', prefix .. 'total:' .. tenant, size) end
        if redis.call('EXISTS', prefix .. 'r:' .. id) == 1 then
            redis.call('HSET', prefix .. 'r:' .. id, 'tenant', tenant)
        end
        moved = moved + 1
    end
end
return {#ids / 2, moved}
"""
_MIGRATE_CHUNK = 1000
_SCHEMA = "2"  # records by tenant (the conversations' too)


class RedisBoundedStore(BoundedStore):
    """A store by tenant on the shared Redis: its bounds, its connection, its keys under
    `prefix` (`PREFIX` unless given), and the move of what it holds from before tenants
    into the default tenant's bookkeeping, once per store (`_ready`: every replica checks
    once; moving a record twice is moving it once). `MIGRATE` is that move for a chunk of
    the expiry order: a script of ARGV prefix, the default tenant (as the caller's), the
    default tenant, first rank, count, answering {seen, moved}."""

    PREFIX: ClassVar[str]
    MIGRATE: ClassVar[str]

    def __init__(self, url: str, *, prefix: str | None = None, **bounds: Unpack[Bounds]) -> None:
        self._redis = RedisConnection(url, store="response store")
        super().__init__(self._redis.where, **bounds)
        self.url = url
        self.prefix = self.PREFIX if prefix is None else prefix
        self._migrated = False

    def _ms(self) -> int:
        return int(self._clock() * 1000)

    async def _ready(self) -> None:
        if self._migrated:
            return
        if await self._redis.call("get", self.prefix + "schema") != _SCHEMA.encode():
            while True:  # passes until one moves nothing (evictions meanwhile shift ranks)
                first = moved = 0
                while True:
                    args = (self.prefix, DEFAULT_TENANT, DEFAULT_TENANT, first, _MIGRATE_CHUNK)
                    seen, chunk_moved = await self._redis.call("eval", self.MIGRATE, 0, *args)
                    moved += int(chunk_moved)
                    first += _MIGRATE_CHUNK
                    if int(seen) < _MIGRATE_CHUNK:
                        break
                if not moved:
                    break
            await self._redis.call("set", self.prefix + "schema", _SCHEMA)
        self._migrated = True


class RedisStore(RedisBoundedStore):
    PREFIX = "switchboard:responses:"
    MIGRATE = _MIGRATE

    # -- the contract (app.store.base) ------------------------------------------------

    async def get(self, tenant: str, key: str) -> bytes | None:
        await self._ready()
        exp, data, owner = await self._redis.call(
            "hmget", self.prefix + "r:" + key, "exp", "data", "tenant"
        )
        if data is None or exp is None or int(exp) <= self._ms():
            return None
        if (owner.decode() if owner is not None else DEFAULT_TENANT) != tenant:
            return None
        return bytes(data)

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
        await self._ready()
        now, ttl = self._ms(), int(self.ttl_s * 1000)
        conditional = "1" if unless_cancelled else "0"
        args = (self.prefix, tenant, key, data, now + ttl, now, ttl, self.max_bytes, quota)
        written = int(await self._redis.call("eval", _PUT, 0, *args, conditional, DEFAULT_TENANT))
        if written == -2:
            raise RuntimeError(f"record {key} is another tenant's: ids must not collide")
        if written < 0:
            raise self._no_room(len(data))
        return bool(written)

    async def delete(self, tenant: str, key: str) -> bool:
        await self._ready()
        args = (self.prefix, tenant, key, self._ms(), DEFAULT_TENANT)
        return bool(await self._redis.call("eval", _DELETE, 0, *args))

    async def request_cancel(self, key: str) -> None:
        await self._redis.call(
            "set", self.prefix + "cancel:" + key, 1, None, int(self.ttl_s * 1000)
        )

    async def cancel_requested(self, key: str) -> bool:
        return bool(await self._redis.call("exists", self.prefix + "cancel:" + key))

    async def close(self) -> None:
        await self._redis.close()
