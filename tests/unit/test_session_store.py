"""Salience sessions on their stores (`app.store.sessions`): the same rules kept in this
process (`MemorySessions`) and in a real redis-server that replicas share
(`RedisSessions`, started here on a free loopback port), driven through the session layer
(`SalienceRunner`) on the fake engine, as the transports drive it.

Both stores: open, Generate, fork, dump and close; drift and the busy rule; the session
cap and the token bound, least recently used first; TTL on a fake clock; a failed call
rolled back; calls racing for the last places keep the bounds exact. Redis only: replicas
(runners with a store each, on one Redis) serving one session in turns; a Generate on one
replica making the session busy on another, and a CloseSession on the other cancelling
it; an owner that vanished mid-Generate (its lease lapses: the session is as it was, its
late end is ABORTED); images decoded on the replica that needs them; the store touched
per call, never per token; an unreachable store failing the call UNAVAILABLE.

How these fail when the store is wrong: a session one replica wrote is NOT_FOUND or
stale on the other; two Generates run on one session; a session stays busy after its
owner vanished, or keeps the dead call's append; the totals (`n`, `total`) drift from
the records after concurrent calls; a Generate writes the store per token.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from app.admission import Admission
from app.engine.base import DecodedImage, GenerationRequest, VisionInfo
from app.errors import (
    Aborted,
    EngineError,
    FailedPrecondition,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from app.protocols.salience.lifecycle import Eviction
from app.protocols.salience.sessions import Limits
from app.sessions.salience import SalienceRunner
from app.store.redis_sessions import RedisSessions
from app.store.sessions import MemorySessions, SessionBackend
from app.tenants import DEFAULT_TENANT, Principal
from schemas import salience_pb2 as pb
from tests.fake_engine import FakeEngine
from tests.principals import ANYONE, caller
from tests.redis_server import keys, redis_server, sorted_set
from tests.waits import until

TTL = 60.0
Finish = pb.GenerateDone.FinishReason


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Fleet:
    """Replicas on one store (each `replica()` its own runner, and with Redis its own
    client), on one fake clock; closed at the end of the test."""

    kind: str
    url: str
    clock: Clock = dataclasses.field(default_factory=Clock)
    runners: list[SalienceRunner] = dataclasses.field(default_factory=list)
    _memory: MemorySessions | None = None

    def ticks(self, n: int) -> Iterator[int]:
        """`range(n)`, the clock a second later at each step (calls made at the same
        instant are in no order: a shared store orders ties by session id)."""
        for i in range(n):
            self.clock.now += 1
            yield i

    def store(self, lease_s: float = 5.0) -> SessionBackend:
        if self.kind == "redis":
            return RedisSessions(
                self.url, ttl_s=TTL, lease_s=lease_s, vision=None, clock=self.clock
            )
        if self._memory is None:
            self._memory = MemorySessions(self.clock)
        return self._memory

    def replica(
        self, engine: FakeEngine | None = None, *, lease_s: float = 5.0, **limits: Any
    ) -> SalienceRunner:
        engine = engine or FakeEngine(step_delay=0.002)
        store = self.store(lease_s)
        if engine.info.vision is not None and isinstance(store, RedisSessions):
            store = RedisSessions(
                self.url, ttl_s=TTL, lease_s=lease_s, vision=engine.info.vision, clock=self.clock
            )
        bounds = Limits(
            max_model_len=engine.info.max_model_len,
            ttl_s=TTL,
            lease_s=store.lease_s,
            max_images=4,
            **limits,
        )
        runner = SalienceRunner(engine, Admission(None, None), store, bounds)
        self.runners.append(runner)
        return runner


@pytest.fixture(params=["memory", "redis"])
async def fleet(request: pytest.FixtureRequest) -> AsyncIterator[Fleet]:
    url = ""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        redis.Redis.from_url(url).flushdb()
    fleet = Fleet(request.param, url)
    yield fleet
    for runner in fleet.runners:
        await runner.close()


@pytest.fixture
async def redis_fleet(redis_url: str) -> AsyncIterator[Fleet]:
    redis.Redis.from_url(redis_url).flushdb()
    fleet = Fleet("redis", redis_url)
    yield fleet
    for runner in fleet.runners:
        await runner.close()


async def open_session(runner: SalienceRunner, who: Principal = ANYONE) -> str:
    opened = await runner.unary("OpenSession", pb.OpenSessionRequest(model="fake"), who)
    assert isinstance(opened, pb.OpenSessionResponse)
    return str(opened.session_id)


async def dump(runner: SalienceRunner, sid: str, who: Principal = ANYONE) -> list[int]:
    dumped = await runner.unary("DumpSession", pb.DumpSessionRequest(session_id=sid), who)
    assert isinstance(dumped, pb.DumpSessionResponse)
    return list(dumped.tokens)


async def fork(runner: SalienceRunner, sid: str, at: int, who: Principal = ANYONE) -> str:
    forked = await runner.unary(
        "ForkSession", pb.ForkSessionRequest(session_id=sid, at_position=at), who
    )
    assert isinstance(forked, pb.ForkSessionResponse)
    return str(forked.session_id)


async def close(runner: SalienceRunner, sid: str, who: Principal = ANYONE) -> None:
    await runner.unary("CloseSession", pb.CloseSessionRequest(session_id=sid), who)


def request(sid: str, offset: int, append: list[int], max_tokens: int = 2, **fields: Any) -> Any:
    return pb.GenerateRequest(
        session_id=sid, offset=offset, append_tokens=append, max_tokens=max_tokens, **fields
    )


async def generate(
    runner: SalienceRunner, call: pb.GenerateRequest, who: Principal = ANYONE
) -> list[pb.GenerateEvent]:
    """A whole Generate; its events (the last one Done)."""
    events: list[pb.GenerateEvent] = []

    async def emit(event: pb.GenerateEvent) -> None:
        events.append(event)

    await runner.run_generate(await runner.start_generate(call, who), emit)
    return events


def running(
    runner: SalienceRunner, call: pb.GenerateRequest, who: Principal = ANYONE
) -> tuple[asyncio.Task[None], list[pb.GenerateEvent]]:
    """A Generate started in a task; its task and the events it has streamed so far."""
    events: list[pb.GenerateEvent] = []

    async def emit(event: pb.GenerateEvent) -> None:
        events.append(event)

    async def run() -> None:
        await runner.run_generate(await runner.start_generate(call, who), emit)

    return asyncio.create_task(run()), events


def done(events: list[pb.GenerateEvent]) -> pb.GenerateDone:
    assert events and events[-1].HasField("done"), events
    return events[-1].done


# -- both stores -----------------------------------------------------------------------


async def test_open_generate_fork_dump_close(fleet: Fleet) -> None:
    runner = fleet.replica()
    sid = await open_session(runner)
    assert done(await generate(runner, request(sid, 0, [1, 2, 3]))).total_tokens == 5
    assert await dump(runner, sid) == [1, 2, 3, 4, 5]
    child = await fork(runner, sid, 3)
    assert await dump(runner, child) == [1, 2, 3]
    # A truncating call rewinds first; the fork is a session of its own.
    await generate(runner, request(sid, 1, [9], max_tokens=1, truncating=True))
    assert await dump(runner, sid) == [1, 9, 10]
    assert await dump(runner, child) == [1, 2, 3]
    await close(runner, sid)
    await close(runner, sid)  # idempotent
    with pytest.raises(NotFound, match="closed, expired or evicted"):
        await dump(runner, sid)
    assert await runner.stats() == (1, 3)


async def test_drift_is_refused_and_a_running_session_is_busy(fleet: Fleet) -> None:
    runner = fleet.replica()
    sid = await open_session(runner)
    await generate(runner, request(sid, 0, [1], max_tokens=0))
    with pytest.raises(FailedPrecondition, match="does not match the session's length 1"):
        await runner.start_generate(request(sid, 0, [2]), ANYONE)
    task, events = running(runner, request(sid, 1, [2], max_tokens=200))
    await until(lambda: len(events) >= 2, "the Generate to stream")
    with pytest.raises(Aborted, match="session busy"):
        await runner.start_generate(request(sid, 1, [3]), ANYONE)
    await task
    assert done(events).total_tokens == 202
    await generate(runner, request(sid, 202, [3], max_tokens=1))  # free again
    assert len(await dump(runner, sid)) == 204


async def test_the_cap_evicts_the_least_recently_used_idle_session(fleet: Fleet) -> None:
    runner = fleet.replica(max_sessions=3)
    a, b, c = [await open_session(runner) for _ in fleet.ticks(3)]
    await dump(runner, a)  # a is now the most recently used: b is the least
    d = await open_session(runner)
    with pytest.raises(NotFound):
        await dump(runner, b)
    task, events = running(runner, request(c, 0, [1], max_tokens=400))
    await until(lambda: bool(events), "c to run")
    fleet.clock.now += 1
    await dump(runner, d)
    await open_session(runner)  # c runs and d was used: a goes
    with pytest.raises(NotFound):
        await dump(runner, a)
    assert runner.evicted == {Eviction.CAP: 2}
    await close(runner, c)
    await task
    assert done(events).finish_reason == Finish.FINISH_REASON_CANCELLED


async def test_the_token_bound_evicts_idle_sessions_then_refuses(fleet: Fleet) -> None:
    runner = fleet.replica(max_total_tokens=100)
    old, new = await open_session(runner), await open_session(runner)
    await generate(runner, request(old, 0, [1] * 40, max_tokens=0))
    fleet.clock.now += 1
    await generate(runner, request(new, 0, [1] * 40, max_tokens=0))
    assert await runner.stats() == (2, 80)
    # 40 + 50 + 1 more for the new session: the old one makes room.
    await generate(runner, request(new, 40, [1] * 50, max_tokens=1))
    with pytest.raises(NotFound):
        await dump(runner, old)
    assert runner.evicted == {Eviction.TOKENS: 1} and await runner.stats() == (1, 91)
    with pytest.raises(ResourceExhausted, match="limit of 100"):
        await runner.start_generate(request(new, 91, [1] * 20), ANYONE)
    assert await runner.stats() == (1, 91) and len(await dump(runner, new)) == 91


async def test_idle_sessions_expire_and_a_use_restarts_the_ttl(fleet: Fleet) -> None:
    runner = fleet.replica()
    idle, used = await open_session(runner), await open_session(runner)
    fleet.clock.now += TTL - 1
    await dump(runner, used)
    fleet.clock.now += 2
    with pytest.raises(NotFound):
        await dump(runner, idle)
    assert await dump(runner, used) == [] and await runner.stats() == (1, 0)


async def test_a_failed_generate_leaves_the_session_as_before(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeEngine()

    async def broken(request: GenerationRequest) -> Any:
        raise EngineError("the engine failed")
        yield  # pragma: no cover

    runner = fleet.replica(engine)
    sid = await open_session(runner)
    await generate(runner, request(sid, 0, [1, 2, 3], max_tokens=1))
    monkeypatch.setattr(engine, "generate", broken)
    with pytest.raises(EngineError):
        await generate(runner, request(sid, 1, [7, 8], truncating=True))
    assert await dump(runner, sid) == [1, 2, 3, 4]
    assert await runner.stats() == (1, 4)


async def test_a_call_cancelled_from_outside_keeps_what_was_decoded(fleet: Fleet) -> None:
    runner = fleet.replica()
    sid = await open_session(runner)
    task, events = running(runner, request(sid, 0, [1, 2], max_tokens=400))
    await until(lambda: len(events) >= 3, "three tokens")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    tokens = await dump(runner, sid)
    assert tokens[:5] == [1, 2, 3, 4, 5] and len(tokens) < 402
    await generate(runner, request(sid, len(tokens), [], max_tokens=1))  # not busy


async def test_calls_racing_for_the_last_places_keep_the_bounds_exact(fleet: Fleet) -> None:
    replicas = [fleet.replica(max_sessions=5, max_total_tokens=60) for _ in range(3)]
    sessions = [await open_session(replicas[0]) for _ in range(3)]

    async def churn(index: int) -> None:
        runner = replicas[index % 3]
        for turn in range(4):
            try:
                sid = await open_session(runner)
                await generate(runner, request(sid, 0, [1] * (index + turn + 1), max_tokens=2))
                await dump(runner, sessions[turn % 3])
            except (NotFound, ResourceExhausted, Aborted):
                pass  # evicted by another, or no room: the bounds at work

    await asyncio.gather(*(churn(i) for i in range(9)))
    held, charged = await replicas[0].stats()
    assert held <= 5 and charged <= 60
    if fleet.kind == "redis":
        client = redis.Redis.from_url(fleet.url)
        prefix = "switchboard:salience:"
        ids = set(sorted_set(client, prefix + "lru"))
        records = {k.removeprefix(prefix + "s:") for k in keys(client, prefix + "s:*")}
        assert ids == records and len(ids) == held
        lengths = [client.strlen(prefix + "t:" + i) // 4 for i in ids]
        assert sum(lengths) == charged  # every session idle: charged what it holds


# -- tenants ---------------------------------------------------------------------------

ACME, BETA = caller("acme", sessions=2, session_tokens=100), caller("beta", sessions=2)
TWO = caller("acme", sessions=2)


async def test_another_tenants_session_is_not_found_on_every_call(fleet: Fleet) -> None:
    runner = fleet.replica()
    sid = await open_session(runner, ACME)
    await generate(runner, request(sid, 0, [1, 2, 3]), ACME)
    unknown = "0" * 24
    for who in (BETA, ANYONE):
        answers = []
        for session_id in (sid, unknown):
            for call in (
                dump(runner, session_id, who),
                fork(runner, session_id, 1, who),
                generate(runner, request(session_id, 5, [4]), who),
            ):
                with pytest.raises(NotFound) as missing:
                    await call
                answers.append(missing.value.message.replace(session_id, "<id>"))
        assert len(set(answers)) == 1, answers  # the same answer as an id never opened
        await close(runner, sid, who)  # as for an unknown id: nothing, and nothing said
    assert len(await dump(runner, sid, ACME)) == 5


async def test_a_tenant_at_its_session_quota_evicts_only_its_own(fleet: Fleet) -> None:
    runner = fleet.replica(max_sessions=10)  # room for more: the quota is the bound
    theirs = await open_session(runner, BETA)
    mine = [await open_session(runner, TWO) for _ in fleet.ticks(2)]
    for _ in fleet.ticks(6):  # each past the quota of 2 evicts acme's least recently used
        mine.append(await open_session(runner, TWO))
        with pytest.raises(NotFound):
            await dump(runner, mine[-3], TWO)
    assert await dump(runner, theirs, BETA) == []
    assert runner.evicted == {Eviction.CAP: 6}
    # Every one of acme's sessions running: refused, and beta's untouched.
    tasks = [running(runner, request(sid, 0, [1], max_tokens=400), TWO) for sid in mine[-2:]]
    await until(lambda: all(events for _, events in tasks), "both to run")
    with pytest.raises(ResourceExhausted, match="quota of 2"):
        await open_session(runner, TWO)
    assert await dump(runner, theirs, BETA) == []
    for sid in mine[-2:]:
        await close(runner, sid, TWO)
    for task, _ in tasks:
        await task


async def test_a_tenant_at_its_token_quota_evicts_only_its_own(fleet: Fleet) -> None:
    runner = fleet.replica(max_total_tokens=1000)
    theirs = await open_session(runner, BETA)
    await generate(runner, request(theirs, 0, [1] * 80, max_tokens=0), BETA)
    old, new = await open_session(runner, ACME), await open_session(runner, ACME)
    await generate(runner, request(old, 0, [1] * 40, max_tokens=0), ACME)
    fleet.clock.now += 1
    await generate(runner, request(new, 0, [1] * 40, max_tokens=0), ACME)
    # 40 + 50 + 1 of acme's quota of 100, with its other 40 held: its old session goes.
    await generate(runner, request(new, 40, [1] * 50, max_tokens=1), ACME)
    with pytest.raises(NotFound):
        await dump(runner, old, ACME)
    assert runner.evicted == {Eviction.TOKENS: 1}
    with pytest.raises(ResourceExhausted, match="quota of 100"):
        await runner.start_generate(request(new, 91, [1] * 20), ACME)
    assert len(await dump(runner, theirs, BETA)) == 80
    assert await runner.stats() == (2, 80 + 91)


async def test_at_the_servers_bound_a_tenant_evicts_nothing_of_anothers(fleet: Fleet) -> None:
    # Quotas that together exceed the server's bound (the operator's choice): the server's
    # bound then refuses a tenant with nothing of its own to evict.
    greedy = caller("acme", sessions=3)
    runner = fleet.replica(max_sessions=3)
    theirs = [await open_session(runner, BETA) for _ in fleet.ticks(2)]
    first = await open_session(runner, greedy)
    fleet.clock.now += 1
    second = await open_session(runner, greedy)  # at the server's cap: acme's own goes
    with pytest.raises(NotFound):
        await dump(runner, first, greedy)
    task, events = running(runner, request(second, 0, [1], max_tokens=400), greedy)
    await until(lambda: bool(events), "acme's session to run")
    with pytest.raises(ResourceExhausted, match=r"too many sessions \(3\)"):
        await open_session(runner, greedy)
    for sid in theirs:
        assert await dump(runner, sid, BETA) == []
    await close(runner, second, greedy)
    await task


async def test_tenants_racing_keep_their_own_bounds(fleet: Fleet) -> None:
    replicas = [fleet.replica(max_sessions=8, max_total_tokens=200) for _ in range(3)]
    tenants = [caller(name, sessions=3, session_tokens=60) for name in ("a", "b")]

    async def churn(index: int) -> None:
        runner, who = replicas[index % 3], tenants[index % 2]
        for turn in range(4):
            try:
                sid = await open_session(runner, who)
                await generate(runner, request(sid, 0, [1] * (index + turn + 1)), who)
            except (NotFound, ResourceExhausted, Aborted):
                pass  # evicted by its own tenant, or no room: the bounds at work

    await asyncio.gather(*(churn(i) for i in range(8)))
    held, charged = await replicas[0].stats()
    assert held <= 6 and charged <= 120
    if fleet.kind == "redis":
        client = redis.Redis.from_url(fleet.url)
        prefix = "switchboard:salience:"
        for who in tenants:
            ids = set(sorted_set(client, prefix + "lru:" + who.tenant))
            records = {
                k.removeprefix(prefix + "s:")
                for k in keys(client, prefix + "s:*")
                if client.hget(k, "tenant") == who.tenant.encode()
            }
            assert ids == records and 0 < len(ids) <= 3
            assert int(client.get(prefix + "n:" + who.tenant) or 0) == len(ids)
            lengths = [client.strlen(prefix + "t:" + i) // 4 for i in ids]
            assert int(client.get(prefix + "total:" + who.tenant) or 0) == sum(lengths) <= 60


# -- replicas on one Redis ----------------------------------------------------------


async def test_any_replica_serves_any_call_of_a_session(redis_fleet: Fleet) -> None:
    a, b = redis_fleet.replica(), redis_fleet.replica()
    sid = await open_session(a)
    await generate(b, request(sid, 0, [1, 2, 3], max_tokens=2))
    child = await fork(a, sid, 4)
    assert await dump(b, child) == [1, 2, 3, 4]
    await generate(a, request(sid, 5, [9], max_tokens=1))
    assert await dump(b, sid) == [1, 2, 3, 4, 5, 9, 10]
    await close(b, sid)
    with pytest.raises(NotFound):
        await dump(a, sid)
    assert await a.stats() == await b.stats() == (1, 4)  # the store's, fleet-wide


async def test_a_generate_on_one_replica_makes_the_session_busy_on_every_other(
    redis_fleet: Fleet,
) -> None:
    engine = FakeEngine(max_model_len=8192, step_delay=0.002)
    a, b = redis_fleet.replica(engine, lease_s=0.5), redis_fleet.replica(lease_s=0.5)
    sid = await open_session(a)
    task, events = running(a, request(sid, 0, [1], max_tokens=5000))
    await until(lambda: len(events) >= 2, "A's Generate to stream")
    with pytest.raises(Aborted, match="session busy"):
        await b.start_generate(request(sid, 0, [1]), ANYONE)
    await asyncio.sleep(0.6)  # past one lease: A's keeper renews it
    with pytest.raises(Aborted, match="session busy"):
        await b.start_generate(request(sid, 0, [1]), ANYONE)
    # CloseSession on B: A learns it when it next renews (a fifth of the lease).
    await close(b, sid)
    await asyncio.wait_for(task, 5)
    assert done(events).finish_reason == Finish.FINISH_REASON_CANCELLED
    assert len(events) < 5000 and a.running(sid) is None


async def test_a_vanished_owner_leaves_the_session_as_it_was_once_its_lease_lapses(
    redis_fleet: Fleet,
) -> None:
    owner, other = redis_fleet.replica(lease_s=5), redis_fleet.replica(lease_s=5)
    sid = await open_session(owner)
    await generate(owner, request(sid, 0, [1, 2, 3], max_tokens=1))
    # The owner applies a truncating Generate, then vanishes before running it: no
    # renewal, no end (as a replica killed mid-call).
    generation = await owner.start_generate(
        request(sid, 2, [7], truncating=True, max_tokens=9), ANYONE
    )
    await owner.close()  # its keeper stops
    assert await dump(other, sid) == [1, 2, 7]  # the append, applied at once
    with pytest.raises(Aborted, match="session busy"):
        await other.start_generate(request(sid, 3, [8]), ANYONE)
    redis_fleet.clock.now += 5.1  # the lease runs out
    assert await dump(other, sid) == [1, 2, 3, 4]
    events = await generate(other, request(sid, 4, [8], max_tokens=1))
    assert done(events).total_tokens == 6
    # The owner comes back and ends its call: its claim is gone, its tokens are not kept.
    revived = redis_fleet.replica(lease_s=5)
    with pytest.raises(Aborted, match="lost session"):
        await revived._transact(generation.call.end, content=[sid])
    assert await dump(other, sid) == [1, 2, 3, 4, 8, 9]


async def test_a_generate_writes_the_store_at_its_start_and_end_only(redis_fleet: Fleet) -> None:
    runner = redis_fleet.replica(lease_s=60)  # no renewal within the call
    sid = await open_session(runner)
    client = redis.Redis.from_url(redis_fleet.url)

    def calls(command: str) -> int:
        stats = client.info("commandstats").get(f"cmdstat_{command}", {})
        return int(stats.get("calls", 0))

    before = {c: calls(c) for c in ("exec", "append", "hset", "set")}
    events = await generate(runner, request(sid, 0, [1, 2, 3], max_tokens=300))
    assert done(events).completion_tokens == 300
    after = {c: calls(c) for c in before}
    assert after["exec"] - before["exec"] == 2  # the start and the end
    assert after["append"] - before["append"] == 2  # the append, then the decoded tokens
    assert after["set"] == before["set"]  # never the whole token list
    assert len(await dump(runner, sid)) == 303


async def test_a_replica_reads_a_sessions_tokens_only_when_another_changed_them(
    redis_fleet: Fleet,
) -> None:
    engine = FakeEngine(max_model_len=40_000)
    a, b = redis_fleet.replica(engine, lease_s=60), redis_fleet.replica(engine, lease_s=60)
    client = redis.Redis.from_url(redis_fleet.url)

    def sent() -> int:  # bytes Redis has sent its clients so far
        return int(client.info("stats")["total_net_output_bytes"])

    sid = await open_session(a)
    await generate(a, request(sid, 0, [1] * 30_000, max_tokens=0))  # 120 KB of tokens
    before = sent()
    await generate(a, request(sid, 30_000, [2], max_tokens=4))
    assert sent() - before < 10_000  # A wrote them: it holds them
    before = sent()
    await generate(b, request(sid, 30_005, [3], max_tokens=4))
    assert 120_000 < sent() - before < 130_000  # B reads them once, not at its end too
    before = sent()
    tokens = await dump(a, sid)  # changed by B since A held them: read again
    assert len(tokens) == 30_010 and tokens[30_005:] == [3, 4, 5, 6, 7]
    assert 120_000 < sent() - before < 130_000
    before = sent()
    assert await dump(a, sid) == tokens
    assert sent() - before < 10_000


async def test_images_are_decoded_on_the_replica_that_needs_them(redis_fleet: Fleet) -> None:
    start, pad, end = 5, 7, 6
    decoded_on: list[str] = []

    def engine(name: str) -> FakeEngine:
        def read(data: bytes, mime: str, max_pixels: int | None = None) -> DecodedImage:
            decoded_on.append(name)
            return DecodedImage(pixels=(name, data), digest=data.hex(), pad_tokens=2)

        fake = FakeEngine(step_delay=0.001)
        vision = VisionInfo(start, pad, end, max_images=4, read_image=read)
        fake._info = dataclasses.replace(fake.info, vision=vision)
        return fake

    a_engine, b_engine = engine("a"), engine("b")
    a, b = redis_fleet.replica(a_engine), redis_fleet.replica(b_engine)
    sid = await open_session(a)
    image = pb.ImageAttachment(bytes=b"png!", mime="image/png", pad_range_start=1, pad_range_end=5)
    await generate(a, request(sid, 0, [1, start, pad, pad, end], max_tokens=1, images=[image]))
    assert decoded_on == ["a"]
    await generate(b, request(sid, 6, [2], max_tokens=1))
    await generate(b, request(sid, 8, [3], max_tokens=1))
    assert decoded_on == ["a", "b"]  # once on B, then from its cache
    sent = b_engine.requests[-1].images
    assert [(i.start, i.end, i.image.pixels) for i in sent] == [(1, 5, ("b", b"png!"))]
    # A fork carries the image; truncating to its block's start drops it.
    child = await fork(b, sid, 5)
    await generate(a, request(child, 5, [4], max_tokens=1))
    assert [i.image.digest for i in a_engine.requests[-1].images] == [b"png!".hex()]
    await generate(a, request(sid, 1, [4], max_tokens=1, truncating=True))
    assert a_engine.requests[-1].images == ()


async def test_sessions_stored_before_tenants_are_the_default_tenants(
    redis_fleet: Fleet,
) -> None:
    runner = redis_fleet.replica()
    client = redis.Redis.from_url(redis_fleet.url)
    prefix = "switchboard:salience:"
    old = await open_session(runner)
    await generate(runner, request(old, 0, [1, 2, 3], max_tokens=0))
    # As a release before tenants left it: no tenant on the record, in no tenant's order
    # or totals.
    client.hdel(prefix + "s:" + old, "tenant")
    client.delete(prefix + "lru:" + DEFAULT_TENANT, prefix + "n:" + DEFAULT_TENANT)
    client.delete(prefix + "total:" + DEFAULT_TENANT)
    with pytest.raises(NotFound):
        await dump(runner, old, ACME)
    await generate(runner, request(old, 3, [4], max_tokens=0))
    assert await dump(runner, old) == [1, 2, 3, 4]
    assert client.hget(prefix + "s:" + old, "tenant") is None  # still outside the totals
    new = await open_session(runner)
    assert sorted_set(client, prefix + "lru:" + DEFAULT_TENANT) == [new]
    await close(runner, old)
    assert await runner.stats() == (1, 0)
    assert client.get(prefix + "n:" + DEFAULT_TENANT) == b"1"
    assert int(client.get(prefix + "total:" + DEFAULT_TENANT) or 0) == 0


async def test_a_store_that_cannot_be_reached_fails_the_call_unavailable() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = RedisSessions(f"redis://127.0.0.1:{port}/0", ttl_s=TTL, lease_s=5, vision=None)
    engine = FakeEngine()
    runner = SalienceRunner(engine, Admission(None, None), store, Limits(max_model_len=512))
    try:
        with pytest.raises(Unavailable, match=r"session store is unavailable") as failed:
            await open_session(runner)
        assert failed.value.grpc_status == "UNAVAILABLE"
        # Where the store is goes to the log only (tests/unit/test_withheld.py).
        assert str(port) not in failed.value.message and failed.value.error_id
        # A call that needs no session still works.
        manifest = await runner.unary("GetReadoutManifest", pb.GetReadoutManifestRequest(), ANYONE)
        assert isinstance(manifest, pb.ReadoutManifest)
        assert runner.evicted == {}
    finally:
        await runner.close()


async def test_a_redis_out_of_memory_is_full(tmp_path: Path) -> None:
    """A Redis out of memory refuses the session store's writes as it refuses the response
    store's (`store_full`, RESOURCE_EXHAUSTED), in a pipeline and in a transaction."""
    with redis_server(tmp_path, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction") as url:
        store = RedisSessions(url, ttl_s=TTL, lease_s=5, vision=None)
        runner = SalienceRunner(
            FakeEngine(), Admission(None, None), store, Limits(max_model_len=512)
        )
        try:
            with pytest.raises(ResourceExhausted) as refused:
                for i in range(100):
                    image = DecodedImage(None, f"digest{i}", 4)
                    await store.keep_images([(image, "image/png", b"x" * 100_000)])
            assert refused.value.code == "store_full"
            with pytest.raises(ResourceExhausted) as opening:
                await open_session(runner)
            assert opening.value.code == "store_full"
            assert opening.value.grpc_status == "RESOURCE_EXHAUSTED"
        finally:
            await runner.close()
