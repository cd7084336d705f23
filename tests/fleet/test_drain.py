"""SIGTERM during streams on every protocol, against a real `switchboard serve` process:
the fleet's replica 0 (tests/fleet_setup.py: the tiny model at an 8k context, no
`VLLM_CPU_KVCACHE_SPACE` in its environment, so it also proves that serve starts on a CPU
host on a page cache the suite has filled; back from the roll with a 4 s drain; a grace
past it), drained last
of the fleet's tests.

The signal goes to the server's whole process group, as a terminal's Ctrl-C or systemd's
stop sends it: vLLM's engine core and worker must live on under the drain, whether a
signal reaches them (app/engine/vllm/hold.py) or not (on a CPU build they run in a
process group of their own, app/engine/cpu_host.py), so every ending below is the
drain's, never "The engine is not running".

The replica is drained once, by the module's `drained` fixture; each test then checks one
part of what the clients saw:

- before SIGTERM: idle websocket sessions; then, all started at once, long streams on
  every protocol (16 choices x 8,000 tokens under `ignore_eos`: a minute and more, far
  past `--drain-timeout-s`) that must be cut, among them over native gRPC a Salience
  Generate and an Evergreen StartSession, and a short OpenAI stream still running at
  SIGTERM that ends within the drain, each past its first output;
- right after SIGTERM: `/ready` 503 (polled until it turns, which must be before the
  drain could have cut anything), then at once `/health` 200, a new request refused
  with 503 and Retry-After, a new Evergreen session refused with ABORT UNAVAILABLE, gRPC Salience
  unary calls (OpenSession, GetReadoutManifest) refused UNAVAILABLE with retry info;
- each client's ending: the short stream complete, the long OpenAI stream an SSE error
  (`overloaded`) then `[DONE]`, GraphPipe a 503 InferResponse error, Evergreen ABORT
  UNAVAILABLE + close 4014, Salience an UNAVAILABLE error frame + close 1001, the gRPC
  Generate the status UNAVAILABLE with retry info, the gRPC Evergreen session its ABORT
  UNAVAILABLE then that status with the same retry info;
- the listener open, answering `/ready` with 503 (never 200), until the grace period
  (`--drain-grace-s`, longer than the drain here) has passed, and only then closed;
- the process gone by itself once the drain is over.

Nothing here times the server: the drain's own timeout is the one clock (readiness turns
before it, the long streams are cut short of their natural end), and the process's exit
is waited for only to tell an exit from a hang.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import websockets
from google.protobuf import json_format, struct_pb2

from app.fleet.fleet import Fleet
from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from schemas import salience_pb2 as salience_pb
from schemas import salience_pb2_grpc as salience_grpc
from tests.evergreen_client import outcome as evergreen_outcome
from tests.evergreen_frames import turn
from tests.fleet_setup import DRAIN_TIMEOUT_S, GRACE_S
from tests.graphpipe_client import Infer, infer_request, read_infer_response
from tests.grpc_retry import retry_after_s
from tests.salience_client import JsonClient, gen, open_session

pytestmark = pytest.mark.e2e

# DRAIN_TIMEOUT_S (the replicas' --drain-timeout-s) is the window in which the probes
# after SIGTERM must be answered and the short stream end, and which the long work must
# outlast. Measured on 2 cores: the probes took 0.1 s (up to 1.3 s with others' engines
# and 3 busy processes beside the server), the short stream ended 0.7-1.5 s after
# SIGTERM, the long work had run 5-30% of LONG when cut. GRACE_S (--drain-grace-s) is
# how long the listener stays open after SIGTERM at least: past the drain's end, so that
# the grace, not the drain, decides when it closes. How long after that it closes is not
# asserted; a poll of /ready every POLL_S tells when it did, to within a poll.
POLL_S = 0.1
# What exiting may take past the drain timeout: the cut streams' last words, goodbyes,
# uvicorn's shutdown and vLLM stopping its engine core (it waits up to 5 s for workers).
SHUTDOWN_SLACK_S = 20.0
# Past this, serve is taken to hang (how long it takes short of that is not asserted).
EXIT_TIMEOUT_S = 120.0
# The long work runs on the tiny model's weights at an 8k context: 8,000 tokens a
# sequence (about 100 s for 18 of them, measured), so that no drain can see it end by
# itself, however slowly the test sets it up, while few sequences keep the server's
# frontend (and so the probes after SIGTERM) light.
LONG = 8000  # tokens: CONTEXT, less the prompt
SHORT = 100  # tokens: a stream still running at SIGTERM that ends within the drain
WIDE = 16  # choices (and GraphPipe rows) of the long requests


class Server:
    def __init__(
        self, process: subprocess.Popen[bytes], port: int, grpc_port: int, log: Path
    ) -> None:
        self.process, self.port, self.log = process, port, log
        self.base_url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}"
        self.grpc_target = f"127.0.0.1:{grpc_port}"


@pytest.fixture(scope="module")
def server(fleet: Fleet) -> Server:
    """The fleet's replica 0, the last of its tests: drained here, it does not come back.
    The roll (test_rolling_restart.py) brings it back with this module's drain; run
    alone, the module restarts it so."""
    replica = fleet.replica(0)
    if replica.drain_timeout_s != DRAIN_TIMEOUT_S:
        fleet.restart(0, drain_timeout_s=DRAIN_TIMEOUT_S)
    assert replica.process is not None and replica.ready()
    return Server(replica.process, replica.port, replica.grpc_port, replica.log)


async def _sse(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], first: asyncio.Event
) -> list[str]:
    """The stream's `data:` payloads, setting `first` at the first bytes. Split into
    lines at the end: the client's CPU is best left to the probes after SIGTERM."""
    chunks = []
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            first.set()
    lines = b"".join(chunks).decode().splitlines()
    return [line[6:] for line in lines if line.startswith("data: ")]


