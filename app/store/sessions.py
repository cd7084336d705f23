"""Where Salience sessions live: the contract, and the in-process store.

The rules (`app.protocols.salience`: which sessions exist, run or go, and what they hold)
are sans-IO and run over a table; a session store gives them one per call and keeps what
they changed:

- `transact(decide, ...)` runs `decide(table, now)` on the sessions, and keeps what it
  changed, atomically: no other call's change lands between what `decide` read and what
  it wrote. `decide` returns its outcome rather than raising a client's error (the store
  keeps what the rules did before the refusal, as one process would). A shared store may
  run `decide` more than once (on a fresh snapshot each time: when the rules need what it
  had not loaded, or another replica changed what they read); only its last run counts.
  `content`, `lifetimes`, `totals` and `tenant` (the caller's, whose part of the store
  the rules count and evict in) say what the call will touch, so that a shared store
  loads it in one go (a hint: what it lacks, the rules ask for).
- `keep_images` stores a Generate's attachments before the call names them;
  `hydrate` gives an engine request the pixels of the session's images (a shared store
  holds them encoded, and decodes them on the replica that needs them, once).
- `stats()`: the sessions held and the tokens charged (for /metrics).
- A backing store that cannot be reached raises `Unavailable` (`store_unavailable`), for
  that call only.

`MemorySessions` is the store of one process (the sessions are live objects: nothing to
load, nothing to write back, nothing that outlives the process); `RedisSessions`
(`app.store.redis_sessions`) is one Redis that replicas share. `app.store.open_sessions`
picks one: "memory", or a `redis://` (`rediss://`, `unix://`) URL.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from app.engine.base import DecodedImage, GenerationRequest
from app.protocols.salience.lifecycle import Clock, Table
from app.protocols.salience.sessions import Session
from app.protocols.salience.tables import MemoryTable

T = TypeVar("T")
Decide = Callable[[Table[Session], float], T]
# An attachment as a Generate brings it: decoded, with its mime type and its bytes.
Attached = tuple[DecodedImage, str, bytes]


class SessionBackend(Protocol):
    shared: bool  # replicas see the same sessions
    lease_s: float  # how long a running Generate's claim holds unrenewed

    async def transact(
        self,
        decide: Decide[T],
        *,
        content: Sequence[str] = (),
        lifetimes: Sequence[str] = (),
        totals: bool = False,
        tenant: str | None = None,
    ) -> T: ...

    async def keep_images(self, images: Sequence[Attached]) -> None: ...

    async def hydrate(self, request: GenerationRequest) -> GenerationRequest: ...

    async def stats(self) -> tuple[int, int]: ...

    async def close(self) -> None: ...


class MemorySessions:
    """The sessions of this process, on its monotonic clock."""

    shared = False
    lease_s = math.inf  # nothing dies without the sessions

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.table: MemoryTable[Session] = MemoryTable()
        self._clock = clock

    async def transact(
        self,
        decide: Decide[T],
        *,
        content: Sequence[str] = (),
        lifetimes: Sequence[str] = (),
        totals: bool = False,
        tenant: str | None = None,
    ) -> T:
        return decide(self.table, self._clock())

    async def keep_images(self, images: Sequence[Attached]) -> None:
        pass  # the sessions hold them decoded

    async def hydrate(self, request: GenerationRequest) -> GenerationRequest:
        return request

    async def stats(self) -> tuple[int, int]:
        return len(self.table), self.table.tokens

    async def close(self) -> None:
        pass
