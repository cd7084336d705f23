"""The shared response store: one Redis (standalone, not cluster) for every replica, so a
follow-up (`previous_response_id`), a retrieval or a cancel may land on any of them.

Keys, under a prefix (`switchboard:responses:` by default):

    r:<id>        hash {exp: expiry in ms of the callers' clock, data: the record}, with
                  a Redis expiry of the time to live (Redis frees it by itself)
    index         sorted set of ids by expiry: the order of eviction and of expiry
    sizes         hash id -> bytes
    total         the bytes all records hold
    cancel:<id>   a raised cancel flag, expiring with the time to live

`put` and `delete` are Lua scripts, so concurrent writers (any number of replicas) keep
`index`, `sizes` and `total` exact: the script removes expired ids, replaces the record,
evicts the oldest until the total fits, and writes, atomically. `get` compares the
record's expiry with the caller's clock (not only Redis's), so every replica sees the
same time to live as the SQLite store does.

Redis that cannot be reached (refused, timed out) is `store_unavailable`; a Redis out of
memory (`OOM` under `maxmemory` with `noeviction`) is `store_full`
(`app.store.redis_connection`, as for every store on Redis).
"""

from __future__ import annotations

from app.store.base import DEFAULT_CLOCK, Clock, full, too_large
from app.store.redis_connection import RedisConnection

_DROP = """
local function drop(prefix, id)
    local size = redis.call('HGET', prefix .. 'sizes', id)
    redis.call('DEL', prefix .. 'r:' .. id)
    redis.call('ZREM', prefix .. 'index', id)
    redis.call('HDEL', prefix .. 'sizes', id)
    if size then
        redis.call('DECRBY', prefix .. 'total', size)
        return 1
    end
    return 0
end
"""

# ARGV: prefix, id, data, exp_ms, now_ms, ttl_ms, max_bytes, unless_cancelled ("1": not
# when the id's cancel flag is raised; 0 is returned). The shebang makes Redis refuse the
# script when it is out of memory (a script without one writes past maxmemory).
_PUT = (
    "#!lua\n"
    + _DROP
    + """
local prefix, id, data = ARGV[1], ARGV[2], ARGV[3]
local exp, now = tonumber(ARGV[4]), tonumber(ARGV[5])
local ttl, max = tonumber(ARGV[6]), tonumber(ARGV[7])
if ARGV[8] == '1' and redis.call('EXISTS', prefix .. 'cancel:' .. id) == 1 then
    return 0
end
for _, old in ipairs(redis.call('ZRANGEBYSCORE', prefix .. 'index', '-inf', now)) do
    drop(prefix, old)
end
drop(prefix, id)
local size = string.len(data)
local total = tonumber(redis.call('GET', prefix .. 'total') or '0')
while total + size > max do
    local oldest = redis.call('ZRANGE', prefix .. 'index', 0, 0)
    if #oldest == 0 then break end
    drop(prefix, oldest[1])
    total = tonumber(redis.call('GET', prefix .. 'total') or '0')
end
redis.call('HSET', prefix .. 'r:' .. id, 'exp', exp, 'data', data)
redis.call('PEXPIRE', prefix .. 'r:' .. id, ttl)
redis.call('ZADD', prefix .. 'index', exp, id)
redis.call('HSET', prefix .. 'sizes', id, size)
redis.call('INCRBY', prefix .. 'total', size)
return 1
"""
)

# ARGV: prefix, id, now_ms
_DELETE = (
    _DROP
    + """
local prefix, id, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local exp = tonumber(redis.call('HGET', prefix .. 'r:' .. id, 'exp') or '-1')
redis.call('DEL', prefix .. 'cancel:' .. id)
local existed = drop(prefix, id)
if exp < now then return 0 end
return existed
"""
)


class RedisStore:
    def __init__(
        self,
        url: str,
        *,
        ttl_s: float,
        max_bytes: int,
        clock: Clock = DEFAULT_CLOCK,
        prefix: str = "switchboard:responses:",
    ) -> None:
        self.url = url
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.prefix = prefix
        self._clock = clock
        self._redis = RedisConnection(url, store="response store")
        self._call = self._redis.call
        self._where = self._redis.where

    def _ms(self) -> int:
        return int(self._clock() * 1000)

    # -- the contract (app.store.base) ------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        exp, data = await self._call("hmget", self.prefix + "r:" + key, "exp", "data")
        if data is None or exp is None or int(exp) <= self._ms():
            return None
        return bytes(data)

    async def put(self, key: str, data: bytes, *, unless_cancelled: bool = False) -> bool:
        if len(data) > self.max_bytes:
            raise full(self._where, too_large(len(data), self.max_bytes))
        now, ttl = self._ms(), int(self.ttl_s * 1000)
        conditional = "1" if unless_cancelled else "0"
        args = (self.prefix, key, data, now + ttl, now, ttl, self.max_bytes, conditional)
        return bool(await self._call("eval", _PUT, 0, *args))

    async def delete(self, key: str) -> bool:
        return bool(await self._call("eval", _DELETE, 0, self.prefix, key, self._ms()))

    async def request_cancel(self, key: str) -> None:
        await self._call("set", self.prefix + "cancel:" + key, 1, None, int(self.ttl_s * 1000))

    async def cancel_requested(self, key: str) -> bool:
        return bool(await self._call("exists", self.prefix + "cancel:" + key))

    async def close(self) -> None:
        await self._redis.close()
