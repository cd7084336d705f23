"""Salience sessions in one Redis (standalone) that every replica shares, so that any
replica serves any call of a session, and a replica's death loses none.

Keys, under a prefix (`switchboard:salience:` by default):

    s:<id>        hash: the lifetime (phase, used, charged, held, claim, lease) and the
                  content but the tokens: images (their blocks and digests), and while
                  a Generate runs, its undo (undo, tail); `v`, the tokens' version
    t:<id>        the tokens, little-endian uint32: appended to, rewritten only when a
                  call cuts them
    lru           sorted set of the held sessions by last use (the order of expiry and
                  eviction)
    n, total      the sessions held, and the tokens charged
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

Time is wall-clock (`time.time`), shared by replicas (keep them NTP-synchronised). Redis
that cannot be reached (refused, timed out) is `store_unavailable`, for that call; run it
with `maxmemory-policy noeviction`: a Redis that drops keys by itself breaks the totals.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from app.engine.base import DecodedImage, GenerationRequest, PromptImage, VisionInfo
from app.errors import FailedPrecondition, Unavailable
from app.protocols.salience.lifecycle import Clock, Phase
from app.protocols.salience.sessions import Session, Undo
from app.protocols.salience.tables import Missing, Snapshot
from app.store.redis import _redacted
from app.store.sessions import Attached, Decide

T = TypeVar("T")

_LIFETIME = ("phase", "used", "charged", "held", "claim", "lease")
_ATTEMPTS = 64  # a call whose reads keep changing under it is UNAVAILABLE past this
_ROUNDS = 16  # loads of one attempt; the rules ask for at most sessions, front, totals
_IMAGE_MARGIN_S = 300.0  # how long an image outlives the TTL of the sessions holding it
_IMAGES_DECODED = 64  # decoded images kept per replica
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
        'phase', 'used', 'charged', 'held', 'claim', 'lease')
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
    rounds: int = 0


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
        self._vision = vision
        self._clock = clock
        self._client: aioredis.Redis | None = None
        self._where = _redacted(url)
        self._decoded: OrderedDict[str, DecodedImage] = OrderedDict()
        self._cached: OrderedDict[str, tuple[int, array[int]]] = OrderedDict()
        self._cached_tokens = 0

    def _redis(self) -> aioredis.Redis:
        # Made on first use, on the loop that uses it (a client belongs to one loop).
        if self._client is None:
            self._client = aioredis.Redis.from_url(
                self.url, socket_connect_timeout=2.0, socket_timeout=5.0
            )
        return self._client

    def _unavailable(self, exc: BaseException) -> Unavailable:
        return Unavailable(
            f"The session store ({self._where}) is unavailable: {exc}", code="store_unavailable"
        )

    # -- transactions ------------------------------------------------------------------

    async def transact(
        self,
        decide: Decide[T],
        *,
        content: Sequence[str] = (),
        lifetimes: Sequence[str] = (),
        totals: bool = False,
    ) -> T:
        for _ in range(_ATTEMPTS):
            try:
                async with self._redis().pipeline(transaction=True) as pipe:
                    return await self._attempt(pipe, decide, content, lifetimes, totals)
            except (redis_errors.WatchError, _Restart):
                continue  # another call changed what this one read: run it again
            except (redis_errors.RedisError, OSError) as exc:
                raise self._unavailable(exc) from exc
        raise Unavailable(
            f"The session store ({self._where}) is too busy: the sessions this call reads "
            f"changed under it {_ATTEMPTS} times in a row",
            code="store_unavailable",
        )

    async def _attempt(
        self,
        pipe: Any,
        decide: Decide[T],
        content: Sequence[str],
        lifetimes: Sequence[str],
        totals: bool,
    ) -> T:
        now = self._clock()
        loaded = _Loaded()
        want = Missing(content=content, lifetimes=lifetimes, front=1, totals=totals)
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
                self._forget(session_id)
            for session_id, version, tokens in kept:
                self._keep(session_id, version, tokens)
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
        content = [i for i in want.content if i not in loaded.records]
        lives = [
            i
            for i in {*want.lifetimes, *front_ids}
            if i not in loaded.lifetimes and i not in loaded.records and i not in content
        ]
        keys = [prefix + "s:" + i for i in (*content, *lives)]
        if want.totals:
            keys += [prefix + "n", prefix + "total"]
        keys = [key for key in keys if key not in loaded.watched]
        first = not loaded.rounds
        loaded.rounds += 1
        if keys or first:  # WATCH before any read (a key never written, if none)
            await pipe.watch(*(keys or [prefix + "unwritten"]))
            loaded.watched.update(keys)
        held = [(i, str(self._cached[i][0]) if i in self._cached else "") for i in content]
        args = (prefix, 1 if first else 0, len(content), *(a for pair in held for a in pair))
        count, total, front, size, records, lifetimes = await pipe.eval(_LOAD, 0, *args, *lives)
        if prefix + "total" in loaded.watched:
            loaded.count, loaded.total = int(count or 0), int(total or 0)
        if first:
            pairs = zip(front[::2], front[1::2], strict=True)
            loaded.front = [(member.decode(), float(score)) for member, score in pairs]
        if first or front_ids:
            loaded.complete = len(loaded.front) >= int(size)
        for session_id, (record, tokens) in zip(content, records, strict=True):
            fields = _pairs(record)
            loaded.records[session_id] = fields or None
            # The version this replica holds (None from Redis), or the tokens read.
            loaded.tokens[session_id] = (
                self._cached[session_id][1] if tokens is None else _tokens(tokens)
            )
        for session_id, values in zip(lives, lifetimes, strict=True):
            loaded.lifetimes[session_id] = values
        # A session the order named must be there, last used when the order says.
        for session_id, used in loaded.front:
            values = loaded.lifetimes.get(session_id)
            if session_id in loaded.records:
                record = loaded.records[session_id] or {}
                values = [record.get(name.encode()) for name in _LIFETIME]
            if values is not None and (values[0] is None or float(values[1] or 0) != used):
                raise _Restart

    def _snapshot(self, loaded: _Loaded) -> Snapshot[Session]:
        sessions: dict[str, Session | None] = {}
        for session_id, fields in loaded.records.items():
            tokens = loaded.tokens[session_id]
            sessions[session_id] = (
                None if fields is None else self._session(session_id, fields, tokens)
            )
        for session_id, values in loaded.lifetimes.items():
            if session_id not in sessions:
                sessions[session_id] = None if values[0] is None else _lifetime(session_id, values)
        return Snapshot(
            sessions,
            content=loaded.records,
            front=loaded.front,
            complete=loaded.complete,
            count=loaded.count,
            tokens=loaded.total,
        )

    def _session(
        self, session_id: str, fields: Mapping[bytes, bytes], tokens: array[int]
    ) -> Session:
        session = _lifetime(session_id, [fields.get(name.encode()) for name in _LIFETIME])
        session.tokens = array("I", tokens)  # the rules change their own copy
        session.stored = len(session.tokens)
        session.images = [self._image(ref) for ref in orjson.loads(fields.get(b"images", b"[]"))]
        undo = fields.get(b"undo")
        if undo:
            offset, refs = orjson.loads(undo)
            images = [self._image(ref) for ref in refs]
            session.undo = Undo(offset, _tokens(fields.get(b"tail", b"")), images)
        return session

    def _image(self, ref: list[Any]) -> PromptImage:
        start, end, digest, pads = ref
        decoded = self._decoded.get(digest) or DecodedImage(_UNLOADED, digest, pads)
        return PromptImage(start, end, decoded)

    def _write(
        self, pipe: Any, snapshot: Snapshot[Session], loaded: _Loaded
    ) -> list[tuple[str, int, array[int]]]:
        """Queue the writes of what the rules changed; the tokens of each session read or
        written with its content, with their version once these writes are done."""
        prefix, images_ms = self.prefix, int((self.ttl_s + _IMAGE_MARGIN_S) * 1000)
        for session_id in snapshot.removed:
            if session_id not in snapshot.added:
                pipe.delete(prefix + "s:" + session_id, prefix + "t:" + session_id)
                pipe.zrem(prefix + "lru", session_id)
        kept = []
        for session_id, session in snapshot.dirty.items():
            old = loaded.records.get(session_id) or {}
            fields = dict(zip(_LIFETIME, _lifetime_fields(session), strict=True))
            if session_id in snapshot.content:
                fields.update(_content_fields(session))
                version = int(old.get(b"v", b"0"))
                stored = len(loaded.tokens.get(session_id, ()))
                if self._write_tokens(pipe, session, stored):
                    version += 1
                    fields["v"] = str(version).encode()
                kept.append((session_id, version, session.tokens))
                for block in (*session.images, *(session.undo.images if session.undo else ())):
                    pipe.pexpire(prefix + "img:" + block.image.digest, images_ms)
            changed = {k: v for k, v in fields.items() if old.get(k.encode()) != v}
            if changed:
                pipe.hset(prefix + "s:" + session_id, mapping=changed)
            pipe.zadd(prefix + "lru", {session_id: session.last_used})
        if snapshot.count_change:
            pipe.incrby(prefix + "n", snapshot.count_change)
        if snapshot.tokens_change:
            pipe.incrby(prefix + "total", snapshot.tokens_change)
        for session_id, record in loaded.records.items():  # read, not changed: as read
            if record is not None and session_id not in snapshot.dirty:
                kept.append((session_id, int(record.get(b"v", b"0")), loaded.tokens[session_id]))
        return [entry for entry in kept if entry[0] not in snapshot.removed]

    def _write_tokens(self, pipe: Any, session: Session, stored: int) -> bool:
        """Queue the write of the session's tokens, if they changed; whether they did."""
        key = self.prefix + "t:" + session.session_id
        if session.stored != stored:  # cut below what the store holds: rewrite them
            pipe.set(key, _bytes(session.tokens))
        elif len(session.tokens) > stored:  # what the store holds is intact: append
            pipe.append(key, _bytes(session.tokens[stored:]))
        else:
            return False
        return True

    def _keep(self, session_id: str, version: int, tokens: array[int]) -> None:
        self._forget(session_id)
        if len(tokens) > _CACHED_TOKENS:
            return
        self._cached[session_id] = (version, tokens)
        self._cached_tokens += len(tokens)
        while self._cached_tokens > _CACHED_TOKENS:
            _, (_, oldest) = self._cached.popitem(last=False)
            self._cached_tokens -= len(oldest)

    def _forget(self, session_id: str) -> None:
        entry = self._cached.pop(session_id, None)
        if entry is not None:
            self._cached_tokens -= len(entry[1])

    # -- images ------------------------------------------------------------------------

    async def keep_images(self, images: Sequence[Attached]) -> None:
        ttl_ms = int((self.ttl_s + _IMAGE_MARGIN_S) * 1000)
        try:
            async with self._redis().pipeline(transaction=False) as pipe:
                for decoded, mime, data in images:
                    pipe.set(
                        self.prefix + "img:" + decoded.digest,
                        mime.encode() + b"\n" + data,
                        px=ttl_ms,
                    )
                await pipe.execute()
        except (redis_errors.RedisError, OSError) as exc:
            raise self._unavailable(exc) from exc
        for decoded, _, _ in images:
            self._remember(decoded)

    async def hydrate(self, request: GenerationRequest) -> GenerationRequest:
        if not any(block.image.pixels is _UNLOADED for block in request.images):
            return request
        images = [
            block if block.image.pixels is not _UNLOADED else await self._decode(block)
            for block in request.images
        ]
        return replace(request, images=tuple(images))

    async def _decode(self, block: PromptImage) -> PromptImage:
        digest = block.image.digest
        decoded = self._decoded.get(digest)
        if decoded is None:
            try:
                stored = await self._redis().get(self.prefix + "img:" + digest)
            except (redis_errors.RedisError, OSError) as exc:
                raise self._unavailable(exc) from exc
            if stored is None or self._vision is None:
                raise Unavailable(
                    f"The session store ({self._where}) no longer holds the session's image "
                    f"{digest[:12]}: open a new session and send it again",
                    code="store_unavailable",
                )
            assert isinstance(stored, bytes)  # the client decodes no responses
            mime, _, data = stored.partition(b"\n")
            decoded = await asyncio.to_thread(self._vision.read_image, data, mime.decode())
            if decoded.pad_tokens != block.image.pad_tokens:
                raise FailedPrecondition(
                    f"the session's image {digest[:12]} makes {decoded.pad_tokens} image pad "
                    f"tokens here and made {block.image.pad_tokens} where it was attached: "
                    "the replicas sharing this store serve different models"
                )
            self._remember(decoded)
        return PromptImage(block.start, block.end, decoded)

    def _remember(self, decoded: DecodedImage) -> None:
        self._decoded[decoded.digest] = decoded
        self._decoded.move_to_end(decoded.digest)
        while len(self._decoded) > _IMAGES_DECODED:
            self._decoded.popitem(last=False)

    # -- the rest ------------------------------------------------------------------------

    async def stats(self) -> tuple[int, int]:
        try:
            count, total = await self._redis().mget(self.prefix + "n", self.prefix + "total")
        except (redis_errors.RedisError, OSError) as exc:
            raise self._unavailable(exc) from exc
        return int(count or 0), int(total or 0)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


