"""Salience as the tests speak it over a websocket: the JSON envelopes (`gen`, `dump`), a
minimal client (`JsonClient`: one call at a time), and the calls several test modules
make with it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

READ_TIMEOUT_S = 120  # one frame of a live server


def gen(call_id: str, **request: Any) -> dict[str, Any]:
    """A Generate envelope."""
    return {"id": call_id, "method": "Generate", "request": request}


def dump(call_id: str, session: str) -> dict[str, Any]:
    """A DumpSession envelope."""
    return {"id": call_id, "method": "DumpSession", "request": {"sessionId": session}}


class JsonClient:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.n = 0

    async def call(self, method: str, request: dict[str, Any]) -> dict[str, Any]:
        self.n += 1
        call_id = f"c{self.n}"
        await self.ws.send(json.dumps({"id": call_id, "method": method, "request": request}))
        reply: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.recv(), READ_TIMEOUT_S))
        assert reply["id"] == call_id
        return reply

    async def generate(self, request: dict[str, Any], call_id: str = "") -> list[dict[str, Any]]:
        self.n += 1
        call_id = call_id or f"g{self.n}"
        await self.ws.send(json.dumps({"id": call_id, "method": "Generate", "request": request}))
        events = []
        while True:
            reply = json.loads(await asyncio.wait_for(self.ws.recv(), READ_TIMEOUT_S))
            assert reply["id"] == call_id
            if "error" in reply:
                return [reply]
            events.append(reply["event"])
            if "done" in reply["event"]:
                return events


def tokens_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["token"] for e in events if "token" in e]


async def open_session(client: JsonClient, model: str) -> str:
    reply = await client.call("OpenSession", {"model": model})
    return str(reply["response"]["sessionId"])


async def run(
    client: JsonClient, session: str, offset: int, append: list[int], images: list[Any], **kw: Any
) -> list[dict[str, Any]]:
    """A greedy (top_k 1) Generate on `session`: its events, or [the error reply]."""
    request = {
        "sessionId": session,
        "offset": offset,
        "appendTokens": append,
        "images": images,
        "topK": 1,
        **kw,
    }
    return await client.generate(request)


def decoded(events: list[dict[str, Any]]) -> list[int]:
    """The ids a Generate decoded (its prompt's tokens left out)."""
    assert "error" not in events[0], events[0]
    return [t.get("id", 0) for t in tokens_of(events) if not t.get("isPrefill")]


def scored(events: list[dict[str, Any]]) -> list[float]:
    """The prompt's sampled logprobs (over its logprobs ranges)."""
    return [t["sampledLogprob"] for t in tokens_of(events) if t.get("isPrefill")]


async def open_and_generate(
    ws: Any, model: str, call_id: str, tokens: list[int], max_tokens: int
) -> None:
    """Open a session on `ws` and start a Generate `call_id` on it; its events are left
    for the caller to read."""
    opening = {"id": "o" + call_id, "method": "OpenSession", "request": {"model": model}}
    await ws.send(json.dumps(opening))
    opened = json.loads(await asyncio.wait_for(ws.recv(), READ_TIMEOUT_S))
    session = opened["response"]["sessionId"]
    request = {"sessionId": session, "appendTokens": tokens, "offset": 0, "maxTokens": max_tokens}
    await ws.send(json.dumps({"id": call_id, "method": "Generate", "request": request}))


# -- sessions across replicas: the fleet's scenario, on any three targets ----------------

# Greedy decoding of these ids on the tiny model runs on without EOS (tests/e2e's counts
# rely on it), so every Generate below decodes exactly its max_tokens.
ENDLESS = [5, 6, 7]


async def _ws(url: str, method: str, request: dict[str, Any]) -> dict[str, Any]:
    """One call on a socket of its own (a client that reconnects lands anywhere)."""
    import websockets

    async with websockets.connect(url) as ws:
        return await JsonClient(ws).call(method, request)


async def _ws_generate(url: str, request: dict[str, Any]) -> list[dict[str, Any]]:
    import websockets

    async with websockets.connect(url) as ws:
        events = await JsonClient(ws).generate({"topK": 1, **request})
    assert "error" not in events[0], events[0]
    return events


async def _ws_dump(url: str, session: str) -> list[int]:
    reply = await _ws(url, "DumpSession", {"sessionId": session})
    return list(reply["response"].get("tokens", []))


async def sessions_across_replicas_ws(urls: list[str], model: str) -> None:
    """The scenario over websockets; `urls` are three socket URLs (`ws://.../salience/ws`,
    each a replica, or one proxy three times): a session opened at the first is generated
    in at the second and forked at the third; the fork is grown at the first and read at
    the second, the session read at the third; closed at the second, it is gone at the
    first. Every call is made on a new socket."""
    first, second, third = urls
    opened = await _ws(first, "OpenSession", {"model": model})
    session = opened["response"]["sessionId"]
    events = await _ws_generate(
        second, {"sessionId": session, "appendTokens": ENDLESS, "maxTokens": 4}
    )
    assert events[-1]["done"]["totalTokens"] == 7
    tokens = ENDLESS + decoded(events)
    assert await _ws_dump(third, session) == tokens
    forked = await _ws(third, "ForkSession", {"sessionId": session, "atPosition": 5})
    child = forked["response"]["sessionId"]
    grow = {"sessionId": child, "offset": 5, "appendTokens": [9], "maxTokens": 2}
    events = await _ws_generate(first, grow)
    assert await _ws_dump(second, child) == [*tokens[:5], 9, *decoded(events)]
    assert await _ws_dump(third, session) == tokens  # the fork's source is untouched
    await _ws(second, "CloseSession", {"sessionId": session})
    gone = await _ws(first, "DumpSession", {"sessionId": session})
    assert gone["error"]["code"] == "NOT_FOUND", gone
    await _ws(third, "CloseSession", {"sessionId": child})


async def sessions_across_replicas_grpc(targets: list[str], model: str) -> None:
    """The same scenario over native gRPC; `targets` are three `host:port`s, each call on
    a channel of its own."""
    import grpc

    from schemas import salience_pb2 as pb
    from schemas import salience_pb2_grpc as salience_grpc

    async def call(target: str, method: str, request: Any) -> Any:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = salience_grpc.SalienceStub(channel)
            if method == "Generate":
                return [event async for event in stub.Generate(request, timeout=READ_TIMEOUT_S)]
            return await getattr(stub, method)(request, timeout=READ_TIMEOUT_S)

    async def generate(target: str, **fields: Any) -> list[int]:
        events = await call(target, "Generate", pb.GenerateRequest(top_k=1, **fields))
        assert events[-1].HasField("done"), events[-1]
        return [e.token.id for e in events if e.HasField("token") and not e.token.is_prefill]

    async def dump(target: str, session: str) -> list[int]:
        return list(
            (await call(target, "DumpSession", pb.DumpSessionRequest(session_id=session))).tokens
        )

    first, second, third = targets
    session = (await call(first, "OpenSession", pb.OpenSessionRequest(model=model))).session_id
    made = await generate(second, session_id=session, append_tokens=ENDLESS, max_tokens=4)
    tokens = ENDLESS + made
    assert len(made) == 4 and await dump(third, session) == tokens
    forking = pb.ForkSessionRequest(session_id=session, at_position=5)
    child = (await call(third, "ForkSession", forking)).session_id
    grown = await generate(first, session_id=child, offset=5, append_tokens=[9], max_tokens=2)
    assert await dump(second, child) == [*tokens[:5], 9, *grown]
    assert await dump(third, session) == tokens
    await call(second, "CloseSession", pb.CloseSessionRequest(session_id=session))
    try:
        await dump(first, session)
    except grpc.aio.AioRpcError as gone:
        assert gone.code() == grpc.StatusCode.NOT_FOUND, gone
    else:
        raise AssertionError("a closed session was still there on another replica")
    await call(third, "CloseSession", pb.CloseSessionRequest(session_id=child))


async def busy_across_replicas(
    running_url: str, other_target: str, model: str, max_tokens: int
) -> None:
    """A Generate running at one replica (on a socket at `running_url`) makes its session
    busy at another (over gRPC at `other_target`: ABORTED); a CloseSession made there
    ends it: the stream ends with Done CANCELLED, before its `max_tokens` (which the
    caller makes last seconds: the close reaches the Generate within a lease's fifth)."""
    import grpc
    import websockets

    from schemas import salience_pb2 as pb
    from schemas import salience_pb2_grpc as salience_grpc

    async with (
        websockets.connect(running_url) as ws,
        grpc.aio.insecure_channel(other_target) as channel,
    ):
        stub = salience_grpc.SalienceStub(channel)
        client = JsonClient(ws)
        session = await open_session(client, model)
        request = {
            "sessionId": session,
            "appendTokens": ENDLESS,
            "maxTokens": max_tokens,
            "topK": 1,
        }
        await ws.send(json.dumps(gen("long", **request)))
        first = json.loads(await asyncio.wait_for(ws.recv(), READ_TIMEOUT_S))
        assert "token" in first["event"], first
        try:
            again = pb.GenerateRequest(session_id=session, offset=3, max_tokens=1)
            await stub.Generate(again, timeout=READ_TIMEOUT_S).read()
        except grpc.aio.AioRpcError as busy:
            assert busy.code() == grpc.StatusCode.ABORTED, busy
            assert "session busy" in (busy.details() or "")
        else:
            raise AssertionError("a session running a Generate elsewhere was not busy")
        await stub.CloseSession(pb.CloseSessionRequest(session_id=session), timeout=READ_TIMEOUT_S)
        while "done" not in (
            event := json.loads(await asyncio.wait_for(ws.recv(), READ_TIMEOUT_S))["event"]
        ):
            pass
        assert event["done"]["finishReason"] == "FINISH_REASON_CANCELLED", event
        assert event["done"]["completionTokens"] < max_tokens
