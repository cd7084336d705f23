"""The response store's contract: opaque records by (tenant, id), bounded in time and in
size (the store's, each tenant's, each record's), and a cancel flag per id that any
replica may raise and the owner of a background run reads.

Every implementation (`app.store.sqlite`, `app.store.redis`) keeps these rules, and the
tests hold both to them (tests/unit/test_response_store.py):

- A record is its tenant's (`app.tenants`): `get`, `put` and `delete` name the tenant
  with the id, and another tenant's record is, to them, a record that does not exist.
- `put(tenant, id, data, quota=)` stores or replaces a record; its time to live starts
  again. A record lives `ttl_s` seconds: past that `get` no longer returns it, and the
  next `put` (of any record) removes it. The tenant's records stay within its `quota`
  (0: none of its own) and all records within `max_bytes`: a `put` that would exceed
  either first evicts the tenant's own records written longest ago, never another
  tenant's; if that cannot make room (the store's bound taken by other tenants'
  records), it is refused. A record larger than `max_record_bytes` (below the store's
  bound: one record cannot take the whole store) or than the tenant's quota is refused
  (`ResourceExhausted`, code `store_full`), as is a write the backing store refuses for
  lack of room.
- `get(tenant, id)` is the record or None (never stored, expired, evicted, deleted, or
  another tenant's); `delete(tenant, id)` says whether there was one.
- `request_cancel(id)` raises the flag; `cancel_requested(id)` reads it (flags expire with
  the record's time to live). `put(..., unless_cancelled=True)` writes only while the flag
  is down, in the same transaction as it reads it, and says whether it wrote: the one
  moment a background run's end is decided, whichever replica raised the flag. (The
  caller raises a flag only for a record it has found as its tenant's.)
- A backing store that cannot be reached raises `Unavailable` (code
  `store_unavailable`), for that call only: nothing else in the server depends on the
  store, and the next call tries again.
- Concurrent writers (coroutines, threads, processes, replicas) never corrupt the
  bookkeeping: each `put` and `delete` is one transaction (SQLite) or one script (Redis).
- Records stored before tenants are the default tenant's (`DEFAULT_TENANT`): a store
  moves them into its order and totals when it is first opened.

Time is the caller's clock (`clock`, wall time by default, shared by replicas), so
expiry is tested without waiting. `BoundedStore` holds what every store by tenant (these
and the conversations', `app.store.conversations`) keeps of its `Bounds`, and the
refusals they rule. No framework imports; blocking I/O never runs on the
event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NotRequired, Protocol, TypedDict, Unpack

from app.errors import ResourceExhausted, Unavailable

Clock = Callable[[], float]
DEFAULT_CLOCK: Clock = time.time


class Bounds(TypedDict):
    """What every store by tenant is bounded by, as its constructor takes it: a record's
    time to live, the store's bytes, one record's bytes (0: the store's), its clock."""

    ttl_s: float
    max_bytes: int
    max_record_bytes: NotRequired[int]
    clock: NotRequired[Clock]


class BoundedStore:
    """A store by tenant (responses or conversations, on SQLite or Redis): its `Bounds`,
    and the refusals of a write they rule out, told of the store `where` (the log's)."""

    def __init__(self, where: str, **bounds: Unpack[Bounds]) -> None:
        self.ttl_s = bounds["ttl_s"]
        self.max_bytes = bounds["max_bytes"]
        self.max_record_bytes = record_bound(self.max_bytes, bounds.get("max_record_bytes", 0))
        self._clock = bounds.get("clock", DEFAULT_CLOCK)
        self._where = where

    def _quota(self, quota: int) -> int:
        """A tenant's quota (0: none of its own) within the store's bound."""
        return min(quota or self.max_bytes, self.max_bytes)

    def _check(self, size: int, quota: int) -> None:
        """Refuse a write of `size` bytes that no eviction could make fit `quota`."""
        why = refusal(size, quota, self.max_record_bytes)
        if why is not None:
            raise full(self._where, why)

    def _no_room(self, size: int) -> ResourceExhausted:
        """The refusal of a write its tenant cannot make room for."""
        return full(self._where, no_room(size, self.max_bytes))


class ResponseStore(Protocol):
    ttl_s: float
    max_bytes: int
    max_record_bytes: int

    async def get(self, tenant: str, key: str) -> bytes | None: ...

    async def put(
        self,
        tenant: str,
        key: str,
        data: bytes,
        *,
        quota: int = 0,
        unless_cancelled: bool = False,
    ) -> bool: ...

    async def delete(self, tenant: str, key: str) -> bool: ...

    async def request_cancel(self, key: str) -> None: ...

    async def cancel_requested(self, key: str) -> bool: ...

    async def close(self) -> None: ...


def unavailable(where: str, exc: BaseException, *, store: str = "response store") -> Unavailable:
    """A backing store that cannot be reached, for this call (`store` names which): where
    it is and what failed go to the log only, under the error id the client is told."""
    return Unavailable.withholding(
        f"The {store} is unavailable", f"{where}: {exc!r}", code="store_unavailable"
    )


def full(where: str, why: str, *, store: str = "response store") -> ResourceExhausted:
    """A write that would not fit, or that the backing store refused for lack of room:
    `why` goes to the client (a record's size and the bound), where the store is to the
    log only."""
    return ResourceExhausted.withholding(f"The {store} is full: {why}", where, code="store_full")


def too_large(size: int, max_bytes: int) -> str:
    return f"a record of {size} bytes exceeds the store's bound of {max_bytes} bytes"


def record_bound(max_bytes: int, max_record_bytes: int) -> int:
    """The bound of one record: `max_record_bytes`, at most the store's own."""
    return min(max_bytes, max_record_bytes) if max_record_bytes > 0 else max_bytes


def refusal(size: int, quota: int, max_record_bytes: int) -> str | None:
    """Why a record of `size` bytes cannot be stored whatever is evicted (over one
    record's bound, or over its tenant's whole quota), or None."""
    if size > max_record_bytes:
        return f"a record of {size} bytes exceeds the bound of one record, {max_record_bytes} bytes"
    if quota and size > quota:
        return f"a record of {size} bytes exceeds your quota of {quota} bytes"
    return None


def no_room(size: int, max_bytes: int) -> str:
    """Why a record could not be stored: what is left of the store's bound is other
    tenants' records, which a tenant never evicts."""
    return (
        f"no room for a record of {size} bytes within the store's bound of {max_bytes} "
        "bytes: the rest is held by other tenants' records"
    )