async def _grpc_generate(
    channel: grpc.aio.Channel, session: str, first: asyncio.Event
) -> tuple[str, Any]:
    """("done", finish reason) or ("status", (code, details, retry hint, events seen))."""
    stub = salience_grpc.SalienceStub(channel)
    # Greedy (top_k 1): the same tokens every run, and they do not reach EOS within
    # LONG (measured), so the call is still running when the drain cuts it.
    request = salience_pb.GenerateRequest(
        session_id=session, append_tokens=[5, 6, 7], max_tokens=LONG, top_k=1
    )
    events: list[salience_pb.GenerateEvent] = []
    try:
        async for event in stub.Generate(request, timeout=120):
            events.append(event)
            first.set()
    except grpc.aio.AioRpcError as error:
        return "status", (error.code(), error.details(), retry_after_s(error), len(events))
    return "done", events[-1].done.finish_reason


async def _grpc_session(channel: grpc.aio.Channel, first: asyncio.Event) -> tuple[Any, ...]:
    """(status code, details, retry hint, the last message's ABORT Struct or None), the
    session left open (no half-close) after a long GENERATE."""
    opening = json_format.ParseDict(
        turn("Tell me a long story.", LONG, temperature=0), service_pb.SessionMessage()
    )
    call = evergreen_grpc.EvergreenServiceStub(channel).StartSession(timeout=120)
    await call.write(opening)
    last = None
    try:
        async for reply in call:
            last = reply
            if reply.node_fragments:
                first.set()
    except grpc.aio.AioRpcError as error:
        abort = None
        if last is not None and last.actions and last.actions[0].name == "ABORT":
            status = struct_pb2.Struct()
            assert last.actions[0].configs[0].Unpack(status)
            abort = json_format.MessageToDict(status)
        return error.code(), error.details(), retry_after_s(error), abort
    return grpc.StatusCode.OK, await call.details(), None, None


