"""The batches' store on Redis: keys of their own in the Redis every replica shares, so a
batch created on one replica is advanced and answered by any.

Keys, under a prefix (`switchboard:batches:` by default), `<key>` a file's or a batch's id:

    d:<key>     hash {exp: expiry in ms of the callers' clock, data: the document (absent:
                parts waiting for it)}
    exp         sorted set of keys by expiry: what the next write removes
    i:<name>    sorted set of keys by score: an index; ix:<key> the indexes a key is in
    p:<key>     hash part -> bytes
    r:<key>     hash index -> result; ro:<key> index -> its outcome
    t:<key>     hash n:<outcome> and s:<outcome> (count and bytes), in, out (tokens)
    c:<key>     sorted set of chunks handed out and not finished, by lease expiry (ms);
                co:<key> chunk -> owner; h:<key> the chunks handed out so far
    l:<key>     hash {owner, until}: the key's own lease
    sizes       hash key -> the bytes its parts and results hold; total: their sum
    owners      hash key -> whose upload it is; owned: hash owner -> its uploads' bytes

Every call that writes is one Lua script, so any number of replicas keep the first
result, the leases and the bookkeeping exact; the scripts that may grow the store remove
what has expired first. Redis's own expiry (the document's time left, renewed on each key
as it is written) frees what no write comes to remove; the total is kept from `sizes`,
which has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.store.base import DEFAULT_CLOCK, Clock, full, too_large
from app.store.batches import STORE, UPLOAD_S, Leases, Tally, over, over_quota
from app.store.redis_connection import RedisConnection

_SUBKEYS = "{'d:', 'ix:', 'p:', 'r:', 'ro:', 't:', 'c:', 'co:', 'h:', 'l:'}"

_COMMON = f"""
local p = ARGV[1]
local function drop(key)
    local size = tonumber(redis.call('HGET', p .. 'sizes', key) or '0')
    for _, name in ipairs(redis.call('SMEMBERS', p .. 'ix:' .. key)) do
        redis.call('ZREM', p .. 'i:' .. name, key)
    end
    for _, sub in ipairs({_SUBKEYS}) do redis.call('DEL', p .. sub .. key) end
    redis.call('ZREM', p .. 'exp', key)
    redis.call('HDEL', p .. 'sizes', key)
    redis.call('DECRBY', p .. 'total', size)
    local owner = redis.call('HGET', p .. 'owners', key)
    if owner then
        redis.call('HINCRBY', p .. 'owned', owner, -size)
        redis.call('HDEL', p .. 'owners', key)
    end
end
local function expire(now)
    for _, key in ipairs(redis.call('ZRANGEBYSCORE', p .. 'exp', '-inf', now)) do drop(key) end
    return tonumber(redis.call('GET', p .. 'total') or '0')
end
local function grow(key, n)
    redis.call('HINCRBY', p .. 'sizes', key, n)
    redis.call('INCRBY', p .. 'total', n)
end
local function expiry(key)
    return tonumber(redis.call('HGET', p .. 'd:' .. key, 'exp') or '-1')
end
local function live(key, now)
    return expiry(key) > now and redis.call('HEXISTS', p .. 'd:' .. key, 'data') == 1
end
local function keep(key, sub, now)
    local exp = expiry(key)
    if exp > now then redis.call('PEXPIRE', p .. sub .. key, exp - now) end
end
"""

# The shebang makes Redis refuse a writing script when it is out of memory.
_WRITE = "#!lua\n" + _COMMON

# ARGV: prefix, key, data, exp, now, then (index, score) pairs.
_CREATE = (
    _WRITE
    + f"""
local key, data, exp, now = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
expire(now)
redis.call('HSET', p .. 'd:' .. key, 'exp', exp, 'data', data)
redis.call('ZADD', p .. 'exp', exp, key)
for i = 6, #ARGV, 2 do
    redis.call('ZADD', p .. 'i:' .. ARGV[i], ARGV[i + 1], key)
    redis.call('SADD', p .. 'ix:' .. key, ARGV[i])
end
for _, sub in ipairs({_SUBKEYS}) do keep(key, sub, now) end
return 1
"""
)

# ARGV: prefix, key, old, new, now
_SWAP = (
    _COMMON
    + """
local key, now = ARGV[2], tonumber(ARGV[5])
if expiry(key) <= now or redis.call('HGET', p .. 'd:' .. key, 'data') ~= ARGV[3] then
    return 0
end
redis.call('HSET', p .. 'd:' .. key, 'data', ARGV[4])
return 1
"""
)

# ARGV: prefix, key, now
_DELETE = (
    _COMMON
    + """
