"""Evergreen sessions as a client drives them: one interface over both transports of the
live server (`Session`: a websocket in JSON or binary frames, or a gRPC StartSession
call), the end of a session in either transport's terms (`End`), and the readers other
tests share (`TestClientSocket` over starlette's TestClient, `outcome` of a JSON socket).

A scenario written against `Session` runs the same on every transport: it sends
`SessionMessage`s, receives them, and reads the end, which is the ABORT message's status
repeated by the transport: a websocket's close code (4000 + the gRPC status code) and
reason, or a gRPC call's status and details.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
import websockets
from google.protobuf import json_format
from starlette.websockets import WebSocketDisconnect

from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from tests.aborts import CLOSE_TIMEOUT
from tests.evergreen_frames import abort_status, message

READ_TIMEOUT_S = 120  # one message of a live session
_STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
_CLOSE_REASON_BYTES = 123  # what a websocket close frame holds


@dataclass(frozen=True)
class End:
    """How a session ended, in its transport's terms."""

    status: str  # the gRPC status name the end says (a websocket's: its close code - 4000)
    code: int | grpc.StatusCode  # the close code, or the call's status code
    details: str  # the close reason, or the status details

    def repeats(self, status: dict[str, Any]) -> bool:
        """Whether the end says what the ABORT said: its code, and its message (a close
        reason holds the first 123 bytes of it, a status the whole message)."""
        said = str(status["message"])
        if isinstance(self.code, int):
            said = said.encode()[:_CLOSE_REASON_BYTES].decode(errors="ignore")
        return self.status == status["code"] and self.details == said


def close_end(code: int, reason: str) -> End:
    name = _STATUS_NAMES.get(code - 4000, f"close {code}") if code >= 4000 else f"close {code}"
    return End(name, code, reason)


class Session(ABC):
    """One Evergreen session on the live server."""

    @abstractmethod
    async def send_message(self, sent: service_pb.SessionMessage) -> None: ...

    @abstractmethod
    async def receive(self) -> service_pb.SessionMessage:
        """The next message; fails if the session has ended instead."""

    @abstractmethod
    async def quiet_for(self, seconds: float) -> bool:
        """Whether nothing arrives for `seconds` (what does arrive stays for `receive`)."""

    @abstractmethod
    async def end(self) -> End:
        """The session's end, its last message read: fails if another message comes."""

    @abstractmethod
    async def leave(self) -> None:
        """The client goes away mid-session: a websocket closes, a gRPC call is cancelled."""

    async def send(self, text: str) -> None:
        """A SessionMessage written in protobuf text format."""
        await self.send_message(message(text))

    async def send_mapping(self, mapping: dict[str, Any]) -> None:
        """A SessionMessage written as its JSON mapping."""
        await self.send_message(json_format.ParseDict(mapping, service_pb.SessionMessage()))

    async def node(self, node_id: str) -> str:
        """The text of node_id, checking its fragments stream as the spec says."""
        fragments: list[Any] = []
        while True:
            received = await self.receive()
            assert not received.actions, received
            for fragment in received.node_fragments:
                assert fragment.id == node_id and fragment.seq == len(fragments)
                fragments.append(fragment)
                if not fragment.continued:
                    first = fragments[0].chunk_fragment.metadata
                    assert (first.mimetype, first.role) == ("text/plain", "model")
                    return b"".join(f.chunk_fragment.data for f in fragments).decode()

    async def aborted(self) -> tuple[dict[str, Any], End]:
        """Past the output already on its way, the ABORT's status; then the end."""
        while True:
            received = await self.receive()
            if received.actions:
                break
        return abort_status(received), await self.end()


class WebsocketSession(Session):
    def __init__(self, ws: Any, binary: bool) -> None:
        self.ws, self.binary = ws, binary
        self._early: list[str | bytes] = []  # a frame `quiet_for` saw

    async def send_message(self, sent: service_pb.SessionMessage) -> None:
        if self.binary:
            await self.ws.send(sent.SerializeToString())
        else:
            await self.ws.send(json_format.MessageToJson(sent))

    async def _frame(self, timeout: float) -> str | bytes:
        if self._early:
            return self._early.pop()
        frame: str | bytes = await asyncio.wait_for(self.ws.recv(), timeout)
        return frame

    async def receive(self) -> service_pb.SessionMessage:
        frame = await self._frame(READ_TIMEOUT_S)
        assert isinstance(frame, bytes) is self.binary, frame
        if isinstance(frame, bytes):
            return service_pb.SessionMessage.FromString(frame)
        return json_format.Parse(frame, service_pb.SessionMessage())

    async def quiet_for(self, seconds: float) -> bool:
        try:
            self._early.append(await self._frame(seconds))  # cancelling recv loses nothing
        except TimeoutError:
            return True
        return False

    async def end(self) -> End:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await self._frame(READ_TIMEOUT_S)
        assert closed.value.rcvd is not None, "no close frame: the connection dropped"
        return close_end(closed.value.rcvd.code, closed.value.rcvd.reason)

    async def leave(self) -> None:
        await self.ws.close()


