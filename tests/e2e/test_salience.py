"""Salience over a real websocket client against the live server (real vLLM), JSON and
binary frames. The abort tests follow tests/aborts.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from google.protobuf import json_format

from schemas import salience_pb2 as pb
from schemas import salience_ws_pb2 as ws_pb
from tests.aborts import CLOSE_TIMEOUT, AbortWatch, Workload
from tests.conftest import LiveServer
from tests.salience_client import JsonClient, tokens_of

pytestmark = pytest.mark.e2e


async def test_multi_turn_session_with_deltas(live_server: LiveServer) -> None:
    tok = live_server.engine.tokenizer
    async with websockets.connect(f"{live_server.ws_url}/salience/ws") as ws:
        client = JsonClient(ws)
        opened = await client.call("OpenSession", {"model": live_server.model})
        session = opened["response"]["sessionId"]
        assert opened["response"]["maxModelLen"] == 1024
        mine: list[int] = []
        for turn in ("def first():", "\n    return 1\n", "def second():"):
            delta = tok.encode(turn, add_special_tokens=False)
            events = await client.generate(
                {
                    "sessionId": session,
                    "appendTokens": delta,
                    "offset": len(mine),
                    "maxTokens": 5,
                    "topK": 1,
                }
            )
            mine += delta
            decoded = tokens_of(events)
            assert [t.get("position", 0) for t in decoded] == list(range(len(mine), len(mine) + 5))
            assert all(not t.get("isPrefill", False) for t in decoded)
            done = events[-1]["done"]
            assert done["promptTokens"] == len(mine) and done["completionTokens"] == 5
            assert done["finishReason"] == "FINISH_REASON_LENGTH"
            mine += [t.get("id", 0) for t in decoded]
        dump = await client.call("DumpSession", {"sessionId": session})
        assert [int(t) for t in dump["response"]["tokens"]] == mine
        # Greedy continuation equals the OpenAI route on the same token ids.
        whole = httpx.post(
            f"{live_server.base_url}/v1/completions",
            json={
                "model": live_server.model,
                "prompt": mine[:-5],
                "max_tokens": 5,
                "top_k": 1,
                "ignore_eos": True,
            },
        ).json()
        assert whole["choices"][0]["text"] == tok.decode(mine[-5:])
        await client.call("CloseSession", {"sessionId": session})


async def test_scoring_matches_engine_prompt_logprobs(live_server: LiveServer) -> None:
    tok = live_server.engine.tokenizer
    ids = tok.encode("import os\nprint(os.getcwd())")
    async with websockets.connect(f"{live_server.ws_url}/salience/ws") as ws:
        client = JsonClient(ws)
        session = (await client.call("OpenSession", {"model": live_server.model}))["response"][
            "sessionId"
        ]
        events = await client.generate(
            {
                "sessionId": session,
                "appendTokens": ids,
                "offset": 0,
                "maxTokens": 0,
                "logprobsRanges": [{"start": 0, "end": len(ids)}],
                "logprobTopK": 2,
            }
        )
    prefill = tokens_of(events)
    assert [t.get("position", 0) for t in prefill] == list(range(len(ids)))
    assert all(t["isPrefill"] for t in prefill)
    assert "hasSampledLogprob" not in prefill[0]
    reference = httpx.post(
        f"{live_server.base_url}/v1/completions",
        json={
            "model": live_server.model,
            "prompt": ids,
            "max_tokens": 0,
            "echo": True,
            "logprobs": 2,
        },
    ).json()["choices"][0]["logprobs"]["token_logprobs"]
    for token, expected in zip(prefill[1:], reference[1:], strict=True):
        assert token["hasSampledLogprob"]
        assert token["sampledLogprob"] == pytest.approx(expected, abs=1e-4)
        assert len(token["logprobs"]) == 2
    assert events[-1]["done"].get("completionTokens", 0) == 0


async def test_fork_diverges_and_errors(live_server: LiveServer) -> None:
    tok = live_server.engine.tokenizer
    ids = tok.encode("class Tree:\n    def __init__(self):")
    async with websockets.connect(f"{live_server.ws_url}/salience/ws") as ws:
        client = JsonClient(ws)
        root = (await client.call("OpenSession", {"model": live_server.model}))["response"][
            "sessionId"
        ]
        await client.generate(
            {"sessionId": root, "appendTokens": ids, "offset": 0, "maxTokens": 3, "topK": 1}
        )
        fork = (await client.call("ForkSession", {"sessionId": root, "atPosition": len(ids)}))[
            "response"
        ]["sessionId"]
        branch = tok.encode(" pass", add_special_tokens=False)
        await client.generate(
            {
                "sessionId": fork,
                "appendTokens": branch,
                "offset": len(ids),
                "maxTokens": 2,
                "topK": 1,
            }
        )
        root_dump = (await client.call("DumpSession", {"sessionId": root}))["response"]
        fork_dump = (await client.call("DumpSession", {"sessionId": fork}))["response"]
        assert [int(t) for t in fork_dump["tokens"]][: len(ids)] == ids
        assert len(root_dump["tokens"]) == len(ids) + 3
        assert fork_dump["tokens"][len(ids) : len(ids) + len(branch)] == branch
        # Drift, unknown session, wrong model, context overflow.
        drift = await client.generate({"sessionId": root, "appendTokens": [5], "offset": 1})
        assert drift[0]["error"]["code"] == "FAILED_PRECONDITION"
        missing = await client.call("DumpSession", {"sessionId": "nope"})
        assert missing["error"]["code"] == "NOT_FOUND"
        wrong = await client.call("OpenSession", {"model": "other"})
        assert wrong["error"]["code"] == "NOT_FOUND"
        big = await client.generate(
            {"sessionId": fork, "offset": len(fork_dump["tokens"]), "maxTokens": 2000}
        )
        assert big[0]["error"]["code"] == "RESOURCE_EXHAUSTED"
        # Truncating rewinds before appending.
        rewound = await client.generate(
            {"sessionId": root, "appendTokens": [7], "offset": 2, "truncating": True}
        )
        assert rewound[-1]["done"]["promptTokens"] == 3
        # A malformed frame gets INVALID_ARGUMENT and the socket stays usable.
        await ws.send("{not json")
        assert json.loads(await ws.recv())["error"]["code"] == "INVALID_ARGUMENT"
        ok = await client.call("DumpSession", {"sessionId": root})
        assert [int(t) for t in ok["response"]["tokens"]] == [*ids[:2], 7]


async def test_binary_frames_with_readouts(live_server: LiveServer) -> None:
    tok = live_server.engine.tokenizer
    ids = tok.encode("def f(x): return x")

    async def call(ws: Any, frame: ws_pb.ClientFrame) -> ws_pb.ServerFrame:
        await ws.send(frame.SerializeToString())
        return ws_pb.ServerFrame.FromString(await ws.recv())

    async with websockets.connect(f"{live_server.ws_url}/salience/ws") as ws:
        manifest = (
            await call(
                ws, ws_pb.ClientFrame(id="m", get_readout_manifest=pb.GetReadoutManifestRequest())
            )
        ).readout_manifest
        assert list(manifest.layers) == [0, 1] and manifest.dtype == "float32"
        opened = await call(
            ws,
            ws_pb.ClientFrame(id="o", open_session=pb.OpenSessionRequest(model=live_server.model)),
        )
        session = opened.open_session.session_id
        request = pb.GenerateRequest(
            session_id=session, append_tokens=ids, offset=0, max_tokens=3, top_k=1
        )
        request.readout_ranges.add(start=0, end=10_000)
        await ws.send(ws_pb.ClientFrame(id="g", generate=request).SerializeToString())
        tokens = []
        while True:
            frame = ws_pb.ServerFrame.FromString(await asyncio.wait_for(ws.recv(), 120))
            assert frame.id == "g" and frame.WhichOneof("reply") == "event"
            if frame.event.WhichOneof("event") == "done":
                break
            tokens.append(frame.event.token)
    width = len(manifest.layers) * len(manifest.concepts)
    assert [t.position for t in tokens] == list(range(len(ids) + 3))
    # Every fed position has its readout; the last sampled token was never fed in.
    assert [len(t.readout) for t in tokens] == [width] * (len(tokens) - 1) + [0]
    engine_view = live_server.call(_engine_readouts(live_server.engine, [*ids, tokens[-3].id]))
    got = np.array(tokens[len(ids)].readout, dtype=np.float32)
    np.testing.assert_allclose(got, engine_view[len(ids)], rtol=1e-4, atol=1e-4)


async def _engine_readouts(engine: Any, ids: list[int]) -> dict[int, np.ndarray]:
    from app.engine.base import GenerationRequest, SamplingOptions

    out: dict[int, np.ndarray] = {}
    request = GenerationRequest(
        "sal-ref",
        prompt_token_ids=ids,
        sampling=SamplingOptions(max_tokens=0),
        readout_ranges=((0, 10_000),),
    )
    async for event in engine.generate(request):
        for position, data in (event.readouts or {}).items():
            out[position] = np.frombuffer(data, dtype=np.float32)
    return out


async def _start_workload(live: Any, ws: Any, workload: Workload) -> tuple[list[str], AbortWatch]:
    """A session per prompt of the abort workload, then a greedy Generate in each (call
    id = session id); the watch starts with the Generates."""
    client = JsonClient(ws)
    sessions = []
    for _ in workload.prompts:
        opened = await client.call("OpenSession", {"model": live.model})
        sessions.append(opened["response"]["sessionId"])
    watch = await AbortWatch.start(live.engine, workload)
    for session, prompt in zip(sessions, workload.prompts, strict=True):
        request = {
            "sessionId": session,
            "appendTokens": list(prompt),
            "offset": 0,
            "maxTokens": workload.max_tokens,
            "topK": 1,
        }
        await ws.send(json.dumps({"id": session, "method": "Generate", "request": request}))
    await watch.all_in_engine()
    return sessions, watch


async def _dones(ws: Any, calls: list[str]) -> dict[str, dict[str, Any]]:
    """Read on until every call in `calls` has ended; each one's `done`."""
    dones: dict[str, dict[str, Any]] = {}
    while len(dones) < len(calls):
        reply = json.loads(await asyncio.wait_for(ws.recv(), timeout=60))
        assert reply["id"] in calls and "error" not in reply, reply
        if "done" in reply["event"]:
            dones[reply["id"]] = reply["event"]["done"]
    return dones


