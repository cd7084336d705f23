"""A session's life on any transport (`app.sessions.lifetime`), the piece every websocket
and gRPC adapter of a session protocol drives: the opening judges the caller, then the
drain; the drain's goodbye reaches a session being served and the drain waits for its
close; a closed session is never told. Fails if the opening skips a check or reorders
them, or if the drain could go on (and stop the engine) while a session it said goodbye
to still runs."""

from __future__ import annotations

import asyncio

import pytest

from app.admission import Admission
from app.drain import Drain
from app.errors import Overloaded, SwitchboardError, Unauthenticated
from app.sessions.lifetime import SessionLifetime
from app.tenants import DEFAULT_TENANT, Limits, Principal, Role
from tests.waits import until


def _caller() -> Principal:
    return Principal(DEFAULT_TENANT, Role.FULL, Limits(), DEFAULT_TENANT)


def _refused() -> Principal:
    raise Unauthenticated("Missing or invalid API key")


async def _no_engine_request(request_id: str) -> None:
    raise AssertionError(f"nothing runs, yet {request_id} was aborted")


def test_the_opening_judges_the_caller_then_the_drain() -> None:
    drain = Drain(Admission(None, None), timeout_s=0.0)
    lifetime = SessionLifetime(drain)
    assert lifetime.open(_caller) == _caller()
    drain.begin()
    with pytest.raises(Unauthenticated):  # who the caller is, first
        lifetime.open(_refused)
    with pytest.raises(Overloaded):
        lifetime.open(_caller)


async def test_the_drain_says_goodbye_and_waits_for_the_close() -> None:
    drain = Drain(Admission(None, None), timeout_s=0.0)
    lifetime = SessionLifetime(drain)
    told: list[SwitchboardError] = []
    release = asyncio.Event()

    async def goodbye(refusal: SwitchboardError) -> None:
        told.append(refusal)

    async def session() -> None:
        async with lifetime.serving(goodbye):
            await release.wait()  # the session winds down after its goodbye

    served = asyncio.create_task(session())
    await asyncio.sleep(0)
    draining = asyncio.create_task(drain.run(_no_engine_request))
    await until(lambda: bool(told), "the goodbye said")
    assert isinstance(told[0], Overloaded)
    await asyncio.sleep(0.05)
    assert not draining.done()  # the session is still open
    release.set()
    await asyncio.wait_for(draining, 5)
    await served


async def test_a_closed_session_is_not_told() -> None:
    drain = Drain(Admission(None, None), timeout_s=0.0)
    lifetime = SessionLifetime(drain)
    told: list[SwitchboardError] = []

    async def goodbye(refusal: SwitchboardError) -> None:
        told.append(refusal)

    async with lifetime.serving(goodbye):
        pass
    await asyncio.wait_for(drain.run(_no_engine_request), 5)
    assert told == []
