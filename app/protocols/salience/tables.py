"""What the sessions' rules run over (`lifecycle.Table`). Sans-IO.

- `MemoryTable`: every session of one process, the live objects, least recently used
  first; nothing to load or write back.
- `Snapshot`: the part of a shared store one call has loaded (the sessions it names, the
  least recently used ones, the totals; the same of the caller's tenant), and what the
  rules changed in it, for the store
  to write back in one atomic step (`app.store.redis_sessions`). What it has not loaded,
  it raises as `Missing`; the store loads that too and runs the call's rules again on a
  fresh snapshot. A session loaded for its lifetime only (a candidate for expiry or
  eviction, a lease to renew) has no content; the rules never read or change a content
  they did not ask for (`get`).
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
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
        tenant: str | None = None,
        tenant_front: int = 0,
        tenant_totals: bool = False,
    ) -> None:
        super().__init__("the snapshot lacks what the rules need")
        self.content = set(content)  # sessions needed with their content
        self.lifetimes = set(lifetimes)  # sessions needed for their lifetime fields
        self.front = front  # least recently used sessions needed, with their lifetimes
        self.totals = totals  # the session count and the tokens charged
        self.tenant = tenant  # the one tenant whose part is needed (the caller's)
        self.tenant_front = tenant_front  # its least recently used sessions needed
        self.tenant_totals = tenant_totals  # its session count and tokens charged


class MemoryTable(Generic[S]):
    """The sessions of one process: least recently used first, all of them and each
    tenant's."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, S] = OrderedDict()
        self._tenants: dict[str, OrderedDict[str, S]] = {}
        self._charged: Counter[str] = Counter()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def count(self, tenant: str) -> int:
        return len(self._tenants.get(tenant, ()))

    def charged(self, tenant: str) -> int:
        return self._charged[tenant]

    def get(self, session_id: str) -> S | None:
        return self._sessions.get(session_id)

    lifetime = get

    def by_use(self, before: float = math.inf, tenant: str | None = None) -> Iterator[S]:
        sessions = self._sessions if tenant is None else self._tenants.get(tenant)
        for session in (sessions or {}).values():
            if session.last_used >= before:
                return
            yield session

    def add(self, session: S) -> None:
        self._sessions[session.session_id] = session
        self._tenants.setdefault(session.tenant, OrderedDict())[session.session_id] = session

    def remove(self, session: S) -> None:
        self._sessions.pop(session.session_id, None)
        own = self._tenants.get(session.tenant)
        if own is not None:
            own.pop(session.session_id, None)
            if not own:
                del self._tenants[session.tenant]

    def touch(self, session: S) -> None:
        self._sessions.move_to_end(session.session_id)
        self._tenants[session.tenant].move_to_end(session.session_id)

    def changed(self, session: S) -> None:
        pass  # live objects

    def charge(self, tokens: int, session: S) -> None:
        self.tokens += tokens
        self._charged[session.tenant] += tokens
        if not self._charged[session.tenant]:
            del self._charged[session.tenant]