async def _after_sigterm(server: Server, client: httpx.AsyncClient) -> dict[str, Any]:
    """What new clients meet once SIGTERM has been sent: readiness, polled until it turns,
    then /health, a new request and a new Evergreen session, all at once.

    Each must happen within the drain (the server stops listening soon after
    DRAIN_TIMEOUT_S): asked one after the other, a loaded machine could take longer than
    that. A probe that fails is kept as its exception, with when the probes were done,
    for the test that reads it to say."""
    seen: dict[str, Any] = {}
    started = time.monotonic()
    async with asyncio.timeout(DRAIN_TIMEOUT_S + SHUTDOWN_SLACK_S):
        while (ready := await client.get(f"{server.base_url}/ready")).status_code != 503:
            await asyncio.sleep(0.02)
    seen["ready_after_s"] = time.monotonic() - started
    seen["ready"] = ready.status_code

    async def refused() -> tuple[int, str | None, Any]:
        body = {"model": "tiny", "prompt": "too late", "max_tokens": 2}
        answer = await client.post(f"{server.base_url}/v1/completions", json=body)
        return answer.status_code, answer.headers.get("retry-after"), answer.json()

    async def evergreen() -> tuple[str, Any]:
        async with websockets.connect(f"{server.ws_url}/evergreen/ws") as ws:
            return await evergreen_outcome(ws)

    async def health() -> int:
        return (await client.get(f"{server.base_url}/health")).status_code

    async def grpc_unary() -> dict[str, Any]:
        outcomes: dict[str, Any] = {}
        async with grpc.aio.insecure_channel(server.grpc_target) as channel:
            stub = salience_grpc.SalienceStub(channel)
            calls = {
                "OpenSession": stub.OpenSession(salience_pb.OpenSessionRequest(), timeout=10),
                # Stateless: refused only because a draining server takes no new call.
                "GetReadoutManifest": stub.GetReadoutManifest(
                    salience_pb.GetReadoutManifestRequest(), timeout=10
                ),
            }
            for name, call in calls.items():
                try:
                    await call
                    outcomes[f"grpc_{name}"] = "served"
                except grpc.aio.AioRpcError as error:
                    outcomes[f"grpc_{name}"] = (error.code(), error.details(), retry_after_s(error))
        return outcomes

    probes = await asyncio.gather(
        health(), refused(), evergreen(), grpc_unary(), return_exceptions=True
    )
    seen["health"], seen["refused"], seen["evergreen_refused"], unary = probes
    seen.update(
        unary
        if isinstance(unary, dict)
        else {"grpc_OpenSession": unary, "grpc_GetReadoutManifest": unary}
    )
    seen["probed_after_s"] = time.monotonic() - started
    return seen


def probed(drained: dict[str, Any], name: str) -> Any:
    """What probe `name` met after SIGTERM; a failed probe fails the test, saying when."""
    outcome = drained[name]
    if isinstance(outcome, BaseException):
        raise AssertionError(
            f"{name} failed {drained['probed_after_s']:.1f} s after SIGTERM (the drain "
            f"lasts {DRAIN_TIMEOUT_S} s): {outcome!r}"
        ) from outcome
    return outcome


