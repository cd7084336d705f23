"""The Salience sessions' lifecycle (`app.protocols.salience.lifecycle`), on a fake clock.

The table itself: every (phase, cause) pair has an entry, and each is exercised through
the public calls that apply it, with its wire consequence. Then the rules of room: LRU
eviction order at the session cap, a running session never evicted (every session running:
RESOURCE_EXHAUSTED, nothing changed), the server-wide token bound (eviction, then a
refusal that evicts nobody, never the session being grown or a fork's source), the
charges of running calls, TTL expiry, draining; claims and leases (a claim ends only by
its holder, a lapsed one puts the session back, its late end is ABORTED); and random
operation streams that keep the invariants (the charged total is the sum of the charges,
the bounds hold, a running session goes only by CloseSession or a lapse).

How these fail if the behaviour breaks: evicting the most recently used session, or a
running one, changes the victim asserted by id; refusing at the cap instead of evicting
(the old rule) raises where a session is expected; evicting before knowing the room
suffices leaves fewer sessions than asserted after a refusal; a charge not released on
END or CLOSE breaks the token totals asserted after each step; a lapse that keeps the
call's append, or a stale claim that can still end the session, changes the tokens or
the phase asserted.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine.base import EngineInfo
from app.errors import Aborted, NotFound, Overloaded, ResourceExhausted, SwitchboardError
from app.protocols.salience.generate import GenerateCall
from app.protocols.salience.lifecycle import (
    LIFECYCLE,
    REFUSED,
    Cause,
    Eviction,
    Lifecycle,
    Lifetime,
    Phase,
)
from app.protocols.salience.sessions import Limits, SessionStore
from app.protocols.salience.tables import MemoryTable
from schemas import salience_pb2 as pb

P, C = Phase, Cause
TTL = 60.0
LEASE = 1000.0  # longer than the TTL: a claim lapses only where a test makes it


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def new(
    clock: Clock | None = None,
    *,
    max_sessions: int = 8,
    max_total_tokens: int = 1000,
    lease_s: float = LEASE,
) -> Lifecycle[Lifetime]:
    return Lifecycle(
        MemoryTable(),
        clock or Clock(),
        ttl_s=TTL,
        max_sessions=max_sessions,
        max_total_tokens=max_total_tokens,
        lease_s=lease_s,
    )


def ids(lifecycle: Lifecycle[Lifetime]) -> list[str]:
    """The sessions held, least recently used first."""
    return [s.session_id for s in lifecycle.table.by_use()]


def end(lifecycle: Lifecycle[Lifetime], session: Lifetime, claim: str, tokens: int) -> None:
    """The Generate of `claim` ends, its session holding `tokens`."""
    held = lifecycle.claimed(session.session_id, claim)
    if held is not None:
        lifecycle.end(held, tokens)


# -- the table ---------------------------------------------------------------------


def test_the_table_is_complete_and_refusals_change_nothing() -> None:
    assert set(LIFECYCLE) == {(phase, cause) for phase in Phase for cause in Cause}
    assert all(LIFECYCLE[key] is key[0] for key in REFUSED)


SHORT = 10.0  # the lease of the LAPSE entries: it runs out well within the TTL


def put_in(
    phase: Phase, clock: Clock, lease_s: float = LEASE
) -> tuple[Lifecycle[Lifetime], Lifetime]:
    """A lifecycle at its cap of one session, that session in `phase` (running under the
    claim "c1")."""
    lifecycle = new(clock, max_sessions=1, lease_s=lease_s)
    session = lifecycle.open(Lifetime, 10)
    if phase is P.RUNNING:
        lifecycle.begin(session, 15, "c1")
    if phase is P.GONE:
        lifecycle.close(session.session_id)
    assert session.phase is phase
    return lifecycle, session


def apply(
    cause: Cause, lifecycle: Lifecycle[Lifetime], session: Lifetime, clock: Clock
) -> SwitchboardError | None:
    """Apply `cause` through the calls that make it; the refusal, if any."""
    try:
        if cause is C.BEGIN:
            lifecycle.begin(session, 20, "c2")
        elif cause is C.END:
            end(lifecycle, session, "c1", 12)
        elif cause is C.CLOSE:
            lifecycle.close(session.session_id)
        elif cause is C.EXPIRE:
            clock.now += TTL + 1
            lifecycle.expire()
        elif cause is C.EVICT:  # a new session at the cap of one needs the session's place
            lifecycle.open(Lifetime)
        elif cause is C.RENEW:
            lifecycle.renew(session.session_id, "c1")
        elif lifecycle.table.get(session.session_id) is not None:  # LAPSE: found late
            clock.now += SHORT + 1
            lifecycle.use(session.session_id)
    except SwitchboardError as refused:
        return refused
    return None


@pytest.mark.parametrize("key", list(LIFECYCLE), ids=lambda k: f"{k[0].value}-{k[1].value}")
def test_entry(key: tuple[Phase, Cause]) -> None:
    phase, cause = key
    clock = Clock()
    lifecycle, session = put_in(phase, clock, SHORT if cause is C.LAPSE else LEASE)
    refused = apply(cause, lifecycle, session, clock)
    after = LIFECYCLE[key]
    assert session.phase is after
    # The wire consequences.
    if key in REFUSED:
        assert type(refused) is type(REFUSED[key](session.session_id))
    elif key == (P.RUNNING, C.EVICT):  # nobody else to evict: the cap refuses
        assert isinstance(refused, ResourceExhausted)
    else:
        assert refused is None
    if after is P.GONE:
        with pytest.raises(NotFound, match="closed, expired or evicted"):
            lifecycle.use(session.session_id)
    else:
        assert lifecycle.use(session.session_id) is session
    assert lifecycle.cancelled == (["c1"] if key == (P.RUNNING, C.CLOSE) else [])
    claim = {(P.IDLE, C.BEGIN): "c2"}.get(key, "c1" if after is P.RUNNING else "")
    assert session.claim == claim
    # Evictions are counted as such; expiry, close and a refused eviction are not.
    evicted = key == (P.IDLE, C.EVICT)
    assert lifecycle.evicted == ({Eviction.CAP: 1} if evicted else {})
    # The charge: held while running, none once gone, the tokens held before the call
    # once its claim lapses, and whatever the session that took the place holds.
    expected = {
        (P.IDLE, C.BEGIN): 20,
        (P.RUNNING, C.END): 12,
        (P.RUNNING, C.BEGIN): 15,
        (P.RUNNING, C.EXPIRE): 15,
        (P.RUNNING, C.EVICT): 15,
        (P.RUNNING, C.RENEW): 15,
    }.get(key, 0 if after is P.GONE else 10)
    assert lifecycle.tokens == expected == session.charged


def test_a_session_closed_while_running_is_released_at_once_and_its_end_finds_nothing() -> None:
    lifecycle = new()
    session = lifecycle.open(Lifetime, 5)
    lifecycle.begin(session, 50, "c")
    lifecycle.close(session.session_id)
    assert len(lifecycle) == 0 and lifecycle.tokens == 0 and lifecycle.cancelled == ["c"]
    assert lifecycle.claimed(session.session_id, "c") is None  # the call was cancelled
    assert lifecycle.renew(session.session_id, "c") is False  # ... wherever it runs


# -- the session cap ---------------------------------------------------------------


def test_at_the_cap_the_least_recently_used_idle_session_is_evicted() -> None:
    clock = Clock()
    lifecycle = new(clock, max_sessions=3)
    a, b, c = (lifecycle.open(Lifetime) for _ in range(3))
    clock.now += 1
    lifecycle.use(a.session_id)  # a is now the most recently used: b is the least
    d = lifecycle.open(Lifetime)
    assert b.phase is P.GONE and ids(lifecycle) == [c.session_id, a.session_id, d.session_id]
    lifecycle.begin(c, 1, "c")  # c runs: it is passed over, a goes
    e = lifecycle.open(Lifetime)
    assert a.phase is P.GONE and ids(lifecycle) == [c.session_id, d.session_id, e.session_id]
    end(lifecycle, c, "c", 1)  # the end of a Generate is a use: c moves to the back
    lifecycle.open(Lifetime)
    assert d.phase is P.GONE and lifecycle.evicted == {Eviction.CAP: 3}


def test_a_running_session_is_never_evicted_and_when_all_run_the_cap_refuses() -> None:
    lifecycle = new(max_sessions=2)
    sessions = [lifecycle.open(Lifetime) for _ in range(2)]
    for session in sessions:
        lifecycle.begin(session, 1, session.session_id)
    with pytest.raises(ResourceExhausted, match=r"too many sessions \(2\)"):
        lifecycle.open(Lifetime)
    assert [s.phase for s in sessions] == [P.RUNNING, P.RUNNING] and len(lifecycle) == 2
    assert lifecycle.evicted == {}


def test_expired_sessions_make_room_before_anyone_is_evicted() -> None:
    clock = Clock()
    lifecycle = new(clock, max_sessions=2)
    old = lifecycle.open(Lifetime)
    clock.now += TTL / 2
    recent = lifecycle.open(Lifetime)
    clock.now += TTL / 2 + 1
    lifecycle.open(Lifetime)
    assert old.phase is P.GONE and recent.phase is P.IDLE and lifecycle.evicted == {}


# -- the token bound ---------------------------------------------------------------


def test_the_token_bound_evicts_idle_sessions_least_recently_used_first() -> None:
    lifecycle = new(max_total_tokens=100)
    a, b, c = (lifecycle.open(Lifetime, 30) for _ in range(3))
    # c grows from 30 to 65: the total would be 125; evicting a (30) leaves 95.
    lifecycle.begin(c, 65, "c")
    assert (a.phase, b.phase) == (P.GONE, P.IDLE) and lifecycle.tokens == 95
    assert lifecycle.evicted == {Eviction.TOKENS: 1}
    # A new session of 40 tokens: b (30) is not enough room... and c runs: refused,
    # and b is still there.
    with pytest.raises(ResourceExhausted, match="limit of 100"):
        lifecycle.open(Lifetime, 40)
    assert b.phase is P.IDLE and lifecycle.tokens == 95
    end(lifecycle, c, "c", 40)  # the call decoded less than it reserved
    assert lifecycle.tokens == 70


def test_the_session_being_grown_and_a_forks_source_are_never_its_victims() -> None:
    lifecycle = new(max_total_tokens=100)
    source = lifecycle.open(Lifetime, 60)
    with pytest.raises(ResourceExhausted):
        lifecycle.begin(source, 101, "c")  # only itself to evict
    with pytest.raises(ResourceExhausted):
        lifecycle.open(Lifetime, 60, keep=source)  # a fork of it
    assert (source.phase, lifecycle.evicted) == (P.IDLE, {})
    other = lifecycle.open(Lifetime, 30)
    lifecycle.open(Lifetime, 60, keep=other)  # source goes, other stays
    assert source.phase is P.GONE and other.phase is P.IDLE


def test_a_new_session_at_the_cap_and_over_the_bound_names_each_eviction() -> None:
    lifecycle = new(max_sessions=2, max_total_tokens=100)
    a, b = lifecycle.open(Lifetime, 50), lifecycle.open(Lifetime, 50)
    lifecycle.open(Lifetime, 80)
    assert a.phase is b.phase is P.GONE
    assert lifecycle.evicted == {Eviction.CAP: 1, Eviction.TOKENS: 1}


# -- TTL and drain -----------------------------------------------------------------


def test_ttl_expiry_spares_running_sessions_and_each_use_restarts_it() -> None:
    clock = Clock()
    lifecycle = new(clock)
    idle, running, used = (lifecycle.open(Lifetime) for _ in range(3))
    lifecycle.begin(running, 1, "c")
    clock.now += TTL - 1
    lifecycle.use(used.session_id)
    clock.now += 2
    assert lifecycle.expire() == [idle.session_id]
    assert running.phase is P.RUNNING and used.phase is P.IDLE


def test_draining_refuses_new_sessions_and_keeps_the_others() -> None:
    table: MemoryTable[Lifetime] = MemoryTable()
    session = Lifecycle(table, Clock(), ttl_s=TTL, max_sessions=8, max_total_tokens=100).open(
        Lifetime
    )
    lifecycle = Lifecycle(
        table,
        Clock(),
        ttl_s=TTL,
        max_sessions=8,
        max_total_tokens=100,
        refusal=lambda: Overloaded("shutting down", retry_after_s=1),
    )
    with pytest.raises(Overloaded, match="shutting down"):
        lifecycle.open(Lifetime)
    assert lifecycle.use(session.session_id) is session
    lifecycle.begin(session, 1, "c")
    end(lifecycle, session, "c", 1)
    lifecycle.close(session.session_id)
    assert len(lifecycle) == 0


# -- claims and leases -------------------------------------------------------------


def test_only_its_claim_ends_or_renews_a_running_session() -> None:
    lifecycle = new()
    session = lifecycle.open(Lifetime, 5)
    lifecycle.begin(session, 20, "mine")
    with pytest.raises(Aborted, match="lost session"):
        lifecycle.claimed(session.session_id, "another")
    with pytest.raises(Aborted, match="lost session"):
        lifecycle.renew(session.session_id, "another")
    assert session.phase is P.RUNNING and session.claim == "mine"
    end(lifecycle, session, "mine", 7)
    assert (session.phase, session.claim, lifecycle.tokens) == (P.IDLE, "", 7)


def test_a_lapsed_claim_frees_the_session_as_it_was_and_its_late_end_is_aborted() -> None:
    clock = Clock()
    lifecycle = new(clock, lease_s=10)
    session = lifecycle.open(Lifetime, 5)
    lifecycle.begin(session, 20, "dead")
    clock.now += 9
    with pytest.raises(Aborted, match="busy"):  # its lease still holds
        lifecycle.begin(lifecycle.use(session.session_id), 20, "next")
    clock.now += 2  # ... and now it has run out: the next call finds the session free
    assert lifecycle.use(session.session_id).phase is P.IDLE
    assert (session.claim, lifecycle.tokens) == ("", 5)  # charged what it held before
    lifecycle.begin(session, 30, "next")
    with pytest.raises(Aborted, match="lost session"):  # the dead owner comes back
        end(lifecycle, session, "dead", 99)
    assert session.claim == "next" and lifecycle.tokens == 30


def test_a_lapsed_claim_nobody_took_back_still_ends_and_renews() -> None:
    clock = Clock()
    lifecycle = new(clock, lease_s=10)
    session = lifecycle.open(Lifetime, 5)
    lifecycle.begin(session, 20, "slow")
    clock.now += 11  # its server stalled past the lease, and nobody noticed
    assert lifecycle.renew(session.session_id, "slow")
    assert session.lease == clock.now + 10
    clock.now += 11
    end(lifecycle, session, "slow", 8)
    assert session.phase is P.IDLE and lifecycle.tokens == 8


def test_renewing_keeps_a_claim_past_its_first_lease() -> None:
    clock = Clock()
    lifecycle = new(clock, lease_s=10)
    session = lifecycle.open(Lifetime)
    lifecycle.begin(session, 1, "c")
    for _ in range(5):
        clock.now += 5
        assert lifecycle.renew(session.session_id, "c")
    with pytest.raises(Aborted, match="busy"):
        lifecycle.begin(lifecycle.use(session.session_id), 1, "other")


def test_a_session_whose_claim_lapsed_may_expire_or_be_evicted() -> None:
    clock = Clock()
    lifecycle = new(clock, max_sessions=2, lease_s=10)
    dead, running = lifecycle.open(Lifetime, 5), lifecycle.open(Lifetime, 5)
    lifecycle.begin(dead, 20, "dead")
    lifecycle.begin(running, 20, "alive")
    clock.now += 11
    lifecycle.renew(running.session_id, "alive")
    lifecycle.open(Lifetime)  # at the cap: the lapsed one is the idle one
    assert dead.phase is P.GONE and running.phase is P.RUNNING
    assert lifecycle.evicted == {Eviction.CAP: 1} and lifecycle.tokens == 20
    lifecycle = new(clock, lease_s=10)
    dead = lifecycle.open(Lifetime, 5)
    lifecycle.begin(dead, 20, "dead")
    clock.now += TTL + 1
    assert lifecycle.expire() == [dead.session_id] and lifecycle.tokens == 0


# -- random operation streams ------------------------------------------------------

Op = tuple[str, int, int]
OPS = st.tuples(
    st.sampled_from(["open", "fork", "begin", "end", "close", "use", "tick", "renew"]),
    st.integers(0, 7),  # which session (by index among those made)
    st.integers(0, 60),  # tokens, or seconds for tick
)


def _operate(lifecycle: Lifecycle[Lifetime], made: list[Lifetime], clock: Clock, op: Op) -> None:
    name, index, amount = op
    if name == "open":
        made.append(lifecycle.open(Lifetime, amount))
    elif name == "tick":
        clock.now += amount
        lifecycle.expire()
    elif made:
        target = made[index % len(made)]
        if name == "fork":
            made.append(lifecycle.open(Lifetime, amount, keep=target))
        elif name == "begin":
            lifecycle.begin(target, amount, f"claim-{index}-{amount}")
        elif name == "end" and target.claim:
            end(lifecycle, target, target.claim, min(amount, target.charged))
        elif name == "renew" and target.claim:
            lifecycle.renew(target.session_id, target.claim)
        elif name == "close":
            lifecycle.close(target.session_id)
        elif name == "use":
            lifecycle.use(target.session_id)


@given(st.lists(OPS, max_size=40))
def test_random_operation_streams_keep_the_invariants(ops: list[Op]) -> None:
    clock = Clock()
    lifecycle = new(clock, max_sessions=4, max_total_tokens=150, lease_s=45)
    made: list[Lifetime] = []
    for op in ops:
        was_running = [(s, s.lease) for s in made if s.phase is P.RUNNING and s.lease > clock.now]
        before = (len(lifecycle), lifecycle.tokens, dict(lifecycle.evicted))
        try:
            _operate(lifecycle, made, clock, op)
        except (ResourceExhausted, Aborted, NotFound):
            # A refusal changes nothing (all or nothing).
            assert (len(lifecycle), lifecycle.tokens, dict(lifecycle.evicted)) == before
        held = [s for s in made if s.phase is not P.GONE]
        assert lifecycle.tokens == sum(s.charged for s in held) <= 150
        assert len(lifecycle) == len(held) <= 4
        # A running session goes only by CloseSession (or, its lease run out, by a
        # lapse), never by expiry or eviction while its claim holds.
        for session, lease in was_running:
            assert session.phase is not P.GONE or op[0] in ("close", "tick")
            if session.phase is P.GONE and op[0] == "tick":
                assert lease <= clock.now
        # Least recently used first is oldest use first: what expiry relies on.
        used = [s.last_used for s in lifecycle.table.by_use()]
        assert used == sorted(used)


# -- through the store: a Generate's charge, and a lapse's content --------------------

INFO = EngineInfo("m", "/m", 64, 100, (0,), False, 0)


def test_a_generate_refused_by_the_context_evicts_nobody() -> None:
    """The shared prompt-fit check runs before the call is charged: a call refused for
    the context must not have evicted other sessions to make room for itself."""
    store = SessionStore("m", Limits(max_model_len=64, max_total_tokens=40), lambda: 0.0)
    idle = store.open("m")
    call = GenerateCall(
        store, pb.GenerateRequest(session_id=idle.session_id, append_tokens=[1] * 30), INFO, "r"
    )
    call.end(store)
    grown = store.open("m").session_id
    too_long = pb.GenerateRequest(session_id=grown, append_tokens=[1] * 30, max_tokens=40)
    with pytest.raises(SwitchboardError, match="context"):
        GenerateCall(store, too_long, INFO, "r")
    assert (idle.phase, store.lifecycle.evicted) == (P.IDLE, {})
    fits = pb.GenerateRequest(session_id=grown, append_tokens=[1] * 20, max_tokens=1)
    call = GenerateCall(store, fits, INFO, "r", claim="c")  # 30 + 21 > 40: idle goes
    assert idle.phase is P.GONE and store.lifecycle.tokens == 21
    call.end(store)
    assert store.lifecycle.tokens == 20


def test_a_lapsed_generate_leaves_the_session_as_before_it() -> None:
    clock = Clock()
    store = SessionStore("m", Limits(max_model_len=64, lease_s=10), clock)
    sid = store.open("m").session_id
    first = GenerateCall(
        store, pb.GenerateRequest(session_id=sid, append_tokens=[1, 2, 3]), INFO, "r"
    )
    first.end(store)
    # A truncating Generate whose server dies after decoding two tokens.
    request = pb.GenerateRequest(
        session_id=sid, offset=1, truncating=True, append_tokens=[7], max_tokens=5
    )
    dead = GenerateCall(store, request, INFO, "r", claim="dead")
    dead.decoded.extend([8, 9])
    assert store.get(sid).tokens.tolist() == [1, 7]  # the append, applied at once
    clock.now += 11
    session = store.get(sid)
    assert session.tokens.tolist() == [1, 2, 3] and not session.busy
    assert store.lifecycle.tokens == 3
    with pytest.raises(Aborted):
        dead.end(store)
    assert store.get(sid).tokens.tolist() == [1, 2, 3]