local key, now = ARGV[2], tonumber(ARGV[3])
expire(now)
local existed = live(key, now)
drop(key)
if existed then return 1 end
return 0
"""
)

# ARGV: prefix, index, after ('' for none), limit, desc ('1'), now. {-1}: `after` is not
# listed; else {more (0/1), documents...}.
_PAGE = (
    _WRITE
    + """
local z, after, limit, desc = p .. 'i:' .. ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5] == '1'
expire(tonumber(ARGV[6]))
local start = 0
if after ~= '' then
    local rank
    if desc then
        rank = redis.call('ZREVRANK', z, after)
    else
        rank = redis.call('ZRANK', z, after)
    end
    if not rank then return {-1} end
    start = rank + 1
end
local keys
if desc then
    keys = redis.call('ZREVRANGE', z, start, start + limit)
else
    keys = redis.call('ZRANGE', z, start, start + limit)
end
local out = {0}
if #keys > limit then out[1] = 1 end
for i = 1, math.min(#keys, limit) do
    table.insert(out, redis.call('HGET', p .. 'd:' .. keys[i], 'data'))
end
return out
"""
)

# ARGV: prefix, index, now
_KEYS = (
    _COMMON
    + """
local out = {}
for _, key in ipairs(redis.call('ZRANGE', p .. 'i:' .. ARGV[2], 0, -1)) do
    if live(key, tonumber(ARGV[3])) then table.insert(out, key) end
end
return out
"""
)

# ARGV: prefix, key, part, data, bounded ('1'), now, max, placeholder's exp, owner ('':
# none), its quota (0: none). -1 and the total: refused by the bound; -2 and the owner's
# total: by its quota.
_PUT_PART = (
    _WRITE
    + """
local key, part, data = ARGV[2], ARGV[3], ARGV[4]
local now, max = tonumber(ARGV[6]), tonumber(ARGV[7])
local owner, quota = ARGV[9], tonumber(ARGV[10])
local total = expire(now)
local size = string.len(data)
if ARGV[5] == '1' and total + size > max then return {-1, total} end
local old = redis.call('HSTRLEN', p .. 'p:' .. key, part)
local owned = ARGV[5] == '1' and owner ~= ''
if owned then
    local own = tonumber(redis.call('HGET', p .. 'owned', owner) or '0')
    if quota > 0 and own + size - old > quota then return {-2, own} end
    redis.call('HSETNX', p .. 'owners', key, owner)
end
if redis.call('EXISTS', p .. 'd:' .. key) == 0 then
    redis.call('HSET', p .. 'd:' .. key, 'exp', ARGV[8])
    redis.call('ZADD', p .. 'exp', ARGV[8], key)
end
redis.call('HSET', p .. 'p:' .. key, part, data)
grow(key, size - old)
if owned then redis.call('HINCRBY', p .. 'owned', owner, size - old) end
keep(key, 'p:', now)
return {1, 0}
"""
)

# ARGV: prefix, key, index, outcome, data, input tokens, output tokens, now
_ADD_RESULT = (
    _WRITE
    + """
local key, index, outcome, data = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now = tonumber(ARGV[8])
if not live(key, now) then return 0 end
if redis.call('HSETNX', p .. 'r:' .. key, index, data) == 0 then return 0 end
redis.call('HSET', p .. 'ro:' .. key, index, outcome)
local t = p .. 't:' .. key
redis.call('HINCRBY', t, 'n:' .. outcome, 1)
redis.call('HINCRBY', t, 's:' .. outcome, string.len(data))
redis.call('HINCRBY', t, 'in', ARGV[6])
redis.call('HINCRBY', t, 'out', ARGV[7])
grow(key, string.len(data))
for _, sub in ipairs({'r:', 'ro:', 't:'}) do keep(key, sub, now) end
return 1
"""
)

# ARGV: prefix, key, now, then (index, outcome, data) triples. The count written.
_ADD_RESULTS = (
    _WRITE
    + """
local key, now = ARGV[2], tonumber(ARGV[3])
if not live(key, now) then return 0 end
local t, written = p .. 't:' .. key, 0
for i = 4, #ARGV, 3 do
    local index, outcome, data = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    if redis.call('HSETNX', p .. 'r:' .. key, index, data) == 1 then
        redis.call('HSET', p .. 'ro:' .. key, index, outcome)
        redis.call('HINCRBY', t, 'n:' .. outcome, 1)
        redis.call('HINCRBY', t, 's:' .. outcome, string.len(data))
        grow(key, string.len(data))
        written = written + 1
    end
end
for _, sub in ipairs({'r:', 'ro:', 't:'}) do keep(key, sub, now) end
return written
"""
)

# ARGV: prefix, key, start, stop. Flat {index, outcome, data, ...} of those present.
_RESULTS = """
local p, key = ARGV[1], ARGV[2]
local out = {}
for i = tonumber(ARGV[3]), tonumber(ARGV[4]) - 1 do
    local data = redis.call('HGET', p .. 'r:' .. key, i)
    if data then
        table.insert(out, i)
        table.insert(out, redis.call('HGET', p .. 'ro:' .. key, i))
        table.insert(out, data)
    end
end
return out
"""

# ARGV: prefix, key, chunks, owner, now, until. -1: nothing to hand out.
_CLAIM = (
    _WRITE
    + """
local key, chunks, owner = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now, till = tonumber(ARGV[5]), tonumber(ARGV[6])
if not live(key, now) then return -1 end
local c = p .. 'c:' .. key
local abandoned = redis.call('ZRANGEBYSCORE', c, '-inf', now, 'LIMIT', 0, 1)
local chunk
if #abandoned > 0 then
    chunk = tonumber(abandoned[1])
else
    chunk = tonumber(redis.call('GET', p .. 'h:' .. key) or '0')
    if chunk >= chunks then return -1 end
    redis.call('SET', p .. 'h:' .. key, chunk + 1)
end
redis.call('ZADD', c, till, chunk)
redis.call('HSET', p .. 'co:' .. key, chunk, owner)
for _, sub in ipairs({'c:', 'co:', 'h:'}) do keep(key, sub, now) end
return chunk
"""
)

# ARGV: prefix, key, chunk, owner, then the new lease expiry (renew), or 'finish', or
# 'release'.
_CHUNK = """
local p, key, chunk, owner, what = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if redis.call('HGET', p .. 'co:' .. key, chunk) ~= owner then return 0 end
if not redis.call('ZSCORE', p .. 'c:' .. key, chunk) then return 0 end
if what == 'finish' then
    redis.call('ZREM', p .. 'c:' .. key, chunk)
    redis.call('HDEL', p .. 'co:' .. key, chunk)
elseif what == 'release' then
    redis.call('ZADD', p .. 'c:' .. key, 0, chunk)
else
    redis.call('ZADD', p .. 'c:' .. key, what, chunk)
end
return 1
"""

# ARGV: prefix, key, owner, now, until
_LEASE = (
    _WRITE
    + """
local key, owner, now, till = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local held = redis.call('HMGET', p .. 'l:' .. key, 'owner', 'until')
if held[1] and held[1] ~= owner and tonumber(held[2]) > now then return 0 end
redis.call('HSET', p .. 'l:' .. key, 'owner', owner, 'until', till)
if expiry(key) > now then
    keep(key, 'l:', now)
else
    redis.call('PEXPIRE', p .. 'l:' .. key, math.max(1, tonumber(till) - now))
end
return 1
"""
)


# ARGV: prefix, key, owner
_UNLEASE = """
local p, key = ARGV[1], ARGV[2]
if redis.call('HGET', p .. 'l:' .. key, 'owner') == ARGV[3] then
    redis.call('DEL', p .. 'l:' .. key)
end
return 1
"""


class RedisBatches:
    def __init__(
        self,
        url: str,
        *,
        max_bytes: int,
        clock: Clock = DEFAULT_CLOCK,
        prefix: str = "switchboard:batches:",
    ) -> None:
        self.url = url
        self.max_bytes = max_bytes
        self.prefix = prefix
        self._clock = clock
        self._redis = RedisConnection(url, store=STORE)
        self._where = self._redis.where

    def _ms(self, at: float | None = None) -> int:
        return int((self._clock() if at is None else at) * 1000)

    async def _eval(self, script: str, *args: Any) -> Any:
        return await self._redis.call("eval", script, 0, self.prefix, *args)

    # -- documents ---------------------------------------------------------------------

    async def create(
        self, key: str, data: bytes, *, expires: float, indexes: dict[str, float]
    ) -> None:
        pairs = [v for name, score in indexes.items() for v in (name, repr(score))]
        await self._eval(_CREATE, key, data, self._ms(expires), self._ms(), *pairs)

    async def get(self, key: str) -> bytes | None:
        exp, data = await self._redis.call("hmget", self.prefix + "d:" + key, "exp", "data")
        if data is None or exp is None or int(exp) <= self._ms():
            return None
        return bytes(data)

    async def swap(self, key: str, old: bytes, new: bytes) -> bool:
        return bool(await self._eval(_SWAP, key, old, new, self._ms()))

    async def delete(self, key: str) -> bool:
        return bool(await self._eval(_DELETE, key, self._ms()))

    async def page(
        self, index: str, *, after: str | None, limit: int, desc: bool
    ) -> tuple[list[bytes], bool] | None:
        out = await self._eval(_PAGE, index, after or "", limit, "1" if desc else "0", self._ms())
        if out[0] == -1:
            return None
        return [bytes(d) for d in out[1:]], bool(out[0])

    async def listed(self, index: str, key: str, score: float | None) -> None:
        zset, member = self.prefix + "i:" + index, self.prefix + "ix:" + key
        if score is None:
            await self._redis.call("zrem", zset, key)
            await self._redis.call("srem", member, index)
        else:
            await self._redis.call("zadd", zset, {key: score})
            await self._redis.call("sadd", member, index)

    async def keys(self, index: str) -> list[str]:
        return [k.decode() for k in await self._eval(_KEYS, index, self._ms())]

    # -- parts ---------------------------------------------------------------------------

    async def put_part(
        self, key: str, index: int, data: bytes, *, bounded: bool, owner: str = "", quota: int = 0
    ) -> None:
        if bounded and len(data) > self.max_bytes:
            raise full(self._where, too_large(len(data), self.max_bytes), store=STORE)
        now = self._ms()
        placeholder = self._ms(self._clock() + UPLOAD_S)
        done, total = await self._eval(
            _PUT_PART,
            key,
            index,
            data,
            "1" if bounded else "0",
            now,
            self.max_bytes,
            placeholder,
            owner,
            quota,
        )
        if done == -1:
            raise full(self._where, over(total, len(data), self.max_bytes), store=STORE)
        if done == -2:
            raise full(self._where, over_quota(total, len(data), quota), store=STORE)

    async def part(self, key: str, index: int) -> bytes | None:
        data = await self._redis.call("hget", self.prefix + "p:" + key, index)
        return None if data is None else bytes(data)

    # -- results -------------------------------------------------------------------------

    async def add_result(
        self, key: str, index: int, outcome: str, data: bytes, tokens: tuple[int, int] = (0, 0)
    ) -> bool:
        return bool(await self._eval(_ADD_RESULT, key, index, outcome, data, *tokens, self._ms()))

    async def add_results(self, key: str, rows: Sequence[tuple[int, str, bytes]]) -> int:
        if not rows:
            return 0
        flat = [v for index, outcome, data in rows for v in (index, outcome, data)]
        return int(await self._eval(_ADD_RESULTS, key, self._ms(), *flat))

    async def results(self, key: str, start: int, stop: int) -> list[tuple[int, str, bytes]]:
        flat = await self._eval(_RESULTS, key, start, stop)
        return [
            (int(flat[i]), flat[i + 1].decode(), bytes(flat[i + 2])) for i in range(0, len(flat), 3)
        ]

    async def tally(self, key: str) -> Tally:
        fields = await self._redis.call("hgetall", self.prefix + "t:" + key)
        values = {k.decode(): int(v) for k, v in fields.items()}
        return Tally(
            counts={k[2:]: v for k, v in values.items() if k.startswith("n:")},
            sizes={k[2:]: v for k, v in values.items() if k.startswith("s:")},
            input_tokens=values.get("in", 0),
            output_tokens=values.get("out", 0),
        )

    # -- work ----------------------------------------------------------------------------

    async def claim(
        self, key: str, *, chunks: int, owner: str, now: float, until: float
    ) -> int | None:
        chunk = int(await self._eval(_CLAIM, key, chunks, owner, self._ms(now), self._ms(until)))
        return None if chunk < 0 else chunk

    async def renew(self, key: str, chunk: int, *, owner: str, until: float) -> bool:
        return bool(await self._eval(_CHUNK, key, chunk, owner, self._ms(until)))

    async def finish(self, key: str, chunk: int, *, owner: str) -> None:
        await self._eval(_CHUNK, key, chunk, owner, "finish")

    async def release(self, key: str, chunk: int, *, owner: str) -> None:
        await self._eval(_CHUNK, key, chunk, owner, "release")

    async def leases(self, key: str, now: float) -> Leases:
        chunks, at = self.prefix + "c:" + key, self._ms(now)
        live = await self._redis.call("zcount", chunks, f"({at}", "+inf")
        abandoned = await self._redis.call("zcount", chunks, "-inf", at)
        handed = await self._redis.call("get", self.prefix + "h:" + key)
        return Leases(int(live), int(abandoned), int(handed or 0))

    async def lease(self, key: str, *, owner: str, now: float, until: float) -> bool:
        return bool(await self._eval(_LEASE, key, owner, self._ms(now), self._ms(until)))

    async def leased(self, key: str, now: float) -> bool:
        until = await self._redis.call("hget", self.prefix + "l:" + key, "until")
        return until is not None and int(until) > self._ms(now)

    async def unlease(self, key: str, *, owner: str) -> None:
        await self._eval(_UNLEASE, key, owner)

    async def close(self) -> None:
        await self._redis.close()
