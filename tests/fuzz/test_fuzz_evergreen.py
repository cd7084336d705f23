"""Fuzz `/evergreen/ws` on the live server (real vLLM), binary and JSON frames: each input is
one session whose first frame is a seeded mutation of a valid `SessionMessage` (protobuf
wire-format mutations in binary, JSON tree mutations in text), hostile leaves or garbage.

A session only ends when a rule breaks, so every input is followed by a sentinel frame
that can never parse: the session must then end the one way the protocol allows, with
output fragments (if the input asked for a generation) then a final `ABORT` message whose
config is a Struct `{code, message}`, then a close with code 4000 + that status code.
Anything else fails: a frame that is not a `SessionMessage` in the session's encoding, a
close without the ABORT or with another code, an INTERNAL/UNKNOWN/DATA_LOSS status (our
bug: the 5xx of a socket), a reset, or no end at all.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import websockets
from google.protobuf import json_format

from schemas import evergreen_service_pb2 as service_pb
from tests.conftest import LiveServer
from tests.fuzz.corpus import binary_input, json_input, rng
from tests.fuzz.evergreen import SEEDS, evergreen_abort
from tests.fuzz.harness import run_corpus, socket_probe, verdict

pytestmark = pytest.mark.e2e

# gRPC status codes by name; these three are the server's own failure, never the client's.
STATUS = {
    name: code
    for code, name in enumerate(
        (
            *("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED"),
            *("NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED"),
            *("FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL"),
            *("UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"),
        )
    )
}
SERVER_FAULTS = {"UNKNOWN", "INTERNAL", "DATA_LOSS"}


def make_input(index: int) -> tuple[bool, bytes | str]:
    """(binary, the first frame) of input `index`: half the corpus in each encoding."""
    r = rng("evergreen", index)
    seed = r.choice(SEEDS)
    if index % 2:
        return True, binary_input(seed.SerializeToString(), r)
    as_json = json_format.MessageToDict(seed)
    return False, json_input(as_json, r).decode("utf-8", "replace")


def _parse(frame: Any, binary: bool) -> service_pb.SessionMessage:
    if isinstance(frame, bytes) is not binary:
        raise ValueError(
            f"a {type(frame).__name__} frame in a {'binary' if binary else 'JSON'} session"
        )
    if binary:
        return service_pb.SessionMessage.FromString(frame)
    return json_format.Parse(frame, service_pb.SessionMessage())


async def session(url: str, binary: bool, frame: bytes | str) -> str | None:
    """Why this session did not end in Evergreen's shape, or None."""
    sentinel: bytes | str = b"\xff" if binary else "}"
    seen: list[str] = []
    async with websockets.connect(url, max_size=None, open_timeout=30) as ws:
        try:
            await ws.send(frame)
            await ws.send(sentinel)
        except websockets.ConnectionClosed:
            pass  # the first frame already ended the session: its answer is read below
        last = None
        while True:
            try:
                received = await asyncio.wait_for(ws.recv(), timeout=30)
            except websockets.ConnectionClosed as closed:
                close = closed.rcvd
                break
            except TimeoutError:
                return f"no end 30 s after the sentinel; frames: {seen[-3:]}"
            try:
                last = _parse(received, binary)
            except Exception as exc:
                return f"not a SessionMessage ({exc!r}): {received!r:.300}"
            seen.append(str(last)[:200])
    if close is None:
        return f"closed without a close frame (a reset); frames: {seen[-3:]}"
    abort = evergreen_abort(last) if last is not None else None
    code = abort[0] if abort is not None else None
    if code is None:
        return f"close {close.code} {close.reason!r} without an ABORT last; frames: {seen[-3:]}"
    if code in SERVER_FAULTS or code not in STATUS:
        return f"ABORT {code}, close {close.code} {close.reason!r}; frames: {seen[-2:]}"
    if close.code != 4000 + STATUS[code]:
        return f"ABORT {code} but close code {close.code} {close.reason!r}"
    return None


async def test_evergreen_corpus(live_server: LiveServer) -> None:
    url = f"{live_server.ws_url}/evergreen/ws"

    async def one(index: int) -> tuple[Any, str | None]:
        binary, frame = make_input(index)
        return frame, await session(url, binary, frame)

    offences = await run_corpus(socket_probe(one))
    verdict(live_server, "Evergreen", offences)


def test_corpus_is_seeded_in_both_encodings() -> None:
    assert make_input(7) == make_input(7)
    kinds = {type(make_input(i)[1]) for i in range(10)}
    assert kinds == {bytes, str}
