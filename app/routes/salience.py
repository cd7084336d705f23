"""Salience over one websocket (`/salience/ws`): many calls per socket, JSON or protobuf.

Text frames are JSON (`{"id", "method", "request"}` in protobuf's JSON mapping; cancel
with `{"id", "cancel": true}`); binary frames are `salience.v1.ClientFrame`s. Each call is
answered in its own encoding: a unary response, a stream of Generate events ending with
Done, or an error `{"code": <gRPC status name>, "message"}`. A malformed frame gets an
INVALID_ARGUMENT error and the socket stays usable. Closing the socket cancels its
running Generates (aborting their engine requests); sessions stay for a reconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from app.engine.base import Engine
from app.errors import EngineError, InvalidRequest, SwitchboardError
from app.protocols.salience.generate import GenerateCall
from app.protocols.salience.sessions import Limits, SessionStore
from app.routes.deps import check_credentials, get_engine, get_settings
from schemas import salience_pb2 as pb
from schemas import salience_ws_pb2 as ws_pb

logger = logging.getLogger(__name__)
router = APIRouter()

# method name (as in the proto) -> (oneof field, request class)
_METHODS: dict[str, tuple[str, type[Message]]] = {
    "OpenSession": ("open_session", pb.OpenSessionRequest),
    "CloseSession": ("close_session", pb.CloseSessionRequest),
    "ForkSession": ("fork_session", pb.ForkSessionRequest),
    "Generate": ("generate", pb.GenerateRequest),
    "GetReadoutManifest": ("get_readout_manifest", pb.GetReadoutManifestRequest),
    "DumpSession": ("dump_session", pb.DumpSessionRequest),
}
_FIELD_TO_METHOD = {field: name for name, (field, _) in _METHODS.items()}


class _Shared:
    """What every socket of the app shares: the sessions (they outlive sockets), and the
    running Generate of each busy session, so that closing a session from any socket
    aborts its engine request."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.generating: dict[str, _Running] = {}  # session id -> its running Generate


def _shared(websocket: WebSocket, engine: Engine) -> _Shared:
    state = websocket.app.state
    shared: _Shared | None = getattr(state, "salience", None)
    if shared is None:
        settings = get_settings(websocket)
        limits = Limits(
            max_model_len=engine.info.max_model_len,
            ttl_s=settings.salience_session_ttl_s,
            max_sessions=settings.salience_max_sessions,
            max_session_tokens=settings.salience_max_session_tokens,
            max_images=engine.info.vision.max_images if engine.info.vision else 0,
        )
        shared = _Shared(SessionStore(engine.info.model_name, limits, time.monotonic))
        state.salience = shared
    return shared