class Snapshot(Generic[S]):
    """Part of a shared store, loaded for one call: its sessions by id (None: not in the
    store), which of them have their content, the ids of the `front` least recently used
    sessions with the times they were last used (`complete` if that is all of them), and
    the totals if loaded; the same of one tenant (`tenant`: the caller's) if loaded.
    `legacy`: sessions stored before tenants (the default tenant's, counted in the
    server's totals only, never in a tenant's, until they go)."""

    def __init__(
        self,
        sessions: dict[str, S | None],
        *,
        content: Iterable[str] = (),
        front: list[tuple[str, float]] | None = None,
        complete: bool = False,
        count: int | None = None,
        tokens: int | None = None,
        tenant: str | None = None,
        tenant_front: list[tuple[str, float]] | None = None,
        tenant_complete: bool = False,
        tenant_count: int | None = None,
        tenant_tokens: int | None = None,
        legacy: Iterable[str] = (),
    ) -> None:
        self.sessions = sessions
        self.content = set(content)
        self.front = front or []
        self.complete = complete
        self._count = count
        self._tokens = tokens
        self.tenant = tenant
        self.tenant_front = tenant_front
        self.tenant_complete = tenant_complete
        self._tenant_count = tenant_count
        self._tenant_tokens = tenant_tokens
        self.legacy = set(legacy)
        # What the rules changed: written back by the store, in one step.
        self.removed: dict[str, S] = {}
        self.dirty: dict[str, S] = {}
        self.touched: list[str] = []  # in order: the most recently used last
        self.added: set[str] = set()
        self.count_change = 0
        self.tokens_change = 0
        self.count_changes: Counter[str] = Counter()  # per tenant
        self.tokens_changes: Counter[str] = Counter()

    def __len__(self) -> int:
        if self._count is None:
            raise Missing(totals=True)
        return self._count + self.count_change

    @property
    def tokens(self) -> int:
        if self._tokens is None:
            raise Missing(totals=True)
        return self._tokens + self.tokens_change

    def count(self, tenant: str) -> int:
        if tenant != self.tenant or self._tenant_count is None:
            raise Missing(tenant=tenant, tenant_totals=True)
        return self._tenant_count + self.count_changes[tenant]

    def charged(self, tenant: str) -> int:
        if tenant != self.tenant or self._tenant_tokens is None:
            raise Missing(tenant=tenant, tenant_totals=True)
        return self._tenant_tokens + self.tokens_changes[tenant]

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

    def by_use(self, before: float = math.inf, tenant: str | None = None) -> Iterator[S]:
        if tenant is None:
            yield from self._walk(self.front, self.complete, before, None)
            return
        if tenant != self.tenant or self.tenant_front is None:
            raise Missing(tenant=tenant, tenant_front=16)
        yield from self._walk(self.tenant_front, self.tenant_complete, before, tenant)

    def _walk(
        self, front: list[tuple[str, float]], complete: bool, before: float, tenant: str | None
    ) -> Iterator[S]:
        def more(size: int) -> Missing:
            if tenant is None:
                return Missing(front=size)
            return Missing(tenant=tenant, tenant_front=size)

        moved = set(self.touched)
        for rank, (session_id, used) in enumerate(front):
            if used >= before:
                return
            if session_id in moved or session_id in self.removed:
                continue
            if session_id not in self.sessions:
                raise more(max(16, 2 * rank + 2))
            session = self.sessions[session_id]
            if session is not None:
                yield session
        if not complete:
            raise more(max(16, 2 * len(front)))
        for session_id in self.touched:  # the most recently used, in their new order
            held = self._held(session_id)
            if held is None or held.last_used >= before:
                continue
            if tenant is None or (held.tenant == tenant and session_id not in self.legacy):
                yield held

    def add(self, session: S) -> None:
        self.sessions[session.session_id] = session
        self.content.add(session.session_id)
        self.added.add(session.session_id)
        self.count_change += 1
        self.count_changes[session.tenant] += 1
        self.touch(session)

    def remove(self, session: S) -> None:
        if session.session_id not in self.removed:
            self.removed[session.session_id] = session
            self.dirty.pop(session.session_id, None)
            self.count_change -= 1
            if session.session_id not in self.legacy:
                self.count_changes[session.tenant] -= 1

    def touch(self, session: S) -> None:
        if session.session_id in self.touched:
            self.touched.remove(session.session_id)
        self.touched.append(session.session_id)
        self.changed(session)

    def changed(self, session: S) -> None:
        if session.session_id not in self.removed:
            self.dirty[session.session_id] = session

    def charge(self, tokens: int, session: S) -> None:
        self.tokens_change += tokens
        if session.session_id not in self.legacy:
            self.tokens_changes[session.tenant] += tokens
