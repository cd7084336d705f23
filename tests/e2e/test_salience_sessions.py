"""Salience's session bounds against real clients on the live engine: a client that
abandons sessions no longer locks the others out, the session running a Generate is never
the one evicted, the server-wide token bound evicts idle sessions, and /metrics counts it.

Each test runs its own small app (a low session cap, a low token bound) on the live
server's engine and event loop (`create_app(settings, engine=...)`), over real sockets:
uvicorn for the websocket and /metrics, the app's own gRPC server.

How they fail if the behaviour breaks: with the old rule (refuse at the cap), the other
client's OpenSession is RESOURCE_EXHAUSTED; an eviction that ignores running sessions (or
picks the most recently used) makes the running session's Generate end in an error, or
its DumpSession NOT_FOUND, or leaves the abandoned session alive; without the counter,
/metrics lacks the line or keeps it at 0.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
import websockets

from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from tests.conftest import LiveServer, free_port
from tests.salience_client import JsonClient

pytestmark = pytest.mark.e2e


@dataclass
class Small:
    base_url: str
    ws_url: str
    grpc_target: str
    model: str

    def evicted(self, reason: str) -> float:
        """`switchboard_sessions_evicted_total{protocol="salience",reason=...}` now."""
        body = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        name = "switchboard_sessions_evicted_total"
        pattern = rf'^{name}\{{protocol="salience",reason="{reason}"\}} (\S+)$'
        found = re.search(pattern, body, re.MULTILINE)
        assert found is not None, "no eviction counter on /metrics"
        return float(found.group(1))


@contextmanager
def small_server(live: LiveServer, **limits: Any) -> Iterator[Small]:
    """An app with `limits` on the live engine, served on the live server's loop."""
    settings = live.app.state.settings.model_copy(
        update={"port": free_port(), "grpc_port": free_port(), **limits}
    )
    with live.another_app(settings):
        yield Small(
            f"http://127.0.0.1:{settings.port}",
            f"ws://127.0.0.1:{settings.port}",
            f"127.0.0.1:{settings.grpc_port}",
            live.model,
        )


@asynccontextmanager
async def stub_for(small: Small) -> AsyncIterator[salience_grpc.SalienceStub]:
    async with grpc.aio.insecure_channel(small.grpc_target) as channel:
        yield salience_grpc.SalienceStub(channel)


async def generate(stub: salience_grpc.SalienceStub, **request: Any) -> list[pb.GenerateEvent]:
    events = []
    async for event in stub.Generate(pb.GenerateRequest(top_k=1, **request), timeout=120):
        events.append(event)
    return events


async def test_a_client_that_abandons_sessions_no_longer_locks_others_out(
    live_server: LiveServer,
) -> None:
    prompt = [5, 6, 7]  # greedy runs on without EOS: the counts below are exact
    with small_server(live_server, salience_max_sessions=4) as small:
        async with stub_for(small) as stub:
            # The careless client fills the cap and never closes anything.
            abandoned = []
            for _ in range(4):
                sid = (await stub.OpenSession(pb.OpenSessionRequest(model=small.model))).session_id
                await generate(stub, session_id=sid, append_tokens=prompt, max_tokens=2)
                abandoned.append(sid)
            # Another client is served: the least recently used idle session makes room.
            other = (await stub.OpenSession(pb.OpenSessionRequest(model=small.model))).session_id
            events = await generate(stub, session_id=other, append_tokens=prompt, max_tokens=3)
            assert events[-1].done.total_tokens == 6
            # The evicted session's owner is told NOT_FOUND, re-opens and sends its tokens
            # again (the client is the source of truth).
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                await generate(stub, session_id=abandoned[0], offset=5, max_tokens=1)
            assert gone.value.code() == grpc.StatusCode.NOT_FOUND
            assert "evicted" in (gone.value.details() or "")
            again = (await stub.OpenSession(pb.OpenSessionRequest(model=small.model))).session_id
            events = await generate(stub, session_id=again, append_tokens=prompt, max_tokens=2)
            assert events[-1].done.total_tokens == 5
            # The others the careless client left are still there, but the next in line.
            dump = await stub.DumpSession(pb.DumpSessionRequest(session_id=abandoned[2]))
            assert list(dump.tokens)[:3] == prompt
        assert small.evicted("cap") == 2 and small.evicted("tokens") == 0


async def test_the_session_running_a_generate_is_never_the_one_evicted(
    live_server: LiveServer,
) -> None:
    with small_server(live_server, salience_max_sessions=3) as small:
        async with stub_for(small) as stub:
            running = (await stub.OpenSession(pb.OpenSessionRequest(model=small.model))).session_id
            # Greedy on this prompt runs to max_tokens (no EOS): the whole context, far
            # longer than the three opens below take.
            call = stub.Generate(
                pb.GenerateRequest(
                    session_id=running, append_tokens=[5, 6, 7], max_tokens=1021, top_k=1
                ),
                timeout=120,
            )
            first = await call.read()
            assert first.HasField("token")
            # Meanwhile, over the websocket, three sessions open at a cap of three: the
            # running one is the least recently used, yet the idle one goes.
            async with websockets.connect(f"{small.ws_url}/salience/ws") as ws:
                client = JsonClient(ws)
                opened = []
                for _ in range(3):
                    reply = await client.call("OpenSession", {"model": small.model})
                    opened.append(reply["response"]["sessionId"])
                gone = await client.call("DumpSession", {"sessionId": opened[0]})
                assert gone["error"]["code"] == "NOT_FOUND"
            rest = []
            while (event := await call.read()) is not grpc.aio.EOF:
                rest.append(event)
            done = rest[-1].done
            assert done.finish_reason == pb.GenerateDone.FINISH_REASON_LENGTH
            dump = await stub.DumpSession(pb.DumpSessionRequest(session_id=running))
            assert len(dump.tokens) == done.total_tokens == 1024
        assert small.evicted("cap") == 1


async def test_the_servers_token_bound_evicts_idle_sessions(live_server: LiveServer) -> None:
    tokens = list(range(10, 260))  # 250 tokens
    with small_server(live_server, salience_max_total_tokens=600) as small:
        async with stub_for(small) as stub:
            sessions = []
            for _ in range(2):
                sid = (await stub.OpenSession(pb.OpenSessionRequest(model=small.model))).session_id
                await generate(stub, session_id=sid, append_tokens=tokens, max_tokens=0)
                sessions.append(sid)
            # 500 held; a third session's Generate of 250 + max_tokens 10 needs 760.
            third = (await stub.OpenSession(pb.OpenSessionRequest(model=small.model))).session_id
            events = await generate(stub, session_id=third, append_tokens=tokens, max_tokens=10)
            assert events[-1].HasField("done")
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                await stub.DumpSession(pb.DumpSessionRequest(session_id=sessions[0]))
            assert gone.value.code() == grpc.StatusCode.NOT_FOUND
            kept = await stub.DumpSession(pb.DumpSessionRequest(session_id=sessions[1]))
            assert list(kept.tokens) == tokens
            # More than the bound, even with every idle session evicted: refused, and the
            # idle session is still there.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await generate(
                    stub,
                    session_id=third,
                    offset=0,
                    truncating=True,
                    append_tokens=tokens * 2,
                    max_tokens=200,
                )
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "limit of 600" in (refused.value.details() or "")
            await stub.DumpSession(pb.DumpSessionRequest(session_id=sessions[1]))
        assert small.evicted("tokens") == 1 and small.evicted("cap") == 0
