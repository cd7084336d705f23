"""The batches' store contract: files, batches, their requests and their results, on the
backing store the replicas share (`--batch-store`: by default the Responses store's
SQLite file or Redis), so that any replica advances and answers any batch.

What is kept, by key (a file's or a batch's id):

- a document (its object, as JSON, opaque here) with an absolute expiry, listed in
  indexes (`page`: newest first or oldest first, after a key), and `swap`ped whole: the
  one way a batch's state changes, so concurrent writers (an API call on one replica, a
  runner on another) never lose each other's change;
- parts: a file's bytes, or a batch's requests in chunks, written before the document
  (parts whose document never comes expire after `UPLOAD_S`);
- results (of a document there): one per request index, the first written wins
  (`add_result` says whether it was that one), tallied per outcome (count and bytes)
  with the tokens it used, in the same transaction, so the output holds every request
  exactly once and the counts match it;
- work: a batch's chunks handed out one at a time (`claim`), each under a lease its
  runner renews (`renew`) until it has answered every request of it (`finish`); a lease
  left to expire (its replica died) is handed out again before any new chunk; `lease`
  is one lease per key (the batch's own: the runner that validates or ends it; a
  background response's: the replica that runs it).

Bounds: `max_bytes` bounds the parts written with `bounded=True` (uploads): such a write
that would take the total of every part and result past it is refused
(`ResourceExhausted`, code `store_full`); a batch's own parts and results are always
written (the batch was accepted), and count in the total. An upload's parts name their
`owner` (a tenant, `app.tenants`), whose uploads together stay within its `quota` (0:
none of its own): a part past it is refused the same way, so that one tenant's uploads
cannot take the whole bound from the others'; the owner's total falls when the key goes.
Everything under a key lives until the document's expiry; past it, reads miss it and
the next write removes it all, freeing its bytes (`delete` does the same at once).

A backing store that cannot be reached raises `Unavailable` (`store_unavailable`), for
that call only. Every write is one transaction (SQLite) or one script (Redis). Time is
the caller's clock, as the other stores'. No framework imports; blocking I/O never runs
on the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

# How long the parts written under a key wait for its document (an upload's, whose
# server may die before it ends) before they expire.
UPLOAD_S = 3600.0
# What the store's errors call it.
STORE = "batch store"
# Every outcome a request's result may have.
OUTCOMES = ("succeeded", "errored", "expired", "cancelled")


@dataclass(frozen=True, slots=True)
class Tally:
    """A batch's results so far: count and bytes per outcome, tokens of the succeeded."""

    counts: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0

    def count(self, *outcomes: str) -> int:
        return sum(self.counts.get(o, 0) for o in outcomes)

    def size(self, *outcomes: str) -> int:
        return sum(self.sizes.get(o, 0) for o in outcomes)


@dataclass(frozen=True, slots=True)
class Leases:
    """A batch's chunk leases: held (unexpired) and abandoned (expired, to hand out
    again); `handed` chunks handed out so far."""

    live: int
    abandoned: int
    handed: int


class BatchStore(Protocol):
    max_bytes: int

    # -- documents ---------------------------------------------------------------------

    async def create(
        self, key: str, data: bytes, *, expires: float, indexes: dict[str, float]
    ) -> None:
        """Store a new document, listed in each index with its score."""
        ...

    async def get(self, key: str) -> bytes | None: ...

    async def swap(self, key: str, old: bytes, new: bytes) -> bool:
        """Replace the document if it is still `old`; False if it is not (or gone)."""
        ...

    async def delete(self, key: str) -> bool:
        """The document and all under its key; whether there was one."""
        ...

    async def page(
        self, index: str, *, after: str | None, limit: int, desc: bool
    ) -> tuple[list[bytes], bool] | None:
        """Up to `limit` documents of `index` after the key `after` (by score, then key),
        and whether more follow; None if `after` is not in the index."""
        ...

    async def listed(self, index: str, key: str, score: float | None) -> None:
        """List `key` in `index` with `score`, or take it out (`score` None)."""
        ...

    async def keys(self, index: str) -> list[str]:
        """Every live key of `index`, lowest score first."""
        ...

    # -- parts ---------------------------------------------------------------------------

    async def put_part(
        self, key: str, index: int, data: bytes, *, bounded: bool, owner: str = "", quota: int = 0
    ) -> None: ...

    async def part(self, key: str, index: int) -> bytes | None: ...

    # -- results -------------------------------------------------------------------------

    async def add_result(
        self, key: str, index: int, outcome: str, data: bytes, tokens: tuple[int, int] = (0, 0)
    ) -> bool:
        """Request `index`'s result, unless it has one; whether this one was written."""
        ...

    async def add_results(self, key: str, rows: Sequence[tuple[int, str, bytes]]) -> int:
        """`add_result` of each (index, outcome, data) of `rows` (no tokens), in one
        transaction; how many were written."""
        ...

    async def results(self, key: str, start: int, stop: int) -> list[tuple[int, str, bytes]]:
        """The results of requests `start` to `stop` (excluded) that have one, in order."""
        ...

    async def tally(self, key: str) -> Tally: ...

    # -- work ----------------------------------------------------------------------------

    async def claim(
        self, key: str, *, chunks: int, owner: str, now: float, until: float
    ) -> int | None:
        """A chunk for `owner` until `until`: an abandoned one first, else the next of
        `chunks` not handed out yet; None when there is neither."""
        ...

    async def renew(self, key: str, chunk: int, *, owner: str, until: float) -> bool:
        """Extend `owner`'s lease; False if the chunk is no longer its."""
        ...

    async def finish(self, key: str, chunk: int, *, owner: str) -> None:
        """The chunk is answered: its lease ends for good (if still `owner`'s)."""
        ...

    async def release(self, key: str, chunk: int, *, owner: str) -> None:
        """`owner` gives the chunk back unanswered: it is handed out again at once."""
        ...

    async def leases(self, key: str, now: float) -> Leases: ...

    async def lease(self, key: str, *, owner: str, now: float, until: float) -> bool:
        """Take or renew the key's own lease: if it is free, expired or `owner`'s. A key
        with no document may hold one (a background response's: it lives until `until`,
        or `unlease`)."""
        ...

    async def leased(self, key: str, now: float) -> bool:
        """Someone holds the key's lease (it has not expired)."""
        ...

    async def unlease(self, key: str, *, owner: str) -> None:
        """End `owner`'s lease of the key (nothing if it is not its)."""
        ...

    async def close(self) -> None: ...


def over(total: int, size: int, max_bytes: int) -> str:
    """Why an upload's part is refused: the bound."""
    return f"{size} more bytes would take the {total} held past the bound of {max_bytes}"


def over_quota(own: int, size: int, quota: int) -> str:
    """Why an upload's part is refused: its owner's quota."""
    return f"{size} more bytes would take your {own} uploaded bytes past your quota of {quota}"
