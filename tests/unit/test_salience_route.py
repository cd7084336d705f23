"""The Salience websocket over the fake engine: auth, malformed frames, one socket with
several calls."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from app.config import Settings
from app.main import create_app
from schemas import salience_pb2 as pb
from schemas import salience_ws_pb2 as ws_pb
from tests.fake_engine import FakeEngine


def client(**settings: Any) -> TestClient:
    return TestClient(create_app(Settings(model="fake", **settings), engine=FakeEngine()))


def test_bearer_token_on_handshake_or_query() -> None:
    with client(api_key="k") as c:
        with c.websocket_connect("/salience/ws") as ws:
            assert ws.receive_json()["error"]["code"] == "UNAUTHENTICATED"
        with c.websocket_connect("/salience/ws?token=k") as ws:
            ws.send_json({"id": "1", "method": "OpenSession", "request": {"model": "fake"}})
            assert "sessionId" in ws.receive_json()["response"]
        with c.websocket_connect("/salience/ws", headers={"Authorization": "Bearer k"}) as ws:
            ws.send_json({"id": "1", "method": "GetReadoutManifest", "request": {}})
            assert ws.receive_json() == {"id": "1", "response": {}}


def test_malformed_frames_keep_the_socket_usable() -> None:
    with client() as c, c.websocket_connect("/salience/ws") as ws:
        ws.send_bytes(b"\xff\xff\xff")
        bad = ws_pb.ServerFrame.FromString(ws.receive_bytes())
        assert bad.error.code == "INVALID_ARGUMENT"
        ws.send_json({"id": "x", "method": "Nope", "request": {}})
        assert ws.receive_json()["error"]["code"] == "INVALID_ARGUMENT"
        ws.send_json({"id": "y", "method": "OpenSession", "request": {"model": 5}})
        assert ws.receive_json()["error"]["code"] == "INVALID_ARGUMENT"
        ws.send_text("[]")
        assert ws.receive_json()["error"]["code"] == "INVALID_ARGUMENT"
        frame = ws_pb.ClientFrame(id="o", open_session=pb.OpenSessionRequest(model="fake"))
        ws.send_bytes(frame.SerializeToString())
        opened = ws_pb.ServerFrame.FromString(ws.receive_bytes())
        assert opened.id == "o" and opened.open_session.max_model_len == 512


def test_generate_streams_tokens_then_done_over_json() -> None:
    with client() as c, c.websocket_connect("/salience/ws") as ws:
        ws.send_json({"id": "o", "method": "OpenSession", "request": {"model": "fake"}})
        sid = ws.receive_json()["response"]["sessionId"]
        ws.send_json(
            {
                "id": "g",
                "method": "Generate",
                "request": {"sessionId": sid, "appendTokens": [65, 66], "maxTokens": 3},
            }
        )
        events = [ws.receive_json() for _ in range(4)]
        assert [e["event"]["token"]["id"] for e in events[:3]] == [67, 68, 69]
        assert events[3]["event"]["done"]["completionTokens"] == 3
        ws.send_json({"id": "d", "method": "DumpSession", "request": {"sessionId": sid}})
        assert ws.receive_json()["response"]["tokens"] == [65, 66, 67, 68, 69]