_UNLOADED = object()  # the pixels of an image this replica has not decoded yet


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _lifetime(session_id: str, values: Sequence[bytes | None]) -> Session:
    phase, used, charged, held, claim, lease = (v or b"" for v in values)
    return Session(
        session_id,
        phase=Phase(phase.decode()),
        last_used=float(used or 0),
        charged=int(charged or 0),
        held=int(held or 0),
        claim=claim.decode(),
        lease=float(lease or "inf"),
    )


def _lifetime_fields(session: Session) -> tuple[bytes, ...]:
    return (
        session.phase.value.encode(),
        repr(session.last_used).encode(),
        str(session.charged).encode(),
        str(session.held).encode(),
        session.claim.encode(),
        repr(session.lease).encode() if math.isfinite(session.lease) else b"inf",
    )


def _refs(images: Sequence[PromptImage]) -> list[list[Any]]:
    return [[b.start, b.end, b.image.digest, b.image.pad_tokens] for b in images]


def _content_fields(session: Session) -> dict[str, bytes]:
    undo = session.undo
    return {
        "images": orjson.dumps(_refs(session.images)),
        "undo": b"" if undo is None else orjson.dumps([undo.offset, _refs(undo.images)]),
        "tail": b"" if undo is None else _bytes(undo.tail),
    }


def _tokens(data: bytes) -> array[int]:
    tokens = array("I")
    tokens.frombytes(data)
    if sys.byteorder == "big":
        tokens.byteswap()
    return tokens


def _bytes(tokens: array[int]) -> bytes:
    if sys.byteorder == "big":
        tokens = array("I", tokens)
        tokens.byteswap()
    return tokens.tobytes()
