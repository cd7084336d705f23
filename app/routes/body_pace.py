"""Big request bodies taken at a bounded pace per client.

A big body costs the server CPU in proportion to its bytes wherever it goes: read off
the socket, parsed in a body worker's child, validated, templated in the render process
(about 12 ms a MiB of a chat's text in all, bench/results/README.md "Hostile clients"),
and it delays the honest requests of the ~0.5 s it is worked on (a probe's timeline:
their TTFT p50 up to 4x within it). A client sending one big body after another so kept
every honest client's TTFT at 1.74x idle's, and a cheaper path for a body only made its
flood faster. `BodyPace` bounds the rate instead of the cost:

- every body over `IN_CHILD_BYTES` (the ones parsed in a child) pays for all its bytes
  from its client's bucket, which fills at `--big-body-bytes-per-s` and holds
  `BURST_SECONDS` of it: an HTTP body as it is read, a quantum at a time
  (`app.routes.http.bodies.read_bytes`), a websocket frame before it is parsed (`pay`);
- a body that finds its bucket empty waits unread: its transport stops reading the
  socket (uvicorn pauses a body past 64 KiB unread), so the client's TCP window closes
  and the wait costs the server nothing but the bytes already taken;
- a client (`client_of`: its tenant, else its peer's address) has a bucket of its own,
  its bodies in the order they came: one client's flood never delays another's body, and
  an occasional big body (a chat with large images inline, an agent's long history)
  finds its bucket full and is never delayed.

A client's bucket is forgotten once it has been full again for a while (`_forget`), so
the state is bounded by the clients of the last few seconds. The state is its event
loop's alone.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

# What a body pays at once while it is read: 1 MiB, about 12 ms of the server's CPU.
QUANTUM = 1 << 20
# A bucket holds this many seconds of the pace: a burst of big bodies goes at once.
BURST_SECONDS = 4.0


@dataclass
class _Bucket:
    tokens: float
    at: float
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)  # its bodies, in order


class BodyPace:
    """`await pace.take(client, size)`: once `size` bytes of `client`'s pace are granted."""

    def __init__(
        self,
        bytes_per_s: float,
        *,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.rate = bytes_per_s
        self.burst = max(bytes_per_s * BURST_SECONDS if burst is None else burst, QUANTUM)
        self._clock, self._sleep = clock, sleep
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()  # least recent first

    def _bucket(self, client: Hashable, now: float) -> _Bucket:
        bucket = self._buckets.pop(client, None)
        self._forget(now)  # not this client's: it is out of the order until it is back
        if bucket is None:
            bucket = _Bucket(self.burst, now)
        self._buckets[client] = bucket
        return bucket

    def _forget(self, now: float) -> None:
        """Drop the least recent buckets that are full again and idle: a new one is the
        same."""
        while self._buckets:
            client, bucket = next(iter(self._buckets.items()))
            full_at = bucket.at + (self.burst - bucket.tokens) / self.rate
            if bucket.turn.locked() or full_at > now:
                return
            del self._buckets[client]

    def _refill(self, bucket: _Bucket) -> None:
        now = self._clock()
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now

    async def take(self, client: Hashable, size: int) -> None:
        """Wait for `size` bytes (at most `QUANTUM`) of `client`'s pace, after its bodies
        that came before."""
        size = min(size, QUANTUM)
        bucket = self._bucket(client, self._clock())
        async with bucket.turn:
            self._refill(bucket)
            if bucket.tokens < size:
                await self._sleep((size - bucket.tokens) / self.rate)
                self._refill(bucket)
            bucket.tokens -= size

    async def pay(self, client: Hashable, size: int) -> None:
        """`take` for all of `size` bytes, a quantum at a time (a body already read)."""
        while size > 0:
            await self.take(client, size)
            size -= QUANTUM
