"""The response store's contract: opaque records by id, bounded in time and in size, and
a cancel flag per id that any replica may raise and the owner of a background run reads.

Every implementation (`app.store.sqlite`, `app.store.redis`) keeps these rules, and the
tests hold both to them (tests/unit/test_response_store.py):

- `put(id, data)` stores or replaces a record; its time to live starts again. A record
  lives `ttl_s` seconds: past that `get` no longer returns it, and the next `put` (of any
  record) removes it. The records' total size stays within `max_bytes`: a `put` that
  would exceed it first evicts the records written longest ago; a record larger than
  `max_bytes` alone is refused (`ResourceExhausted`, code `store_full`), as is a write
  the backing store refuses for lack of room.
- `get(id)` is the record or None (never stored, expired, evicted or deleted);
  `delete(id)` says whether there was one.
- `request_cancel(id)` raises the flag; `cancel_requested(id)` reads it (flags expire with
  the record's time to live). `put(id, data, unless_cancelled=True)` writes only while the
  flag is down, in the same transaction as it reads it, and says whether it wrote: the
  one moment a background run's end is decided, whichever replica raised the flag.
- A backing store that cannot be reached raises `Unavailable` (code
  `store_unavailable`), for that call only: nothing else in the server depends on the
  store, and the next call tries again.
- Concurrent writers (coroutines, threads, processes, replicas) never corrupt the
  bookkeeping: each `put` and `delete` is one transaction (SQLite) or one script (Redis).

Time is the caller's clock (`clock`, wall time by default, shared by replicas), so
expiry is tested without waiting. No framework imports; blocking I/O never runs on the
event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from app.errors import ResourceExhausted, Unavailable

Clock = Callable[[], float]
DEFAULT_CLOCK: Clock = time.time


class ResponseStore(Protocol):
    ttl_s: float
    max_bytes: int

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, data: bytes, *, unless_cancelled: bool = False) -> bool: ...

    async def delete(self, key: str) -> bool: ...

    async def request_cancel(self, key: str) -> None: ...

    async def cancel_requested(self, key: str) -> bool: ...

    async def close(self) -> None: ...


def unavailable(where: str, exc: BaseException, *, store: str = "response store") -> Unavailable:
    """A backing store that cannot be reached, for this call (`store` names which)."""
    return Unavailable(f"The {store} ({where}) is unavailable: {exc}", code="store_unavailable")


def full(where: str, why: str, *, store: str = "response store") -> ResourceExhausted:
    """A write that would not fit, or that the backing store refused for lack of room."""
    return ResourceExhausted(f"The {store} ({where}) is full: {why}", code="store_full")


def too_large(size: int, max_bytes: int) -> str:
    return f"a record of {size} bytes exceeds the store's bound of {max_bytes} bytes"