async def _close_sessions(ws: Any, sessions: list[str]) -> None:
    for session in sessions:
        await ws.send(
            json.dumps({"id": session, "method": "CloseSession", "request": {"sessionId": session}})
        )
    # Read the replies: a client that leaves them unread stalls its own close handshake.
    for _ in sessions:
        assert "response" in json.loads(await asyncio.wait_for(ws.recv(), timeout=60))


async def test_cancel_aborts_engine_requests(
    live_server: LiveServer, abort_workload: Workload
) -> None:
    async with websockets.connect(f"{live_server.ws_url}/salience/ws") as ws:
        sessions, watch = await _start_workload(live_server, ws, abort_workload)
        for session in sessions:
            await ws.send(json.dumps({"id": session, "cancel": True}))
        await watch.idle()
        dones = await _dones(ws, sessions)
        assert {d["finishReason"] for d in dones.values()} == {"FINISH_REASON_CANCELLED"}
        # The session kept what was produced, and is free again.
        session = sessions[0]
        produced = dones[session].get("completionTokens", 0)
        dump = await JsonClient(ws).call("DumpSession", {"sessionId": session})
        assert len(dump["response"]["tokens"]) == len(abort_workload.prompts[0]) + produced
        again = await JsonClient(ws).generate(
            {"sessionId": session, "offset": dones[session]["totalTokens"], "maxTokens": 2}
        )
        assert again[-1]["done"]["completionTokens"] > 0
        await _close_sessions(ws, sessions)


