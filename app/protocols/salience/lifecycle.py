"""The lifetime of Salience sessions: which exist, which run, and which go. Sans-IO.

h11's rule 1, kept: every rule that decides whether a session exists, runs or goes lives
here; the content rules (tokens, images, offsets: `sessions.py`), the service and the
transports only drive it. Time comes from an injected clock.

A session is in one phase; `LIFECYCLE[(phase, cause)]` says where each cause leads, and
every pair is in the table (a cause that changes nothing maps a phase to itself).
`REFUSED` names the pairs that are refused instead, the phase unchanged:

    IDLE     held, no Generate running. It expires after `ttl_s` unused, and it may be
             evicted, least recently used first, to make room for another session
    RUNNING  a Generate runs on it, on any transport: it never expires and is never
             evicted; a second Generate is ABORTED ("session busy")
    GONE     closed, expired or evicted: any call naming it is NOT_FOUND. The proto makes
             the client the source of truth for the tokens, so its owner re-opens the
             session and sends them again

On the wire: closing a RUNNING session cancels its Generate, whichever transport runs it
(the stream ends with Done CANCELLED); the session's tokens count until that Generate ends.

Using a session (`use`: every call that names it) makes it the most recently used and
restarts its TTL; so does the end of its Generate. Sessions are kept least recently used
first, which is also oldest `last_used` first, so expiry and eviction read from the front.

Room, server-wide (what one careless client could otherwise take from every other):

- `max_sessions`: a new session (OpenSession, ForkSession) at the cap first drops what
  the TTL has expired, then evicts the least recently used IDLE session. Only when every
  session is RUNNING is it RESOURCE_EXHAUSTED.
- `max_total_tokens`: every session is charged what it holds, and while a Generate runs,
  what the call may still add (its `max_tokens`) and the tail it would put back on
  failure (what a truncating call cut). A session that would take more than the room
  left (a Generate's charge, a fork's inheritance) first evicts least recently used IDLE
  sessions, never itself (nor a fork's source); if those cannot free enough, it is
  RESOURCE_EXHAUSTED and nobody is evicted.

Evictions are counted by reason (`evicted`, for /metrics); expiries are not evictions.

Draining (`drain`): from then on no session is opened (the drain's refusal, UNAVAILABLE
with a retry hint); the sessions held stay usable until the server stops.
"""

from __future__ import annotations

import enum
import secrets
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from app.errors import Aborted, NotFound, ResourceExhausted, SwitchboardError

Clock = Callable[[], float]


