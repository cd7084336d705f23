"""Fuzz `/salience/ws` on the live server (real vLLM), binary and JSON frames: each input is
one socket with one open session, then one seeded frame (a mutation of a valid call on that
session: protobuf wire-format mutations in binary, JSON tree mutations in text, hostile
leaves, garbage), then a sentinel `CloseSession` of the session.

Every frame the server sends must be a `ServerFrame` in the socket's encoding (JSON:
`{"id", "response" | "event" | "error"}`), an error's code a status name that is not the
server's own failure (INTERNAL, UNKNOWN, DATA_LOSS), and the socket must stay usable: the
sentinel is answered. Sessions a fuzzed call opened or forked are closed afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
import websockets
from google.protobuf import json_format

from schemas import salience_ws_pb2 as ws_pb
from tests.conftest import LiveServer
from tests.fuzz.corpus import (
    binary_input,
    json_input,
    rng,
)
from tests.fuzz.harness import run_corpus, socket_probe, verdict

pytestmark = pytest.mark.e2e

CODES = {
    "NOT_FOUND",
    "FAILED_PRECONDITION",
    "RESOURCE_EXHAUSTED",
    "ABORTED",
    "INVALID_ARGUMENT",
    "UNAUTHENTICATED",
    "UNAVAILABLE",
    "CANCELLED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "PERMISSION_DENIED",
    "ALREADY_EXISTS",
    "DEADLINE_EXCEEDED",
}  # every gRPC status but OK and the server's own failures (INTERNAL, UNKNOWN, DATA_LOSS)
REPLIES = ("response", "event", "error")
FUZZ_ID = "f1"


def seeds(session: str) -> list[dict[str, Any]]:
    """Valid calls on `session`, as JSON envelopes."""
    image = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()
    generate = {"sessionId": session, "appendTokens": [1, 2, 3], "offset": 0, "maxTokens": 4}
    calls: list[tuple[str, dict[str, Any]]] = [
        ("Generate", {**generate, "topK": 1}),
        (
            "Generate",
            {
                **generate,
                "maxTokens": 3,
                "logprobsRanges": [{"start": 0, "end": 3}],
                "logprobTopK": 2,
                "readoutRanges": [{"start": 1, "end": 3}],
                "temperature": 0.5,
                "topP": 0.9,
                "stopTokenIds": [5],
                "priority": 0,
            },
        ),
        (
            "Generate",
            {
                **generate,
                "images": [
                    {"bytes": image, "mime": "image/png", "padRangeStart": 0, "padRangeEnd": 2}
                ],
            },
        ),
        ("ForkSession", {"sessionId": session, "atPosition": 0}),
        ("DumpSession", {"sessionId": session}),
        ("GetReadoutManifest", {}),
        ("CloseSession", {"sessionId": session}),
        ("OpenSession", {"model": "tiny"}),
    ]
    envelopes = [{"id": FUZZ_ID, "method": m, "request": r} for m, r in calls]
    return [*envelopes, {"id": FUZZ_ID, "cancel": True}]


FIELD = {
    "Generate": "generate",
    "ForkSession": "forkSession",
    "DumpSession": "dumpSession",
    "GetReadoutManifest": "getReadoutManifest",
    "CloseSession": "closeSession",
    "OpenSession": "openSession",
}


def as_client_frame(envelope: dict[str, Any]) -> bytes:
    """The binary form of a JSON envelope."""
    if "cancel" in envelope:
        frame = {"id": envelope["id"], "cancel": True}
    else:
        frame = {"id": envelope["id"], FIELD[envelope["method"]]: envelope["request"]}
    return bytes(json_format.ParseDict(frame, ws_pb.ClientFrame()).SerializeToString())


def make_input(index: int, session: str) -> tuple[bool, bytes | str]:
    """(binary, the fuzzed frame) of input `index` on `session`."""
    r = rng("salience", index)
    seed = r.choice(seeds(session))
    if index % 2:
        return True, binary_input(as_client_frame(seed), r)
    return False, json_input(seed, r).decode("utf-8", "replace")


def _call(binary: bool, call_id: str, method: str, request: dict[str, Any]) -> bytes | str:
    envelope = {"id": call_id, "method": method, "request": request}
    return as_client_frame(envelope) if binary else json.dumps(envelope)


def read_frame(frame: Any, binary: bool) -> tuple[str, str, Any]:
    """(id, reply kind, reply) of a server frame; ValueError if it is not in the shape."""
    if isinstance(frame, bytes) is not binary:
        raise ValueError(
            f"a {type(frame).__name__} frame on a {'binary' if binary else 'JSON'} socket"
        )
    if binary:
        message = ws_pb.ServerFrame.FromString(frame)
        kind = message.WhichOneof("reply")
        if kind is None:
            raise ValueError("a ServerFrame without a reply")
        reply = json_format.MessageToDict(getattr(message, kind))
        kind = {"event": "event", "error": "error"}.get(kind, "response")
        return message.id, kind, reply
    body = json.loads(frame)
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
        raise ValueError("not {'id': str, ...}")
    kinds = [k for k in REPLIES if k in body]
    if len(kinds) != 1 or len(body) != 2 or not isinstance(body[kinds[0]], dict):
        raise ValueError("not exactly one of response, event, error")
    return body["id"], kinds[0], body[kinds[0]]


def check_error(reply: dict[str, Any]) -> None:
    if reply.get("code") not in CODES or not isinstance(reply.get("message", ""), str):
        raise ValueError(f"error {reply.get('code')!r}: not a client's status")


async def socket_session(url: str, index: int) -> tuple[Any, str | None]:
    """(the input sent, why the answers left Salience's shape or None)."""
    binary = bool(index % 2)
    async with websockets.connect(url, max_size=None, open_timeout=30) as ws:

        async def receive() -> tuple[str, str, Any]:
            received = await asyncio.wait_for(ws.recv(), timeout=30)
            call_id, kind, reply = read_frame(received, binary)
            if kind == "error":
                check_error(reply)
            return call_id, kind, reply

        await ws.send(_call(binary, "open", "OpenSession", {"model": "tiny"}))
        call_id, kind, reply = await receive()
        if (call_id, kind) != ("open", "response"):
            return "(OpenSession)", f"OpenSession answered {kind} {reply}"
        session = reply["sessionId"]
        _, frame = make_input(index, session)
        opened: set[str] = set()
        try:
            await ws.send(frame)
            await ws.send(_call(binary, "sentinel", "CloseSession", {"sessionId": session}))
            while True:
                call_id, kind, reply = await receive()
                if kind == "response" and isinstance(reply.get("sessionId"), str):
                    opened.add(reply["sessionId"])  # a fuzzed OpenSession or ForkSession
                if call_id == "sentinel":
                    if kind != "response":
                        return frame, f"the sentinel CloseSession answered {kind} {reply}"
                    break
            for number, other in enumerate(sorted(opened - {session})):
                await ws.send(_call(binary, f"close{number}", "CloseSession", {"sessionId": other}))
            pending = {f"close{n}" for n in range(len(opened - {session}))}
            while pending:
                call_id, kind, _ = await receive()
                pending.discard(call_id)
        except (ValueError, json_format.ParseError) as exc:
            return frame, f"not Salience's shape: {exc}"
        except websockets.ConnectionClosed as closed:
            return frame, f"the socket closed: {closed!r}"
        except TimeoutError:
            return frame, "no answer to the sentinel within 30 s"
    return frame, None


async def test_salience_corpus(live_server: LiveServer) -> None:
    url = f"{live_server.ws_url}/salience/ws"

    offences = await run_corpus(socket_probe(lambda index: socket_session(url, index)))
    verdict(live_server, "Salience", offences)


def test_corpus_is_seeded_in_both_encodings() -> None:
    assert make_input(9, "s-1") == make_input(9, "s-1")
    assert {type(make_input(i, "s-1")[1]) for i in range(10)} == {bytes, str}