async def test_closing_the_socket_aborts_engine_requests(
    live_server: LiveServer, abort_workload: Workload
) -> None:
    ws = await websockets.connect(f"{live_server.ws_url}/salience/ws", close_timeout=CLOSE_TIMEOUT)
    sessions, watch = await _start_workload(live_server, ws, abort_workload)
    closing = asyncio.ensure_future(ws.close())
    await watch.idle()
    await closing
    # The sessions survive the socket, with what was produced.
    async with websockets.connect(f"{live_server.ws_url}/salience/ws") as ws:
        dump = await JsonClient(ws).call("DumpSession", {"sessionId": sessions[0]})
        assert len(dump["response"]["tokens"]) > len(abort_workload.prompts[0])
        await _close_sessions(ws, sessions)


async def test_closing_the_sessions_from_another_socket_aborts_engine_requests(
    live_server: LiveServer, abort_workload: Workload
) -> None:
    url = f"{live_server.ws_url}/salience/ws"
    async with websockets.connect(url) as ws, websockets.connect(url) as other:
        sessions, watch = await _start_workload(live_server, ws, abort_workload)
        await _close_sessions(other, sessions)
        await watch.idle()
        dones = await _dones(ws, sessions)
        assert {d["finishReason"] for d in dones.values()} == {"FINISH_REASON_CANCELLED"}


