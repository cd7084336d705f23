"""What the sessions' rules run over (`lifecycle.Table`). Sans-IO.

- `MemoryTable`: every session of one process, the live objects, least recently used
  first; nothing to load or write back.
- `Snapshot`: the part of a shared store one call has loaded (the sessions it names, the
  least recently used ones, the totals), and what the rules changed in it, for the store
  to write back in one atomic step (`app.store.redis_sessions`). What it has not loaded,
  it raises as `Missing`; the store loads that too and runs the call's rules again on a
  fresh snapshot. A session loaded for its lifetime only (a candidate for expiry or
  eviction, a lease to renew) has no content; the rules never read or change a content
  they did not ask for (`get`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from app.protocols.salience.lifecycle import Lifetime

S = TypeVar("S", bound=Lifetime)


class Missing(Exception):
    """What the rules needed that the snapshot has not loaded."""

    def __init__(
        self,
        *,
        content: Iterable[str] = (),
        lifetimes: Iterable[str] = (),
        front: int = 0,
        totals: bool = False,
    ) -> None:
        super().__init__("the snapshot lacks what the rules need")
        self.content = set(content)  # sessions needed with their content
        self.lifetimes = set(lifetimes)  # sessions needed for their lifetime fields
        self.front = front  # least recently used sessions needed, with their lifetimes
        self.totals = totals  # the session count and the tokens charged


class MemoryTable(Generic[S]):
    """The sessions of one process."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, S] = OrderedDict()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> S | None:
        return self._sessions.get(session_id)

    lifetime = get

    def by_use(self, before: float = math.inf) -> Iterator[S]:
        for session in self._sessions.values():
            if session.last_used >= before:
                return
            yield session

    def add(self, session: S) -> None:
        self._sessions[session.session_id] = session

    def remove(self, session: S) -> None:
        self._sessions.pop(session.session_id, None)

    def touch(self, session: S) -> None:
        self._sessions.move_to_end(session.session_id)

    def changed(self, session: S) -> None:
        pass  # live objects

    def charge(self, tokens: int) -> None:
        self.tokens += tokens


class Snapshot(Generic[S]):
    """Part of a shared store, loaded for one call: its sessions by id (None: not in the
    store), which of them have their content, the ids of the `front` least recently used
    sessions with the times they were last used (`complete` if that is all of them), and
    the totals if loaded."""

    def __init__(
        self,
        sessions: dict[str, S | None],
        *,
        content: Iterable[str] = (),
        front: list[tuple[str, float]] | None = None,
        complete: bool = False,
        count: int | None = None,
        tokens: int | None = None,
    ) -> None:
        self.sessions = sessions
        self.content = set(content)
        self.front = front or []
        self.complete = complete
        self._count = count
        self._tokens = tokens
        # What the rules changed: written back by the store, in one step.
        self.removed: dict[str, S] = {}
        self.dirty: dict[str, S] = {}
        self.touched: list[str] = []  # in order: the most recently used last
        self.added: set[str] = set()
        self.count_change = 0
        self.tokens_change = 0

    def __len__(self) -> int:
        if self._count is None:
            raise Missing(totals=True)
        return self._count + self.count_change

    @property
    def tokens(self) -> int:
        if self._tokens is None:
            raise Missing(totals=True)
        return self._tokens + self.tokens_change

    def _held(self, session_id: str) -> S | None:
        if session_id in self.removed:
            return None
        return self.sessions[session_id]

    def get(self, session_id: str) -> S | None:
        if session_id not in self.content:
            raise Missing(content=[session_id])
        return self._held(session_id)

    def lifetime(self, session_id: str) -> S | None:
        if session_id not in self.sessions:
            raise Missing(lifetimes=[session_id])
        return self._held(session_id)

    def by_use(self, before: float = math.inf) -> Iterator[S]:
        moved = set(self.touched)
        for rank, (session_id, used) in enumerate(self.front):
            if used >= before:
                return
            if session_id in moved or session_id in self.removed:
                continue
            if session_id not in self.sessions:
                raise Missing(front=max(16, 2 * rank + 2))
            session = self.sessions[session_id]
            if session is not None:
                yield session
        if not self.complete:
            raise Missing(front=max(16, 2 * len(self.front)))
        for session_id in self.touched:  # the most recently used, in their new order
            held = self._held(session_id)
            if held is not None and held.last_used < before:
                yield held

    def add(self, session: S) -> None:
        self.sessions[session.session_id] = session
        self.content.add(session.session_id)
        self.added.add(session.session_id)
        self.count_change += 1
        self.touch(session)

    def remove(self, session: S) -> None:
        if session.session_id not in self.removed:
            self.removed[session.session_id] = session
            self.dirty.pop(session.session_id, None)
            self.count_change -= 1

    def touch(self, session: S) -> None:
        if session.session_id in self.touched:
            self.touched.remove(session.session_id)
        self.touched.append(session.session_id)
        self.changed(session)

    def changed(self, session: S) -> None:
        if session.session_id not in self.removed:
            self.dirty[session.session_id] = session

    def charge(self, tokens: int) -> None:
        self.tokens_change += tokens
