"""Salience sessions in one Redis (standalone) that every replica shares, so that any
replica serves any call of a session, and a replica's death loses none.

Keys, under a prefix (`switchboard:salience:` by default):

    s:<id>        hash: the lifetime (phase, used, charged, held, claim, lease) and the
                  content but the tokens: images (their blocks and digests), and while
                  a Generate runs, its undo (undo, tail); `v`, the tokens' version
    t:<id>        the tokens, little-endian uint32: appended to, rewritten only when a
                  call cuts them
    lru           sorted set of the held sessions by last use (the order of expiry)
    n, total      the sessions held, and the tokens charged
    lru:<tenant>  the same of one tenant's sessions (the order of its evictions: a tenant
    n:<tenant>    makes room among its own sessions only), and its totals; a session's
    total:<tenant>  record names its tenant (`tenant`)
    img:<digest>  an attached image as it came (mime, a newline, the bytes), shared by
                  every session and fork holding it, expiring a while after the TTL
                  (every write of a session holding it pushes that back)

One call is one optimistic transaction (`transact`): WATCH the keys it reads (its
sessions' records, the totals if it needs them), read them (one Lua script that only
reads), run the rules on that snapshot (`app.protocols.salience.tables.Snapshot`), then
write back what they changed in MULTI/EXEC; if a watched key changed meanwhile, the whole
call runs again. The rules stay in Python, in one place; Redis does only the mechanics.
The least recently used sessions are read when the rules walk them (expiry, eviction):
their ids first (not watched: the order may move), then their records (watched), whose
last use must match the order read, or the call runs again. Totals are read, and
watched, only by calls that bound them (open, fork, a Generate's start); changes to them
are increments, which need no read. So a DumpSession conflicts only with calls on its
own session, and a Generate's end with nothing but its own session.

A Generate touches the store at its start and at its end, never per token: its session
is written with the append at the start (under the call's claim and lease) and with the
decoded tokens (appended to `t:<id>`) at the end; the lease is renewed in between by the
replica's keeper (`app.sessions.salience`), one transaction for all its running calls.
Each replica keeps the tokens of the sessions it last read or wrote (up to
`_CACHED_TOKENS`), by version: a call reads a session's tokens from Redis only if they
changed since (a Generate's end never does, nor the next call on the same replica).

Time is wall-clock (`time.time`), shared by replicas (keep them NTP-synchronised). Redis's
failures are mapped as for every store on it (`app.store.redis_connection`): unreachable
(refused, timed out) is `store_unavailable`, out of memory `store_full`, for that call;
run it with `maxmemory-policy noeviction`: a Redis that drops keys by itself breaks the
totals.

Sessions stored before tenants (a record with no `tenant`) are the default tenant's:
found by its calls, counted in the server-wide totals only (never in a tenant's, which
never held them), so they are not in the default tenant's eviction order; they go on
their TTL, or when closed or evicted for the server-wide bound.

How a session is written in its fields: `app.store.redis_session_fields`; its images:
`app.store.redis_session_images`.
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from redis import exceptions as redis_errors

from app.engine.base import GenerationRequest, VisionInfo
from app.errors import Unavailable
from app.protocols.salience.lifecycle import Clock
from app.protocols.salience.sessions import Session, Undo
from app.protocols.salience.tables import Missing, Snapshot
from app.store.redis_connection import RedisConnection
from app.store.redis_session_fields import (
    LIFETIME,
    content_fields,
    lifetime,
    lifetime_fields,
    pairs,
    token_bytes,
    tokens,
)
from app.store.redis_session_images import SessionImages
from app.store.sessions import Attached, Decide

T = TypeVar("T")

_ATTEMPTS = 64  # a call whose reads keep changing under it is UNAVAILABLE past this
_ROUNDS = 16  # loads of one attempt; the rules ask for at most sessions, front, totals
_CACHED_TOKENS = 16 << 20  # tokens kept per replica (64 MiB), of the sessions used last

# ARGV: prefix, front size, number of content ids, each content id and the version of its
# tokens the caller holds ("" if none), the lifetime ids. Reads only: the totals, the
# front of `lru` (not watched), each session with content (record, and the tokens unless
# the caller holds their version), each session's lifetime fields.
_LOAD = """
local prefix, k, nc = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {redis.call('GET', prefix .. 'n'), redis.call('GET', prefix .. 'total')}
out[3] = {}
if k > 0 then out[3] = redis.call('ZRANGE', prefix .. 'lru', 0, k - 1, 'WITHSCORES') end
out[4] = redis.call('ZCARD', prefix .. 'lru')
local content = {}
for i = 1, nc do
    local id, held = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
    local record = redis.call('HGETALL', prefix .. 's:' .. id)
    local version = redis.call('HGET', prefix .. 's:' .. id, 'v')
    if held ~= '' and version == held then
        content[i] = {record, false}
    else
        content[i] = {record, redis.call('GET', prefix .. 't:' .. id) or ''}
    end