@pytest.fixture(scope="module")
def drained(server: Server) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            # Every connection and session first; then all the long work at once, as
            # late as possible before SIGTERM: the longer it has run by then (a loaded
            # machine sets up slowly), the nearer its natural end the drain would cut it.
            ws_url = server.ws_url
            evergreen_busy = await websockets.connect(f"{ws_url}/evergreen/ws")
            evergreen_idle = await websockets.connect(f"{ws_url}/evergreen/ws")
            salience_busy = await websockets.connect(f"{ws_url}/salience/ws")
            salience_session = await open_session(JsonClient(salience_busy), "tiny")
            salience_idle = await websockets.connect(f"{ws_url}/salience/ws")
            channel = grpc.aio.insecure_channel(server.grpc_target)
            opened = await salience_grpc.SalienceStub(channel).OpenSession(
                salience_pb.OpenSessionRequest(model="tiny"), timeout=120
            )

            url = f"{server.base_url}/v1/completions"
            long_started, short_started = asyncio.Event(), asyncio.Event()
            long_body = {
                "model": "tiny",
                "prompt": "Once upon a time",
                "max_tokens": LONG,
                "n": WIDE,
                "ignore_eos": True,
                "stream": True,
            }
            long_stream = asyncio.create_task(_sse(client, url, long_body, long_started))
            rows = np.empty(WIDE, dtype=object)
            rows[:] = [f"row {i}".encode() for i in range(WIDE)]
            call = Infer([rows], config=json.dumps({"max_tokens": LONG, "temperature": 0}))
            graphpipe = asyncio.create_task(
                client.post(f"{server.base_url}/graphpipe", content=infer_request(call))
            )
            await evergreen_busy.send(
                json.dumps(turn("Tell me a long story.", LONG, temperature=0))
            )
            generate = gen("g", sessionId=salience_session, appendTokens=[5, 6, 7], maxTokens=LONG)
            await salience_busy.send(json.dumps(generate))
            generate_started, session_started = asyncio.Event(), asyncio.Event()
            grpc_generate = asyncio.create_task(
                _grpc_generate(channel, opened.session_id, generate_started)
            )
            grpc_session = asyncio.create_task(_grpc_session(channel, session_started))
            started = (generate_started, session_started, long_started)
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
            # Then the short stream, SIGTERM as soon as it has begun: its SHORT tokens
            # outlast that moment and end early in the drain.
            short_body = {"model": "tiny", "prompt": "Hi", "max_tokens": SHORT, "stream": True}
            short_stream = asyncio.create_task(_sse(client, url, short_body, short_started))
            await asyncio.wait_for(short_started.wait(), 120)

            sent_at = time.monotonic()
            os.killpg(server.process.pid, signal.SIGTERM)
            short_running = not short_stream.done()
            readiness = asyncio.create_task(_readiness_until_closed(server, sent_at))
            seen = await _after_sigterm(server, client)

            seen["short"] = await short_stream
            seen["short_running_at_sigterm"] = short_running
            seen["long"] = await long_stream
            gp = await graphpipe
            seen["graphpipe"] = (gp.status_code, read_infer_response(gp.content).errors)
            seen["evergreen_busy"] = await _evergreen_ending(evergreen_busy)
            seen["evergreen_idle"] = await evergreen_outcome(evergreen_idle)
            seen["salience_busy"] = await _salience_ending(salience_busy, "g")
            seen["salience_idle"] = await _salience_ending(salience_idle, None)
            seen["grpc_generate"] = await grpc_generate
            seen["grpc_session"] = await grpc_session
            await channel.close()
            seen["readiness"] = await readiness
            try:
                seen["exit"] = await asyncio.to_thread(server.process.wait, EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                seen["exit"] = None  # hung
            seen["exit_after_s"] = time.monotonic() - sent_at
            return seen

    return asyncio.run(run())


async def _readiness_until_closed(server: Server, sent_at: float) -> dict[str, Any]:
    """`/ready` every POLL_S from SIGTERM until the listener refuses the connection: the
    statuses seen, and when (after SIGTERM) the last answer came."""
    statuses: Counter[int] = Counter()
    last_answer_s = 0.0
    async with httpx.AsyncClient(timeout=10) as client:
        async with asyncio.timeout(DRAIN_TIMEOUT_S + GRACE_S + SHUTDOWN_SLACK_S):
            while True:
                try:
                    answer = await client.get(f"{server.base_url}/ready")
                except httpx.TransportError:
                    break
                statuses[answer.status_code] += 1
                last_answer_s = time.monotonic() - sent_at
                await asyncio.sleep(POLL_S)
    return {"statuses": statuses, "last_answer_s": last_answer_s}


async def _evergreen_ending(ws: Any) -> tuple[str, Any]:
    """The session's ending, past any output that completed first (stopped at EOS)."""
    while True:
        kind, outcome = await evergreen_outcome(ws)
        if kind != "text":
            return kind, outcome


async def _salience_ending(ws: Any, call_id: str | None) -> list[Any]:
    """Every reply until the socket closes, then its close code."""
    replies: list[Any] = []
    try:
        while True:
            replies.append(json.loads(await asyncio.wait_for(ws.recv(), timeout=120)))
    except websockets.ConnectionClosed as closed:
        replies.append(closed.rcvd.code if closed.rcvd else None)
    if call_id is None:
        assert all(r.get("id") == "" for r in replies[:-1]), replies
    return replies


def test_readiness_turns_at_once_and_new_work_is_refused(drained: dict[str, Any]) -> None:
    # At once: within the drain, before anything is cut (a readiness that turned at the
    # drain's end would be seen DRAIN_TIMEOUT_S after SIGTERM at the earliest).
    assert drained["ready"] == 503 and drained["ready_after_s"] < DRAIN_TIMEOUT_S
    assert probed(drained, "health") == 200  # alive: not to be killed while it drains
    status, retry_after, body = probed(drained, "refused")
    assert status == 503 and retry_after is not None and int(retry_after) >= 1
    assert body["error"]["code"] == "overloaded" and "shutting down" in body["error"]["message"]
    kind, (abort, code) = probed(drained, "evergreen_refused")
    assert kind == "abort" and abort["code"] == "UNAVAILABLE" and code == 4014


def test_grpc_unary_calls_are_refused_unavailable_with_retry_info(
    drained: dict[str, Any],
) -> None:
    for name in ("grpc_OpenSession", "grpc_GetReadoutManifest"):
        assert drained[name] != "served", name
        code, details, retry = drained[name]
        assert code == grpc.StatusCode.UNAVAILABLE and "shutting down" in details, name
        assert retry is not None and retry >= 1, name


def test_a_stream_that_ends_within_the_drain_finishes(drained: dict[str, Any]) -> None:
    assert drained["short_running_at_sigterm"]  # else it ended before the drain began
    events = drained["short"]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("error" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_long_openai_stream_is_cut_with_an_error_event(drained: dict[str, Any]) -> None:
    events = drained["long"]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "overloaded" and "shutting down" in error["message"]
    # Cut, every choice short of the LONG tokens it would have run to (ignore_eos).
    tokens = Counter(
        choice["index"]
        for chunk in map(json.loads, events[:-2])
        for choice in chunk.get("choices", [])
        if choice.get("text")
    )
    assert tokens and max(tokens.values()) < LONG, tokens


def test_graphpipe_answers_its_error_shape(drained: dict[str, Any]) -> None:
    status, errors = drained["graphpipe"]
    assert status == 503 and errors and errors[0][0] == 503
    assert "shutting down" in errors[0][1]


def test_evergreen_sessions_end_with_abort_unavailable(drained: dict[str, Any]) -> None:
    for name in ("evergreen_busy", "evergreen_idle"):
        kind, outcome = drained[name]
        assert kind == "abort", (name, kind, outcome)
        abort, code = outcome
        assert abort["code"] == "UNAVAILABLE" and abort["retry_after_s"] >= 1
        assert code == 4014


def test_salience_sockets_end_with_an_error_frame_and_going_away(
    drained: dict[str, Any],
) -> None:
    busy = drained["salience_busy"]
    # The Generate's own ending (cut: UNAVAILABLE; or done if it stopped at EOS first),
    # then the socket's goodbye: an UNAVAILABLE error frame, close 1001.
    assert busy[-1] == 1001
    goodbye = busy[-2]
    assert goodbye["id"] == "" and goodbye["error"]["code"] == "UNAVAILABLE"
    ending = [
        r
        for r in busy[:-2]
        if r.get("id") == "g" and ("error" in r or "done" in r.get("event", {}))
    ]
    assert ending, busy[-5:]
    idle = drained["salience_idle"]
    assert idle[-1] == 1001 and idle[-2]["error"]["code"] == "UNAVAILABLE"


def test_the_listener_answers_not_ready_for_the_grace_period(drained: dict[str, Any]) -> None:
    """A router probing /ready sees the replica leave on a 503, never on a closed port:
    the listener stays open for --drain-grace-s after SIGTERM, answering 503 (a 200
    then would call traffic back), well past the drain's own end. A poll answered less
    than a poll (and its slack on a loaded machine) short of the grace is the listener
    still open when the grace ends."""
    readiness = drained["readiness"]
    assert set(readiness["statuses"]) == {503}, readiness
    assert readiness["last_answer_s"] >= GRACE_S - 1.0, readiness


def test_the_process_exits_after_the_drain(drained: dict[str, Any]) -> None:
    code = drained["exit"]
    assert code is not None, f"serve still running {drained['exit_after_s']:.0f} s after SIGTERM"
    assert code in (0, -signal.SIGTERM), code


def test_grpc_calls_end_unavailable_with_retry_info(drained: dict[str, Any]) -> None:
    kind, outcome = drained["grpc_generate"]
    assert kind == "status", (kind, outcome)
    code, details, retry, events = outcome
    assert code == grpc.StatusCode.UNAVAILABLE and "shutting down" in details, outcome
    assert retry is not None and retry >= 1 and 0 < events < LONG, outcome
    code, details, retry, abort = drained["grpc_session"]
    assert code == grpc.StatusCode.UNAVAILABLE and "shutting down" in details
    assert retry is not None and retry >= 1
    assert abort is not None and abort["code"] == "UNAVAILABLE"
    assert abort["retry_after_s"] == retry
