"""The lifetime of Salience sessions: which exist, which run, and which go. Sans-IO.

h11's rule 1, kept: every rule that decides whether a session exists, runs or goes lives
here; the content rules (tokens, images, offsets: `sessions.py`), the service and the
transports only drive it. Time comes from an injected clock, and the sessions from a
`Table`: the process's own (`tables.MemoryTable`), or what one call loaded of a store
that replicas share (`tables.Snapshot`), which the caller writes back in one atomic step.
The rules are the same either way.

A session is in one phase; `LIFECYCLE[(phase, cause)]` says where each cause leads, and
every pair is in the table (a cause that changes nothing maps a phase to itself).
`REFUSED` names the pairs that are refused instead, the phase unchanged:

    IDLE     held, no Generate running. It expires after `ttl_s` unused, and it may be
             evicted, least recently used first, to make room for another session
    RUNNING  a Generate runs on it, on any transport and any replica, under that call's
             claim: it never expires and is never evicted; a second Generate is ABORTED
             ("session busy")
    GONE     closed, expired or evicted: any call naming it is NOT_FOUND. The proto makes
             the client the source of truth for the tokens, so its owner re-opens the
             session and sends them again

On the wire: closing a RUNNING session cancels its Generate, whichever transport runs it
(the stream ends with Done CANCELLED); its charge goes at once, with the session.

Claims and leases. A Generate holds its session by a claim (an id of its own) until a
lease runs out; the server running it renews the lease while it runs (`renew`) and ends
the claim when the call ends (`end`: only the claim that holds the session ends it). A
server that dies mid-Generate renews nothing: once its lease has run out, the first call
that finds the session lapses the claim (`LAPSE`), which puts the session back as it was
before the Generate (`Lifetime.rollback`), which is what the proto says a failed call
leaves. A claim that lapsed holds nothing more: its own end or renewal is ABORTED if
the session was taken back (the call's tokens are not kept), and finds nothing if the
session has gone meanwhile. In one process nothing can die without the sessions, and the
lease is infinite.

Using a session (`use`: every call that names it) makes it the most recently used and
restarts its TTL; so does the end of its Generate. Sessions are kept least recently used
first, which is also oldest `last_used` first, so expiry and eviction read from the front.

Tenants. Every session is its tenant's (`app.tenants`: the caller that opened it), and a
`Lifecycle` runs the rules for one caller's tenant: a session of another tenant is, to
it, a session that does not exist (NOT_FOUND, never a refusal that says it exists; its
CloseSession does nothing, as for an unknown id). Expiry is the TTL's, whoever's.

Room, per tenant and server-wide (what one careless client could otherwise take from
every other; with a shared store, fleet-wide). A tenant makes room only among its own
sessions: one tenant's sessions never evict another's.

- `max_sessions` (server-wide) and the tenant's `Quota.sessions`: a new session
  (OpenSession, ForkSession) at either first drops what the TTL has expired, then evicts
  the tenant's least recently used IDLE session. Only when none of its sessions is idle
  is it RESOURCE_EXHAUSTED.
- `max_total_tokens` (server-wide) and the tenant's `Quota.tokens`: every session is
  charged what it holds, and while a Generate runs, what the call may still add (its
  `max_tokens`) and the tail it would put back on failure (what a truncating call cut).
  A session that would take more than the room left (a Generate's charge, a fork's
  inheritance) first evicts the tenant's least recently used IDLE sessions, never itself
  (nor a fork's source); if those cannot free enough, it is RESOURCE_EXHAUSTED and
  nobody is evicted.

With the quotas an equal share of the server's bounds (the default), a tenant never
meets the server-wide bound before its own; with one tenant the two are the same.

A session whose claim has lapsed counts as IDLE for expiry and eviction. Evictions are
counted by reason (`evicted`, for /metrics); expiries are not evictions. The claims of
running Generates whose session was closed are listed in `cancelled`, for their server
to cancel (another replica's learns it when it next renews).

Draining (`refusal`): a draining server opens no session (the drain's refusal,
UNAVAILABLE with a retry hint); the sessions held stay usable.
"""

from __future__ import annotations

import enum
import math
import secrets
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from app.errors import Aborted, NotFound, ResourceExhausted, SwitchboardError
from app.tenants import DEFAULT_TENANT

Clock = Callable[[], float]


