"""Running a corpus against the live server, and the verdict every fuzz test gives.

`run_corpus` sends every input of a protocol, a few at a time (a busy server is part of
what is tested), and collects the inputs whose answer left the protocol's shape. `verdict`
then also asks that the server still answers `/health` and that the engine has no request
left, and fails with the first offending inputs (seed index, input, answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from google.protobuf import json_format, struct_pb2

from schemas import evergreen_service_pb2 as service_pb
from tests.fuzz.corpus import INPUTS_PER_PROTOCOL, Offence, describe

CONCURRENCY = 6

# One input: its seed index in, None if its answer had the shape, else what went wrong.
Probe = Callable[[int], Awaitable[Offence | None]]


async def run_corpus(probe: Probe, total: int = INPUTS_PER_PROTOCOL) -> list[Offence]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(index: int) -> Offence | None:
        async with gate:
            try:
                return await asyncio.wait_for(probe(index), timeout=90)
            except Exception as exc:  # the harness must name the input, whatever happened
                return Offence(index, "(see the seed index)", f"probe failed: {exc!r}")

    results = await asyncio.gather(*(one(i) for i in range(total)))
    return [r for r in results if r is not None]


def verdict(live: Any, protocol: str, offences: list[Offence], total: int) -> None:
    """Fail with the first offending inputs, or if the server is not left healthy and idle."""
    problems = []
    health = httpx.get(f"{live.base_url}/health", timeout=30)
    if health.status_code != 200:
        problems.append(f"/health answers {health.status_code} {health.text[:200]!r}")
    left = live.wait_idle()
    if left:
        problems.append(f"{left} engine request(s) still running after the corpus")
    if offences or problems:
        raise AssertionError("\n".join([describe(offences, protocol, total), *problems]))


def evergreen_abort(message: service_pb.SessionMessage) -> tuple[str, str] | None:
    """(code, message) of the Evergreen ABORT that `message` is, or None if it is not
    one (over the websocket and gRPC alike)."""
    if len(message.actions) != 1 or message.actions[0].name != "ABORT":
        return None
    status = struct_pb2.Struct()
    if len(message.actions[0].configs) != 1 or not message.actions[0].configs[0].Unpack(status):
        return None
    fields = json_format.MessageToDict(status)
    code, text = fields.get("code"), fields.get("message")
    return (code, text) if isinstance(code, str) and isinstance(text, str) else None