class GrpcSession(Session):
    def __init__(self, call: Any) -> None:
        self.call = call
        self._reading: asyncio.Future[Any] | None = None  # a read `quiet_for` left pending

    async def send_message(self, sent: service_pb.SessionMessage) -> None:
        await self.call.write(sent)

    def _read(self) -> asyncio.Future[Any]:
        reading, self._reading = self._reading or asyncio.ensure_future(self.call.read()), None
        return reading

    async def receive(self) -> service_pb.SessionMessage:
        received = await asyncio.wait_for(self._read(), READ_TIMEOUT_S)
        assert received is not grpc.aio.EOF, "the call ended"
        assert isinstance(received, service_pb.SessionMessage)
        return received

    async def quiet_for(self, seconds: float) -> bool:
        self._reading = self._read()
        done, _ = await asyncio.wait({self._reading}, timeout=seconds)
        return not done

    async def end(self) -> End:
        with pytest.raises(grpc.aio.AioRpcError) as ended:  # the stream ends with the status
            await asyncio.wait_for(self._read(), READ_TIMEOUT_S)
        assert ended.value.code() == await self.call.code()
        return End(ended.value.code().name, ended.value.code(), ended.value.details() or "")

    async def leave(self) -> None:
        self.call.cancel()
        assert await self.call.code() == grpc.StatusCode.CANCELLED


class Transport:
    """Opens sessions on the live server over one transport: "websocket-json",
    "websocket-binary" or "grpc"."""

    def __init__(self, name: str, live: Any, channel: grpc.aio.Channel | None = None) -> None:
        self.name, self.live, self.channel = name, live, channel

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        if self.channel is not None:
            call = evergreen_grpc.EvergreenServiceStub(self.channel).StartSession()
            try:
                yield GrpcSession(call)
            finally:
                call.cancel()
            return
        # A client that has stopped reading cannot complete a close handshake (its queue
        # is full of output): leaving such a session waits CLOSE_TIMEOUT, then drops it.
        url = f"{self.live.ws_url}/evergreen/ws"
        async with websockets.connect(url, close_timeout=CLOSE_TIMEOUT, max_size=None) as ws:
            yield WebsocketSession(ws, binary=self.name == "websocket-binary")


@asynccontextmanager
async def transport(name: str, live: Any) -> AsyncIterator[Transport]:
    if name != "grpc":
        yield Transport(name, live)
        return
    async with grpc.aio.insecure_channel(live.grpc_target) as channel:
        yield Transport(name, live, channel)


def reference_chat(live: Any, messages: list[dict[str, str]], model: str | None = None) -> str:
    """What the OpenAI chat endpoint of the same server answers, greedily in 8 tokens: the
    same text as an Evergreen GENERATE means Evergreen built the same prompt."""
    body = {
        "model": model or live.model,
        "messages": messages,
        "temperature": 0,
        "max_tokens": 8,
    }
    response = httpx.post(f"{live.base_url}/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    content: str = response.json()["choices"][0]["message"]["content"]
    return content


async def outcome(ws: Any) -> tuple[str, Any]:
    """A JSON socket read to its end: ("text", the response), ("abort", (status, close
    code)) or ("closed", close code)."""
    fragments: list[bytes] = []
    while True:
        try:
            frame = await asyncio.wait_for(ws.recv(), timeout=READ_TIMEOUT_S)
        except websockets.ConnectionClosed as closed:
            return "closed", closed.rcvd.code if closed.rcvd else None
        received = json_format.Parse(frame, service_pb.SessionMessage())
        if received.actions:
            status = abort_status(received)
            with pytest.raises(websockets.ConnectionClosed) as ended:
                await asyncio.wait_for(ws.recv(), timeout=30)
            rcvd = ended.value.rcvd
            return "abort", (status, rcvd.code if rcvd else None)
        for fragment in received.node_fragments:
            fragments.append(fragment.chunk_fragment.data)
            if not fragment.continued:
                return "text", b"".join(fragments).decode()


class TestClientSocket:
    """An Evergreen websocket of starlette's TestClient, in JSON or binary frames."""

    __test__ = False  # not a test class, whatever its name says

    def __init__(self, ws: Any, binary: bool) -> None:
        self.ws, self.binary = ws, binary

    def send(self, text: str) -> None:
        sent = message(text)
        if self.binary:
            self.ws.send_bytes(sent.SerializeToString())
        else:
            self.ws.send_text(json_format.MessageToJson(sent))

    def receive(self) -> service_pb.SessionMessage:
        frame = self.ws.receive()
        if frame["type"] == "websocket.close":
            raise WebSocketDisconnect(frame["code"], frame.get("reason"))
        if self.binary:
            assert frame.get("bytes") is not None, frame
            return service_pb.SessionMessage.FromString(frame["bytes"])
        assert frame.get("text") is not None, frame
        return json_format.Parse(frame["text"], service_pb.SessionMessage())

    def node(self, node_id: str) -> tuple[str, list[Any]]:
        """Read fragments until node_id's final one: (its text, the fragments)."""
        fragments = []
        while True:
            for fragment in self.receive().node_fragments:
                assert fragment.id == node_id
                fragments.append(fragment)
                if not fragment.continued:
                    return b"".join(f.chunk_fragment.data for f in fragments).decode(), fragments

    def aborted(self) -> tuple[dict[str, Any], int, str]:
        """The ABORT message's status, then the close code and reason."""
        status = abort_status(self.receive())
        with pytest.raises(WebSocketDisconnect) as closed:
            self.receive()
        return status, closed.value.code, closed.value.reason
