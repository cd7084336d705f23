"""gRPC calls that end early abort their engine requests (real vLLM, tests/aborts.py's
workload and bound, judged by vLLM's own request count): a Salience Generate that the
client cancels, whose deadline passes, or whose client process dies with its connection;
an Evergreen StartSession whose deadline passes. An Evergreen session that the client
cancels or that aborts is in test_evergreen.py, on every transport."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from tests.aborts import AbortWatch, Workload
from tests.conftest import LiveServer
from tests.evergreen_frames import SESSIONS, workload_actions

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


async def _sessions(stub: salience_grpc.SalienceStub, live: Any, workload: Workload) -> list[str]:
    opened = [
        await stub.OpenSession(pb.OpenSessionRequest(model=live.model)) for _ in workload.prompts
    ]
    return [o.session_id for o in opened]


def _requests(sessions: list[str], workload: Workload) -> list[pb.GenerateRequest]:
    return [
        pb.GenerateRequest(
            session_id=session,
            append_tokens=prompt,
            max_tokens=workload.max_tokens,
            top_k=1,
        )
        for session, prompt in zip(sessions, workload.prompts, strict=True)
    ]


async def _after(call: Any) -> grpc.StatusCode:
    """Read a call to its end (its events are not the point); its status."""
    try:
        async for _ in call:
            pass
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    except asyncio.CancelledError:
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.OK


async def _free(stub: salience_grpc.SalienceStub, sessions: list[str]) -> None:
    """The sessions survived their Generates and come free: a new Generate at the
    session's length runs to its end within `FREE_S`. An aborted Generate's own end (the
    tokens it made, kept in its session) may come after vLLM has let its request go, so
    a Generate sent meanwhile meets the session still busy (ABORTED) or its length moved
    on since it was read (FAILED_PRECONDITION, as seen in a whole-suite run): it is sent
    again, at the length read again; a session that stays busy fails the test."""
    for session in sessions[:3]:
        async with asyncio.timeout(FREE_S):
            while True:
                dump = await stub.DumpSession(pb.DumpSessionRequest(session_id=session))
                request = pb.GenerateRequest(session_id=session, offset=len(dump.tokens))
                try:
                    events = [e async for e in stub.Generate(request)]
                    break
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in _NOT_YET:
                        raise
                await asyncio.sleep(0.05)
        assert events[-1].HasField("done")
        await stub.CloseSession(pb.CloseSessionRequest(session_id=session))


FREE_S = 10.0
_NOT_YET = (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION)


async def test_a_cancelled_generate_aborts_it(
    live_server: LiveServer, abort_workload: Workload
) -> None:
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        stub = salience_grpc.SalienceStub(channel)
        sessions = await _sessions(stub, live_server, abort_workload)
        watch = await AbortWatch.start(live_server.engine, abort_workload)
        calls = [stub.Generate(r) for r in _requests(sessions, abort_workload)]
        await watch.all_in_engine()
        for call in calls:
            call.cancel()
        await watch.idle()
        assert {await _after(c) for c in calls} == {grpc.StatusCode.CANCELLED}
        await _free(stub, sessions)


async def test_a_generate_past_its_deadline_aborts_it(
    live_server: LiveServer, abort_workload: Workload
) -> None:
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        stub = salience_grpc.SalienceStub(channel)
        sessions = await _sessions(stub, live_server, abort_workload)
        watch = await AbortWatch.start(live_server.engine, abort_workload)
        # The deadline passes after the workload is in the engine (all_in_engine asserts
        # that), and long before it would end by itself.
        deadline = abort_workload.bound * 0.6
        calls = [stub.Generate(r, timeout=deadline) for r in _requests(sessions, abort_workload)]
        await watch.all_in_engine()
        await watch.idle()
        assert {await _after(c) for c in calls} == {grpc.StatusCode.DEADLINE_EXCEEDED}
        await _free(stub, sessions)


# A client process that starts a Generate in each session it is given, reads them, and
# says so; the test kills it (SIGKILL: no goodbye, the connection just drops).
_CLIENT = """
import sys, threading
import grpc
from schemas import salience_pb2 as pb, salience_pb2_grpc
target, max_tokens = sys.argv[1], int(sys.argv[2])
channel = grpc.insecure_channel(target)
stub = salience_pb2_grpc.SalienceStub(channel)
def run(line):
    session, *ids = line.split()
    request = pb.GenerateRequest(session_id=session, append_tokens=[int(i) for i in ids],
                                 max_tokens=max_tokens, top_k=1)
    for _ in stub.Generate(request):
        pass
for line in sys.stdin:
    threading.Thread(target=run, args=(line,), daemon=True).start()
print("started", flush=True)
threading.Event().wait()
"""


async def test_a_dropped_connection_aborts_its_engine_requests(
    live_server: LiveServer, abort_workload: Workload
) -> None:
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        stub = salience_grpc.SalienceStub(channel)
        sessions = await _sessions(stub, live_server, abort_workload)
        lines = "".join(
            f"{s} {' '.join(map(str, p))}\n"
            for s, p in zip(sessions, abort_workload.prompts, strict=True)
        )
        watch = await AbortWatch.start(live_server.engine, abort_workload)
        client = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CLIENT,
                live_server.grpc_target,
                str(abort_workload.max_tokens),
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert client.stdin is not None and client.stdout is not None
            client.stdin.write(lines)
            client.stdin.close()
            assert client.stdout.readline().strip() == "started"
            await watch.all_in_engine()
        finally:
            client.send_signal(signal.SIGKILL)
            client.wait(timeout=30)
        await watch.idle()
        await _free(stub, sessions)


async def test_a_start_session_past_its_deadline_aborts_its_engine_requests(
    live_server: LiveServer, abort_workload: Workload
) -> None:
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        stub = evergreen_grpc.EvergreenServiceStub(channel)
        watch = await AbortWatch.start(live_server.engine, abort_workload)
        # The deadline passes after the workload is in the engine (all_in_engine asserts
        # that), and long before it would end by itself.
        deadline = abort_workload.bound * 0.6
        calls = [stub.StartSession(timeout=deadline) for _ in range(SESSIONS)]
        for share, call in enumerate(calls):
            mapping = workload_actions(abort_workload, share)
            await call.write(json_format.ParseDict(mapping, service_pb.SessionMessage()))
        await watch.all_in_engine()
        await watch.idle()
        assert {await _after(c) for c in calls} == {grpc.StatusCode.DEADLINE_EXCEEDED}