async def test_full_context_scoring_and_an_instant_cancel(live_server: LiveServer) -> None:
    tok = live_server.engine.tokenizer
    text = "for i in range(10):\n    print(i)\n"
    ids = (tok.encode(text, add_special_tokens=False) * 200)[:1023]
    async with websockets.connect(f"{live_server.ws_url}/salience/ws") as ws:
        client = JsonClient(ws)
        session = (await client.call("OpenSession", {"model": live_server.model}))["response"][
            "sessionId"
        ]
        filled = await client.generate(
            {"sessionId": session, "appendTokens": ids, "offset": 0, "maxTokens": 1, "topK": 1}
        )
        assert filled[-1]["done"]["totalTokens"] == 1024
        # Scoring samples a token inside vLLM: a full session has no room for it. The
        # refusal leaves the session alone.
        full = await client.generate(
            {
                "sessionId": session,
                "offset": 1024,
                "logprobsRanges": [{"start": 1000, "end": 1024}],
            }
        )
        assert full[0]["error"]["code"] == "RESOURCE_EXHAUSTED"
        dump = await client.call("DumpSession", {"sessionId": session})
        assert len(dump["response"]["tokens"]) == 1024
        scored = await client.generate(
            {
                "sessionId": session,
                "offset": 1023,
                "truncating": True,
                "logprobsRanges": [{"start": 1020, "end": 1023}],
            }
        )
        assert [t["position"] for t in tokens_of(scored)] == [1020, 1021, 1022]
        assert all(t["hasSampledLogprob"] for t in tokens_of(scored))
        # A cancel sent right behind its Generate still ends the call with done.
        await ws.send(
            json.dumps(
                {
                    "id": "quick",
                    "method": "Generate",
                    "request": {
                        "sessionId": session,
                        "offset": 100,
                        "truncating": True,
                        "maxTokens": 500,
                    },
                }
            )
        )
        await ws.send(json.dumps({"id": "quick", "cancel": True}))
        while "done" not in (reply := json.loads(await asyncio.wait_for(ws.recv(), 120)))["event"]:
            assert reply["id"] == "quick"
        done = reply["event"]["done"]
        assert done["finishReason"] == "FINISH_REASON_CANCELLED"
        assert live_server.wait_idle() == 0
        dump = await client.call("DumpSession", {"sessionId": session})
        assert len(dump["response"]["tokens"]) == done["totalTokens"]
        assert dump["response"]["tokens"][:100] == ids[:100]


def test_json_mapping_roundtrip() -> None:
    request = json_format.ParseDict(
        {"sessionId": "s", "appendTokens": [1, 2], "logprobsRanges": [{"start": 0, "end": 2}]},
        pb.GenerateRequest(),
    )
    assert list(request.append_tokens) == [1, 2] and request.logprobs_ranges[0].end == 2


async def test_a_client_offering_deflate_gets_plain_frames(live_server: LiveServer) -> None:
    """A token frame is tens of bytes: deflating each one costs more CPU than it saves, so
    the server declines permessage-deflate (--ws-per-message-deflate, off by default)."""
    url = f"{live_server.ws_url}/salience/ws"
    async with websockets.connect(url, compression="deflate") as ws:
        assert ws.request is not None and ws.response is not None
        assert "Sec-WebSocket-Extensions" in ws.request.headers  # offered
        assert "Sec-WebSocket-Extensions" not in ws.response.headers  # declined