class _Socket:
    """One connection: frame codec, its running Generates, serialized sends."""

    def __init__(self, websocket: WebSocket, engine: Engine, shared: _Shared) -> None:
        self.websocket = websocket
        self.engine = engine
        self.store = shared.store
        self.generating = shared.generating
        self.running: dict[str, _Running] = {}  # call id -> this socket's Generate
        self._send_lock = asyncio.Lock()
        self.open = True

    async def _send(self, call_id: str, binary: bool, kind: str, message: Message) -> None:
        if not self.open:
            return
        try:
            async with self._send_lock:
                if binary:
                    frame = ws_pb.ServerFrame(id=call_id)
                    getattr(frame, kind).CopyFrom(message)
                    await self.websocket.send_bytes(frame.SerializeToString())
                else:
                    key = {"event": "event", "error": "error"}.get(kind, "response")
                    body = {"id": call_id, key: json_format.MessageToDict(message)}
                    await self.websocket.send_text(orjson.dumps(body).decode())
        except (WebSocketDisconnect, RuntimeError):
            self.open = False

    async def error(self, call_id: str, binary: bool, exc: SwitchboardError) -> None:
        await self._send(
            call_id, binary, "error", ws_pb.CallError(code=exc.grpc_status, message=exc.message)
        )

    # -- parsing -------------------------------------------------------------------

    def parse(self, message: Mapping[str, Any]) -> tuple[str, bool, str | None, Message | None]:
        """(call id, binary?, method or None for cancel, request)."""
        if message.get("bytes") is not None:
            try:
                frame = ws_pb.ClientFrame.FromString(message["bytes"])
            except DecodeError as exc:
                raise _BadFrame("", True, f"not a salience.v1.ClientFrame: {exc}") from exc
            field = frame.WhichOneof("call")
            if field is None:
                raise _BadFrame(frame.id, True, "the frame names no call")
            if field == "cancel":
                return frame.id, True, None, None
            return frame.id, True, _FIELD_TO_METHOD[field], getattr(frame, field)
        try:
            body = orjson.loads(message.get("text") or "")
        except orjson.JSONDecodeError as exc:
            raise _BadFrame("", False, f"not JSON: {exc}") from exc
        if not isinstance(body, dict) or not isinstance(body.get("id"), str):
            raise _BadFrame("", False, 'a frame is a JSON object with a string "id"')
        call_id = body["id"]
        if body.get("cancel") is True:
            return call_id, False, None, None
        method = body.get("method")
        if method not in _METHODS:
            raise _BadFrame(call_id, False, f"unknown method {method!r}; one of {list(_METHODS)}")
        fields = body.get("request", {})
        if not isinstance(fields, dict):
            # ParseDict checks nested values but trusts its top level to be an object.
            raise _BadFrame(call_id, False, f'the "request" of {method} must be a JSON object')
        request = _METHODS[method][1]()
        try:
            json_format.ParseDict(fields, request)
        except json_format.ParseError as exc:
            raise _BadFrame(call_id, False, f"bad {method} request: {exc}") from exc
        return call_id, False, method, request

    # -- calls ---------------------------------------------------------------------

    async def unary(self, call_id: str, binary: bool, method: str, request: Any) -> None:
        store = self.store
        if method == "OpenSession":
            session = store.open(request.model)
            kind, reply = (
                "open_session",
                pb.OpenSessionResponse(
                    session_id=session.session_id, max_model_len=store.limits.max_model_len
                ),
            )
        elif method == "CloseSession":
            running = self.generating.get(request.session_id)
            if running is not None:
                running.cancel()
            store.close(request.session_id)
            kind, reply = "close_session", pb.CloseSessionResponse()
        elif method == "ForkSession":
            session = store.fork(request.session_id, request.at_position)
            kind, reply = "fork_session", pb.ForkSessionResponse(session_id=session.session_id)
        elif method == "DumpSession":
            tokens = store.get(request.session_id).tokens
            kind, reply = "dump_session", pb.DumpSessionResponse(tokens=tokens.tolist())
        else:
            manifest = self.engine.info.readout
            reply = pb.ReadoutManifest()
            if manifest is not None:
                reply = pb.ReadoutManifest(
                    concepts=manifest.concepts,
                    layers=manifest.layers,
                    hidden_size=manifest.hidden_size,
                    dtype=manifest.dtype,
                )
            kind = "readout_manifest"
        await self._send(call_id, binary, kind, reply)

    def cancel(self, call_id: str) -> None:
        running = self.running.get(call_id)
        if running is not None:
            running.cancel()

    def start_generate(self, call_id: str, binary: bool, request: pb.GenerateRequest) -> None:
        """Apply the Generate to its session now, in frame order (a DumpSession sent
        right after it sees the append), then stream it in a task of its own."""
        if call_id in self.running:
            raise _BadFrame(call_id, binary, f"call id {call_id!r} is already running")
        call = GenerateCall(
            self.store, request, self.engine.info, request_id=f"sal-{uuid.uuid4().hex}"
        )
        running = _Running(call)
        running.task = asyncio.create_task(self._generate(call_id, binary, running))
        self.running[call_id] = running
        session_id = call.session.session_id
        self.generating[session_id] = running

        def forget(_: asyncio.Task[None]) -> None:
            # Both ids may be in use again by the time this runs.
            if self.running.get(call_id) is running:
                del self.running[call_id]
            if self.generating.get(session_id) is running:
                del self.generating[session_id]

        running.task.add_done_callback(forget)

    async def _generate(self, call_id: str, binary: bool, running: _Running) -> None:
        running.started = True
        call = running.call
        try:
            if call.engine_request is not None and not running.cancelled:
                stream = self.engine.generate(call.engine_request)
                try:
                    async for event in stream:
                        for out in call.on_event(event):
                            await self._send(call_id, binary, "event", out)
                finally:
                    await stream.aclose()
        except asyncio.CancelledError:
            running.cancelled = True
        except SwitchboardError as exc:
            call.abandon()
            await self.error(call_id, binary, exc)
            return
        except Exception as exc:  # a bug must end the call in the protocol's shape
            logger.exception("Generate %s failed", call_id)
            call.abandon()
            await self.error(call_id, binary, EngineError(f"internal error: {exc!r}"))
            return
        for out in call.done(cancelled=running.cancelled):
            await self._send(call_id, binary, "event", out)

    async def close(self) -> None:
        """The socket is gone: cancel its Generates and wait until their engine requests
        are aborted and their sessions freed (the sessions themselves stay)."""
        self.open = False
        running = list(self.running.values())
        for call in running:
            call.cancel()
        await asyncio.gather(*(call.task for call in running), return_exceptions=True)


class _Running:
    """One Generate in flight on a socket."""

    def __init__(self, call: GenerateCall) -> None:
        self.call = call
        self.task: asyncio.Task[None]
        self.started = False
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        # A task cancelled before its first step never runs its body: it would neither
        # free the session nor answer. Such a task sees `cancelled` when it starts.
        if self.started:
            self.task.cancel()


class _BadFrame(Exception):
    def __init__(self, call_id: str, binary: bool, message: str) -> None:
        super().__init__(message)
        self.call_id = call_id
        self.binary = binary
        self.message = message


@router.websocket("/salience/ws")
async def salience_socket(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        check_credentials(websocket)
    except SwitchboardError as exc:
        body = {"id": "", "error": {"code": exc.grpc_status, "message": exc.message}}
        await websocket.send_text(orjson.dumps(body).decode())
        await websocket.close(code=1008)
        return
    engine = get_engine(websocket)
    sock = _Socket(websocket, engine, _shared(websocket, engine))
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            call_id, binary, method = "", message.get("bytes") is not None, None
            try:
                call_id, binary, method, request = sock.parse(message)
                if method is None:
                    sock.cancel(call_id)
                elif method == "Generate":
                    sock.start_generate(call_id, binary, request)
                else:
                    await sock.unary(call_id, binary, method, request)
            except _BadFrame as bad:
                await sock.error(bad.call_id, bad.binary, InvalidRequest(bad.message))
            except SwitchboardError as exc:
                await sock.error(call_id, binary, exc)
            except Exception as exc:  # a bug fails its call, never the socket
                logger.exception("Salience %s failed", method)
                await sock.error(call_id, binary, EngineError(f"internal error: {exc!r}"))
    except WebSocketDisconnect:
        pass
    finally:
        await sock.close()