end
out[5] = content
local lifetimes = {}
for i = 4 + 2 * nc, #ARGV do
    lifetimes[#lifetimes + 1] = redis.call('HMGET', prefix .. 's:' .. ARGV[i],
        'phase', 'used', 'charged', 'held', 'claim', 'lease', 'tenant')
end
out[6] = lifetimes
return out
"""


class _Restart(Exception):
    """The least recently used sessions moved while they were read: start again."""


@dataclass
class _Loaded:
    """What one attempt has read so far (every read watched but the order of `lru`)."""

    watched: set[str] = field(default_factory=set)
    records: dict[str, dict[bytes, bytes] | None] = field(default_factory=dict)
    tokens: dict[str, array[int]] = field(default_factory=dict)
    lifetimes: dict[str, list[bytes | None]] = field(default_factory=dict)
    front: list[tuple[str, float]] = field(default_factory=list)
    complete: bool = False
    count: int | None = None  # the totals, once watched
    total: int | None = None
    tenant: str | None = None  # the caller's tenant, once any of its part is read
    tenant_front: list[tuple[str, float]] | None = None
    tenant_complete: bool = False
    tenant_count: int | None = None  # its totals, once watched
    tenant_total: int | None = None
    rounds: int = 0


class _HeldTokens:
    """The tokens of the sessions this replica last read or wrote, by version, up to
    `_CACHED_TOKENS` in all (the least recently kept go first)."""

    def __init__(self) -> None:
        self._held: OrderedDict[str, tuple[int, array[int]]] = OrderedDict()
        self._count = 0

    def get(self, session_id: str) -> tuple[int, array[int]] | None:
        return self._held.get(session_id)

    def keep(self, session_id: str, version: int, ids: array[int]) -> None:
        self.forget(session_id)
        if len(ids) > _CACHED_TOKENS:
            return
        self._held[session_id] = (version, ids)
        self._count += len(ids)
        while self._count > _CACHED_TOKENS:
            _, (_, oldest) = self._held.popitem(last=False)
            self._count -= len(oldest)

    def forget(self, session_id: str) -> None:
        entry = self._held.pop(session_id, None)
        if entry is not None:
            self._count -= len(entry[1])


class RedisSessions:
    shared = True

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float,
        lease_s: float,
        vision: VisionInfo | None,
        clock: Clock = time.time,
        prefix: str = "switchboard:salience:",
    ) -> None:
        self.url = url
        self.ttl_s = ttl_s
        self.lease_s = lease_s
        self.prefix = prefix
        self._clock = clock
        self._redis = RedisConnection(url, store="session store")
        self._images = SessionImages(self._redis, prefix, ttl_s=ttl_s, vision=vision)
        self._held = _HeldTokens()

    # -- transactions ------------------------------------------------------------------

    async def transact(
        self,
        decide: Decide[T],
        *,
        content: Sequence[str] = (),
        lifetimes: Sequence[str] = (),
        totals: bool = False,
        tenant: str | None = None,
    ) -> T:
        first = Missing(
            content=content,
            lifetimes=lifetimes,
            front=1,
            totals=totals,
            tenant=tenant,
            tenant_totals=totals and tenant is not None,
        )
        for _ in range(_ATTEMPTS):
            try:
                async with self._redis.pipeline(transaction=True) as pipe:
                    return await self._attempt(pipe, decide, first)
            except (redis_errors.WatchError, _Restart):
                continue  # another call changed what this one read: run it again
        raise Unavailable(
            "The session store is too busy: the sessions this call reads changed under it "
            f"{_ATTEMPTS} times in a row",
            code="store_unavailable",
        )

    async def _attempt(self, pipe: Any, decide: Decide[T], want: Missing) -> T:
        now = self._clock()
        loaded = _Loaded()
        for _ in range(_ROUNDS):
            await self._load(pipe, loaded, want)
            snapshot = self._snapshot(loaded)
            try:
                result = decide(snapshot, now)
            except Missing as missing:
                want = missing
                continue
            pipe.multi()
            kept = self._write(pipe, snapshot, loaded)
            await pipe.execute()
            for session_id in snapshot.removed:
                self._held.forget(session_id)
            for session_id, version, ids in kept:
                self._held.keep(session_id, version, ids)
            return result
        raise RuntimeError("the session rules asked for more than the store holds")

    async def _load(self, pipe: Any, loaded: _Loaded, want: Missing) -> None:
        prefix = self.prefix
        front_ids: list[str] = []
        if want.front > 1 and (want.front > len(loaded.front) or not loaded.complete):
            # The order first (not watched), then the records (watched), checked below.
            raw = await pipe.zrange(prefix + "lru", 0, want.front - 1, withscores=True)
            loaded.front = [(member.decode(), float(score)) for member, score in raw]
            front_ids = [session_id for session_id, _ in loaded.front]
        tenant = want.tenant
        if tenant is not None:
            if loaded.tenant not in (None, tenant):
                raise RuntimeError("one call's rules run for one tenant")
            loaded.tenant = tenant
        if (
            tenant is not None
            and want.tenant_front
            and (
                loaded.tenant_front is None
                or want.tenant_front > len(loaded.tenant_front)
                or not loaded.tenant_complete
            )
        ):
            # Its order (not watched), then the records (watched), checked below.
            size = want.tenant_front
            raw = await pipe.zrange(prefix + "lru:" + tenant, 0, size - 1, withscores=True)
            loaded.tenant_front = [(member.decode(), float(score)) for member, score in raw]
            loaded.tenant_complete = len(raw) < size
            front_ids += [session_id for session_id, _ in loaded.tenant_front]
        content = [i for i in want.content if i not in loaded.records]
        lives = [
            i
            for i in {*want.lifetimes, *front_ids}
            if i not in loaded.lifetimes and i not in loaded.records and i not in content
        ]
        keys = [prefix + "s:" + i for i in (*content, *lives)]
        if want.totals:
            keys += [prefix + "n", prefix + "total"]
        tenant_totals = []
        if tenant is not None and want.tenant_totals and loaded.tenant_count is None:
            tenant_totals = [prefix + "n:" + tenant, prefix + "total:" + tenant]
            keys += tenant_totals
        keys = [key for key in keys if key not in loaded.watched]
        first = not loaded.rounds
        loaded.rounds += 1
        if keys or first:  # WATCH before any read (a key never written, if none)
            await pipe.watch(*(keys or [prefix + "unwritten"]))
            loaded.watched.update(keys)
        # The versions held as the script reads (another call may drop them meanwhile).
        held = {i: self._held.get(i) for i in content}
        versions = [(i, str(entry[0]) if (entry := held[i]) else "") for i in content]
        args = (prefix, 1 if first else 0, len(content), *(a for pair in versions for a in pair))
        count, total, front, size, records, lifetimes = await pipe.eval(_LOAD, 0, *args, *lives)
        if prefix + "total" in loaded.watched:
            loaded.count, loaded.total = int(count or 0), int(total or 0)
        if tenant_totals:
            own_count, own_total = await pipe.mget(*tenant_totals)
            loaded.tenant_count, loaded.tenant_total = int(own_count or 0), int(own_total or 0)
        if first:
            front_pairs = zip(front[::2], front[1::2], strict=True)
            loaded.front = [(member.decode(), float(score)) for member, score in front_pairs]
        if first or front_ids:
            loaded.complete = len(loaded.front) >= int(size)
        for session_id, (record, read) in zip(content, records, strict=True):
            fields = pairs(record)
            loaded.records[session_id] = fields or None
            # The version this replica holds (None from Redis), or the tokens read.
            entry = held[session_id]
            loaded.tokens[session_id] = entry[1] if read is None and entry else tokens(read)
        for session_id, values in zip(lives, lifetimes, strict=True):
            loaded.lifetimes[session_id] = values
        # A session the order named must be there, last used when the order says.
        for session_id, used in (*loaded.front, *(loaded.tenant_front or ())):
            values = loaded.lifetimes.get(session_id)
            if session_id in loaded.records:
                record = loaded.records[session_id] or {}
                values = [record.get(name.encode()) for name in LIFETIME]
            if values is not None and (values[0] is None or float(values[1] or 0) != used):
                raise _Restart

    def _snapshot(self, loaded: _Loaded) -> Snapshot[Session]:
        sessions: dict[str, Session | None] = {}
        for session_id, fields in loaded.records.items():
            ids = loaded.tokens[session_id]
            session = None if fields is None else self._session(session_id, fields, ids)
            sessions[session_id] = session
        legacy = {
            session_id
            for session_id, fields in loaded.records.items()
            if fields is not None and b"tenant" not in fields
        }
        for session_id, values in loaded.lifetimes.items():
            if session_id not in sessions:
                sessions[session_id] = None if values[0] is None else lifetime(session_id, values)
                if values[0] is not None and values[-1] is None:
                    legacy.add(session_id)
        return Snapshot(
            sessions,
            content=loaded.records,
            front=loaded.front,
            complete=loaded.complete,
            count=loaded.count,
            tokens=loaded.total,
            tenant=loaded.tenant,
            tenant_front=loaded.tenant_front,
            tenant_complete=loaded.tenant_complete,
            tenant_count=loaded.tenant_count,
            tenant_tokens=loaded.tenant_total,
            legacy=legacy,
        )

    def _session(self, session_id: str, fields: Mapping[bytes, bytes], ids: array[int]) -> Session:
        session = lifetime(session_id, [fields.get(name.encode()) for name in LIFETIME])
        session.tokens = array("I", ids)  # the rules change their own copy
        session.stored = len(session.tokens)
        images = orjson.loads(fields.get(b"images", b"[]"))
        session.images = [self._images.block(ref) for ref in images]
        undo = fields.get(b"undo")
        if undo:
            offset, refs = orjson.loads(undo)
            undone = [self._images.block(ref) for ref in refs]
            session.undo = Undo(offset, tokens(fields.get(b"tail", b"")), undone)
        return session

    def _write(
        self, pipe: Any, snapshot: Snapshot[Session], loaded: _Loaded
    ) -> list[tuple[str, int, array[int]]]:
        """Queue the writes of what the rules changed; the tokens of each session read or
        written with its content, with their version once these writes are done."""
        prefix = self.prefix
        for session_id, gone in snapshot.removed.items():
            if session_id not in snapshot.added:
                pipe.delete(prefix + "s:" + session_id, prefix + "t:" + session_id)
                pipe.zrem(prefix + "lru", session_id)
                if session_id not in snapshot.legacy:
                    pipe.zrem(prefix + "lru:" + gone.tenant, session_id)
        kept = []
        for session_id, session in snapshot.dirty.items():
            old = loaded.records.get(session_id) or {}
            fields = lifetime_fields(session)
            legacy = session_id in snapshot.legacy
            if legacy:  # counted in no tenant's totals: it stays out of them
                del fields["tenant"]
            if session_id in snapshot.content:
                fields.update(content_fields(session))
                version = int(old.get(b"v", b"0"))
                stored = len(loaded.tokens.get(session_id, ()))
                if self._write_tokens(pipe, session, stored):
                    version += 1
                    fields["v"] = str(version).encode()
                kept.append((session_id, version, session.tokens))
                for block in (*session.images, *(session.undo.images if session.undo else ())):
                    pipe.pexpire(self._images.key(block.image.digest), self._images.ttl_ms)
            changed = {k: v for k, v in fields.items() if old.get(k.encode()) != v}
            if changed:
                pipe.hset(prefix + "s:" + session_id, mapping=changed)
            pipe.zadd(prefix + "lru", {session_id: session.last_used})
            if not legacy:
                pipe.zadd(prefix + "lru:" + session.tenant, {session_id: session.last_used})
        if snapshot.count_change:
            pipe.incrby(prefix + "n", snapshot.count_change)
        if snapshot.tokens_change:
            pipe.incrby(prefix + "total", snapshot.tokens_change)
        for tenant, change in snapshot.count_changes.items():
            if change:
                pipe.incrby(prefix + "n:" + tenant, change)
        for tenant, change in snapshot.tokens_changes.items():
            if change:
                pipe.incrby(prefix + "total:" + tenant, change)
        for session_id, record in loaded.records.items():  # read, not changed: as read
            if record is not None and session_id not in snapshot.dirty:
                kept.append((session_id, int(record.get(b"v", b"0")), loaded.tokens[session_id]))
        return [entry for entry in kept if entry[0] not in snapshot.removed]

    def _write_tokens(self, pipe: Any, session: Session, stored: int) -> bool:
        """Queue the write of the session's tokens, if they changed; whether they did."""
        key = self.prefix + "t:" + session.session_id
        if session.stored != stored:  # cut below what the store holds: rewrite them
            pipe.set(key, token_bytes(session.tokens))
        elif len(session.tokens) > stored:  # what the store holds is intact: append
            pipe.append(key, token_bytes(session.tokens[stored:]))
        else:
            return False
        return True

    # -- images (app.store.redis_session_images) -------------------------------------

    async def keep_images(self, images: Sequence[Attached]) -> None:
        await self._images.keep(images)

    async def hydrate(self, request: GenerationRequest) -> GenerationRequest:
        return await self._images.hydrate(request)

    # -- the rest ------------------------------------------------------------------------

    async def stats(self) -> tuple[int, int]:
        count, total = await self._redis.call("mget", self.prefix + "n", self.prefix + "total")
        return int(count or 0), int(total or 0)

    async def close(self) -> None:
        await self._redis.close()