class Phase(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    GONE = "gone"


class Cause(enum.Enum):
    BEGIN = "begin"  # a Generate is applied to the session
    END = "end"  # that Generate is over (done, failed or cancelled), by its claim
    CLOSE = "close"  # CloseSession
    EXPIRE = "expire"  # unused for longer than the TTL
    EVICT = "evict"  # chosen to make room for another session or its tokens
    RENEW = "renew"  # the running Generate's server extends its lease
    LAPSE = "lapse"  # its lease ran out unrenewed: its server has gone


class Eviction(enum.Enum):
    """Why a session was evicted (the label of the eviction counter)."""

    CAP = "cap"  # the session cap: room for a new session
    TOKENS = "tokens"  # the server-wide token bound: room for another session's tokens


_P, _C = Phase, Cause
LIFECYCLE: Mapping[tuple[Phase, Cause], Phase] = {
    (_P.IDLE, _C.BEGIN): _P.RUNNING,
    (_P.IDLE, _C.END): _P.IDLE,  # refused: the claim lapsed, the session was taken back
    (_P.IDLE, _C.CLOSE): _P.GONE,
    (_P.IDLE, _C.EXPIRE): _P.GONE,
    (_P.IDLE, _C.EVICT): _P.GONE,
    (_P.IDLE, _C.RENEW): _P.IDLE,  # refused, as END
    (_P.IDLE, _C.LAPSE): _P.IDLE,  # nothing runs, nothing lapses
    (_P.RUNNING, _C.BEGIN): _P.RUNNING,  # refused: session busy
    (_P.RUNNING, _C.END): _P.IDLE,
    (_P.RUNNING, _C.CLOSE): _P.GONE,  # its Generate is cancelled
    (_P.RUNNING, _C.EXPIRE): _P.RUNNING,  # a running session never expires
    (_P.RUNNING, _C.EVICT): _P.RUNNING,  # nor is it evicted
    (_P.RUNNING, _C.RENEW): _P.RUNNING,
    (_P.RUNNING, _C.LAPSE): _P.IDLE,  # as it was before the Generate
    **{(_P.GONE, cause): _P.GONE for cause in Cause},  # (GONE, BEGIN) refused: not found
}
REFUSED: Mapping[tuple[Phase, Cause], Callable[[str], SwitchboardError]] = {
    (_P.RUNNING, _C.BEGIN): lambda _: Aborted(
        "session busy: one Generate at a time per session (if the server running it has "
        "gone, the session is freed once that call's lease runs out)"
    ),
    (_P.GONE, _C.BEGIN): lambda session_id: _not_found(session_id),
    (_P.IDLE, _C.END): lambda session_id: _claim_lost(session_id),
    (_P.IDLE, _C.RENEW): lambda session_id: _claim_lost(session_id),
}


@dataclass(frozen=True, slots=True)
class Quota:
    """What one tenant's sessions may hold."""

    sessions: int
    tokens: int


@dataclass(slots=True, eq=False)
class Lifetime:
    """A session's lifetime fields; changed only by `Lifecycle`."""

    session_id: str
    tenant: str = DEFAULT_TENANT
    phase: Phase = Phase.IDLE
    last_used: float = 0.0
    charged: int = 0  # tokens counted against the server-wide bound
    held: int = 0  # while a Generate runs: the tokens held before it (a lapse's charge)
    claim: str = ""  # the running Generate's claim ("" when none runs)
    lease: float = math.inf  # until when that claim holds unrenewed

    @property
    def busy(self) -> bool:
        return self.phase is Phase.RUNNING

    def rollback(self) -> None:
        """Put the content back as it was before the running Generate (a session with
        content says how)."""


S = TypeVar("S", bound=Lifetime)


class Table(Protocol[S]):
    """The sessions the rules run over: held sessions least recently used first (all of
    them, or one tenant's), and the tokens they are charged (in all, and per tenant). A
    session the rules change is handed back through `add`, `remove`, `touch` or
    `changed`; a charge, through `charge`.

    A table that holds only part of a shared store raises `tables.Missing` for what it
    has not loaded; its caller loads that and runs the rules again."""

    def __len__(self) -> int: ...  # sessions held

    @property
    def tokens(self) -> int: ...  # charged in all

    def count(self, tenant: str) -> int:
        """The sessions `tenant` holds."""

    def charged(self, tenant: str) -> int:
        """The tokens `tenant`'s sessions are charged."""

    def get(self, session_id: str) -> S | None:
        """The held session with its content, or None."""

    def lifetime(self, session_id: str) -> S | None:
        """The held session, its lifetime fields at least, or None."""

    def by_use(self, before: float = math.inf, tenant: str | None = None) -> Iterator[S]:
        """Held sessions (`tenant`'s only, if given) least recently used first, up to the
        first used at `before` or later. The caller changes none while it iterates."""

    def add(self, session: S) -> None: ...

    def remove(self, session: S) -> None: ...

    def touch(self, session: S) -> None:
        """`session` is now the most recently used (its `last_used` is set)."""

    def changed(self, session: S) -> None: ...

    def charge(self, tokens: int, session: S) -> None:
        """Add `tokens` (negative to release), `session`'s, to the total and to its
        tenant's."""


class Lifecycle(Generic[S]):
    """The rules above, over one table, for one caller's `tenant` (under its `quota`: by
    default the server's own bounds)."""

    def __init__(
        self,
        table: Table[S],
        clock: Clock,
        *,
        ttl_s: float,
        max_sessions: int,
        max_total_tokens: int,
        lease_s: float = math.inf,
        refusal: Callable[[], SwitchboardError] | None = None,
        tenant: str = DEFAULT_TENANT,
        quota: Quota | None = None,
    ) -> None:
        self.table = table
        self._clock = clock
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.max_total_tokens = max_total_tokens
        self.lease_s = lease_s
        self._refusal = refusal
        self.tenant = tenant
        self.quota = quota or Quota(max_sessions, max_total_tokens)
        self.evicted: Counter[Eviction] = Counter()
        self.cancelled: list[str] = []  # claims whose session was closed under them

    def __len__(self) -> int:
        return len(self.table)

    @property
    def tokens(self) -> int:
        return self.table.tokens

    # -- the table -------------------------------------------------------------------

    def check(self, session: S, cause: Cause) -> None:
        """Raise what the table refuses `cause` in the session's phase; change nothing."""
        refused = REFUSED.get((session.phase, cause))
        if refused is not None:
            raise refused(session.session_id)

    def _step(self, session: S, cause: Cause) -> Phase:
        """Apply `cause`; the phase it left."""
        self.check(session, cause)
        before = session.phase
        session.phase = LIFECYCLE[(before, cause)]
        if session.phase is not Phase.RUNNING:
            session.claim, session.lease = "", math.inf
        if session.phase is Phase.GONE and before is not Phase.GONE:
            self._charge(session, 0)
            self.table.remove(session)
        else:
            self.table.changed(session)
        return before

    def _lapsed(self, session: S) -> bool:
        return session.phase is Phase.RUNNING and session.lease <= self._clock()

    def _idle(self, session: S) -> bool:
        """Free to expire or evict: idle, or running under a lapsed claim."""
        return session.phase is Phase.IDLE or self._lapsed(session)

    def _settle(self, session: S) -> None:
        """Lapse a claim whose lease has run out: the session as before its Generate."""
        if self._lapsed(session):
            session.rollback()
            self._step(session, Cause.LAPSE)
            self._charge(session, session.held)

    # -- opening, using, closing ---------------------------------------------------

    def open(self, make: Callable[[str], S], tokens: int = 0, *, keep: S | None = None) -> S:
        """A new session of this tenant holding `tokens` (`make` builds it from its id),
        made room for by evicting the tenant's idle sessions other than `keep` (a fork's
        source)."""
        if self._refusal is not None:
            raise self._refusal()
        self.expire()
        table, tenant = self.table, self.tenant
        slots = _Need(
            len(table) + 1 - self.max_sessions, table.count(tenant) + 1 - self.quota.sessions
        )
        room = _Need(
            table.tokens + tokens - self.max_total_tokens,
            table.charged(tenant) + tokens - self.quota.tokens,
        )
        self._evict(slots, room, keep)
        session = make(secrets.token_hex(12))
        session.tenant = tenant
        session.last_used = self._clock()
        table.add(session)
        self._charge(session, tokens)
        return session

    def use(self, session_id: str) -> S:
        """This tenant's session with its content, now the most recently used;
        NOT_FOUND once it is gone, or if it is another tenant's. A lapsed claim on it is
        lapsed first."""
        self.expire()
        session = self.table.get(session_id)
        if session is None or session.tenant != self.tenant:
            raise _not_found(session_id)
        self._settle(session)
        self._touch(session)
        return session

    def close(self, session_id: str) -> None:
        """Idempotent; cancels the session's running Generate (`cancelled`). Another
        tenant's session is left as it is, as an unknown one."""
        session = self.table.lifetime(session_id)
        if session is None or session.tenant != self.tenant:
            return
        claim = session.claim
        self._step(session, Cause.CLOSE)
        if claim:
            self.cancelled.append(claim)

    def expire(self) -> list[str]:
        """Drop the idle sessions unused for longer than the TTL; their ids."""
        expired = [s for s in self.table.by_use(self._clock() - self.ttl_s) if self._idle(s)]
        for session in expired:
            self._gone(session, Cause.EXPIRE)
        return [session.session_id for session in expired]

    def _gone(self, session: S, cause: Cause) -> None:
        if session.phase is Phase.RUNNING:  # its claim lapsed: nothing runs any more
            self._step(session, Cause.LAPSE)
        self._step(session, cause)

    # -- running -------------------------------------------------------------------

    def begin(self, session: S, tokens: int, claim: str) -> None:
        """A Generate starts on the session under `claim`; the session is charged
        `tokens` while it runs (room made as for a new session's tokens)."""
        self.check(session, Cause.BEGIN)
        grown = tokens - session.charged
        room = _Need(
            self.table.tokens + grown - self.max_total_tokens,
            self.table.charged(session.tenant) + grown - self.quota.tokens,
        )
        self._evict(_Need(0, 0), room, session)
        session.held = session.charged
        self._step(session, Cause.BEGIN)
        self._charge(session, tokens)
        session.claim, session.lease = claim, self._clock() + self.lease_s

    def claimed(self, session_id: str, claim: str, *, content: bool = True) -> S | None:
        """The session `claim` still holds (with its content, or its lifetime only), even
        if the lease has run out unnoticed; None if the session has gone; ABORTED if it
        was taken back from the claim."""
        session = (self.table.get if content else self.table.lifetime)(session_id)
        if session is None:
            return None
        if session.phase is Phase.RUNNING and session.claim != claim:
            raise _claim_lost(session_id)
        self.check(session, Cause.END)
        return session

    def end(self, session: S, tokens: int) -> None:
        """The session's Generate is over (`session` from `claimed`); it holds `tokens`."""
        self._step(session, Cause.END)
        self._charge(session, tokens)
        self._touch(session)

    def renew(self, session_id: str, claim: str) -> bool:
        """Extend the lease of `claim`; False if its session has gone (closed: the
        Generate is to be cancelled)."""
        session = self.claimed(session_id, claim, content=False)
        if session is None:
            return False
        self._step(session, Cause.RENEW)
        session.lease = self._clock() + self.lease_s
        return True

    # -- room ----------------------------------------------------------------------

    def _evict(self, slots: _Need, room: _Need, keep: S | None) -> None:
        """Evict this tenant's idle sessions, least recently used first (never `keep`),
        until `slots` sessions and `room` tokens are free; all or nothing."""
        if slots.most <= 0 and room.most <= 0:
            return
        kept = None if keep is None else keep.session_id
        chosen: list[S] = []
        freed = 0
        for session in self.table.by_use(tenant=self.tenant):
            if len(chosen) >= slots.most and freed >= room.most:
                break
            if self._idle(session) and session.session_id != kept:
                chosen.append(session)
                freed += session.charged
        if len(chosen) < slots.most:
            raise ResourceExhausted(
                f"your sessions are at your quota of {self.quota.sessions}, each running a "
                "Generate; close some first"
                if slots.own > slots.server
                else f"too many sessions ({self.max_sessions}), each of yours running a "
                "Generate; close some first"
            )
        if freed < room.most:
            raise ResourceExhausted(
                f"your sessions would hold {room.own + self.quota.tokens} tokens, over your "
                f"quota of {self.quota.tokens}, even with every idle one evicted"
                if room.own > room.server
                else f"the server's sessions would hold {room.server + self.max_total_tokens} "
                f"tokens, over its limit of {self.max_total_tokens}, even with every idle "
                "session of yours evicted"
            )
        for index, session in enumerate(chosen):
            self._gone(session, Cause.EVICT)
            self.evicted[Eviction.CAP if index < slots.most else Eviction.TOKENS] += 1

    def _charge(self, session: S, tokens: int) -> None:
        self.table.charge(tokens - session.charged, session)
        session.charged = tokens
        self.table.changed(session)

    def _touch(self, session: S) -> None:
        session.last_used = self._clock()
        self.table.touch(session)


@dataclass(frozen=True, slots=True)
class _Need:
    """How much must be freed (sessions or tokens) for the server's bound and for the
    tenant's quota; `most`, the larger."""

    server: int
    own: int

    @property
    def most(self) -> int:
        return max(self.server, self.own, 0)


def _not_found(session_id: str) -> NotFound:
    return NotFound(f"session {session_id!r} not found (closed, expired or evicted)")


def _claim_lost(session_id: str) -> Aborted:
    return Aborted(
        f"the Generate lost session {session_id!r}: its server stopped renewing the call's "
        "lease, the session was put back as before the call, and its tokens are not kept"
    )