class Phase(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    GONE = "gone"


class Cause(enum.Enum):
    BEGIN = "begin"  # a Generate is applied to the session
    END = "end"  # that Generate is over (done, failed or cancelled)
    CLOSE = "close"  # CloseSession
    EXPIRE = "expire"  # unused for longer than the TTL
    EVICT = "evict"  # chosen to make room for another session or its tokens


class Eviction(enum.Enum):
    """Why a session was evicted (the label of the eviction counter)."""

    CAP = "cap"  # the session cap: room for a new session
    TOKENS = "tokens"  # the server-wide token bound: room for another session's tokens


_P, _C = Phase, Cause
LIFECYCLE: Mapping[tuple[Phase, Cause], Phase] = {
    (_P.IDLE, _C.BEGIN): _P.RUNNING,
    (_P.IDLE, _C.END): _P.IDLE,  # nothing runs, nothing ends
    (_P.IDLE, _C.CLOSE): _P.GONE,
    (_P.IDLE, _C.EXPIRE): _P.GONE,
    (_P.IDLE, _C.EVICT): _P.GONE,
    (_P.RUNNING, _C.BEGIN): _P.RUNNING,  # refused: session busy
    (_P.RUNNING, _C.END): _P.IDLE,
    (_P.RUNNING, _C.CLOSE): _P.GONE,  # its Generate is cancelled
    (_P.RUNNING, _C.EXPIRE): _P.RUNNING,  # a running session never expires
    (_P.RUNNING, _C.EVICT): _P.RUNNING,  # nor is it evicted
    **{(_P.GONE, cause): _P.GONE for cause in Cause},  # (GONE, BEGIN) refused: not found
}
REFUSED: Mapping[tuple[Phase, Cause], Callable[[str], SwitchboardError]] = {
    (_P.RUNNING, _C.BEGIN): lambda _: Aborted("session busy: one Generate at a time per session"),
    (_P.GONE, _C.BEGIN): lambda session_id: _not_found(session_id),
}


class Running(Protocol):
    """The Generate running on a session, as far as its lifetime goes."""

    def cancel(self) -> None: ...


@dataclass(slots=True, eq=False)
class Lifetime:
    """A session's lifetime fields; changed only by `Lifecycle`."""

    session_id: str
    phase: Phase = Phase.IDLE
    last_used: float = 0.0
    charged: int = 0  # tokens counted against the server-wide bound
    running: Running | None = None

    @property
    def busy(self) -> bool:
        return self.phase is Phase.RUNNING


S = TypeVar("S", bound=Lifetime)


class Lifecycle(Generic[S]):
    """Every session of one server, least recently used first, and the rules above."""

    def __init__(
        self, clock: Clock, *, ttl_s: float, max_sessions: int, max_total_tokens: int
    ) -> None:
        self._clock = clock
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.max_total_tokens = max_total_tokens
        self._sessions: OrderedDict[str, S] = OrderedDict()
        # Charged tokens of every session, those closed while running included until
        # their Generate ends.
        self.tokens = 0
        self.evicted: Counter[Eviction] = Counter()
        self._refusal: Callable[[], SwitchboardError] | None = None

    def __len__(self) -> int:
        return len(self._sessions)

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
        if session.phase is Phase.GONE and before is not Phase.GONE:
            self._sessions.pop(session.session_id, None)
            if before is Phase.IDLE:  # a running one is charged until its Generate ends
                self._charge(session, 0)
        return before

    # -- opening, using, closing ---------------------------------------------------

    def open(self, make: Callable[[str], S], tokens: int = 0, *, keep: S | None = None) -> S:
        """A new session holding `tokens` (`make` builds it from its id), made room for
        by evicting idle sessions other than `keep` (a fork's source)."""
        if self._refusal is not None:
            raise self._refusal()
        self.expire()
        slots = max(0, len(self._sessions) + 1 - self.max_sessions)
        self._evict(slots, self.tokens + tokens - self.max_total_tokens, keep)
        session = make(secrets.token_hex(12))
        session.last_used = self._clock()
        self._sessions[session.session_id] = session
        self._charge(session, tokens)
        return session

    def use(self, session_id: str) -> S:
        """The session, now the most recently used; NOT_FOUND once it is gone."""
        self.expire()
        session = self._sessions.get(session_id)
        if session is None:
            raise _not_found(session_id)
        self._touch(session)
        return session

    def running(self, session_id: str) -> Running | None:
        session = self._sessions.get(session_id)
        return None if session is None else session.running

    def close(self, session_id: str) -> None:
        """Idempotent; cancels the session's running Generate."""
        session = self._sessions.get(session_id)
        if session is None:
            return
        running = session.running
        self._step(session, Cause.CLOSE)
        if running is not None:
            running.cancel()

    def expire(self) -> list[str]:
        """Drop the idle sessions unused for longer than the TTL; their ids."""
        deadline = self._clock() - self.ttl_s
        expired = []
        for session in self._sessions.values():
            if session.last_used >= deadline:
                break  # the rest were used later
            if session.phase is Phase.IDLE:
                expired.append(session)
        for session in expired:
            self._step(session, Cause.EXPIRE)
        return [session.session_id for session in expired]

    # -- running -------------------------------------------------------------------

    def begin(self, session: S, tokens: int, running: Running | None = None) -> None:
        """A Generate starts on the session, which is charged `tokens` while it runs
        (room made as for a new session's tokens)."""
        self.check(session, Cause.BEGIN)
        self._evict(0, self.tokens - session.charged + tokens - self.max_total_tokens, session)
        self._step(session, Cause.BEGIN)
        self._charge(session, tokens)
        session.running = running

    def end(self, session: S, tokens: int) -> None:
        """The session's Generate is over; the session holds `tokens` now."""
        session.running = None
        before = self._step(session, Cause.END)
        if session.phase is Phase.GONE:  # closed while it ran: its charge goes now
            self._charge(session, 0)
            return
        if before is Phase.RUNNING:
            self._charge(session, tokens)
        self._touch(session)

    # -- draining ------------------------------------------------------------------

    def drain(self, refusal: Callable[[], SwitchboardError]) -> None:
        """Open no session from now on; `refusal()` is what the client is told."""
        self._refusal = refusal

    # -- room ----------------------------------------------------------------------

    def _evict(self, slots: int, tokens: int, keep: S | None) -> None:
        """Evict idle sessions, least recently used first (never `keep`), until `slots`
        sessions and `tokens` tokens are free; all or nothing."""
        if slots <= 0 and tokens <= 0:
            return
        chosen: list[S] = []
        freed = 0
        for session in self._sessions.values():
            if len(chosen) >= slots and freed >= tokens:
                break
            if session.phase is Phase.IDLE and session is not keep:
                chosen.append(session)
                freed += session.charged
        if len(chosen) < slots:
            raise ResourceExhausted(
                f"too many sessions ({self.max_sessions}), each running a Generate; "
                "close some first"
            )
        if freed < tokens:
            raise ResourceExhausted(
                f"the server's sessions would hold {tokens + self.max_total_tokens} tokens, "
                f"over its limit of {self.max_total_tokens}, even with every idle session "
                "evicted"
            )
        for index, session in enumerate(chosen):
            self._step(session, Cause.EVICT)
            self.evicted[Eviction.CAP if index < slots else Eviction.TOKENS] += 1

    def _charge(self, session: S, tokens: int) -> None:
        self.tokens += tokens - session.charged
        session.charged = tokens

    def _touch(self, session: S) -> None:
        session.last_used = self._clock()
        self._sessions.move_to_end(session.session_id)


def _not_found(session_id: str) -> NotFound:
    return NotFound(f"session {session_id!r} not found (closed, expired or evicted)")
