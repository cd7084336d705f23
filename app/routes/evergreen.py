"""Evergreen over a websocket (`/evergreen/ws`): one socket is one session.

Binary frames are serialized `evergreen.v2.SessionMessage`s; text frames are the same
messages in protobuf's JSON mapping, so a browser can speak it. The server answers in the
encoding of the client's first frame. Bearer auth as on every route (header, or `?token=`).

The session core (`app.protocols.evergreen.session`) decides everything; this module
moves bytes. It runs each action the core releases as a task on the shared engine,
streams the output node's fragments as the engine produces text, reads `file://` refs
under the configured root, and ends the session:

- a broken rule or a failed action aborts it: every running action is cancelled (which
  aborts its engine request), a final message carries an `ABORT` action whose one config
  is a `google.protobuf.Struct` `{"code": <gRPC status name>, "message": ...}`, and the
  socket closes with code 4000 + the gRPC status code (4003 INVALID_ARGUMENT, 4005
  NOT_FOUND, 4008 RESOURCE_EXHAUSTED, 4013 INTERNAL, 4016 UNAUTHENTICATED, ...) and the
  message, cut to the 123 bytes a close frame holds, as its reason;
- the client closing the socket ends it the same way, without the message. Either way
  the session's nodes are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from google.protobuf import json_format, struct_pb2
from google.protobuf.message import DecodeError

from app.config import Settings
from app.engine.base import Engine, GenerationRequest, TokenEvent
from app.errors import Aborted, EngineError, InvalidRequest, ResourceExhausted, SwitchboardError
from app.protocols.evergreen.generate import (
    OUTPUT_METADATA,
    Chunk,
    GeneratePlan,
    plan_action,
    prompt_token_ids,
)
from app.protocols.evergreen.refs import FileRef
from app.protocols.evergreen.session import Leaf, Limits, Ready, Session
from app.routes.deps import check_credentials, get_engine, get_settings
from schemas import evergreen_pb2 as pb
from schemas import evergreen_service_pb2 as service_pb

logger = logging.getLogger(__name__)
router = APIRouter()
ABORT_ACTION = "ABORT"
_CLOSE_REASON_BYTES = 123


def _limits(settings: Settings) -> Limits:
    return Limits(
        max_nodes=settings.evergreen_max_nodes,
        max_bytes=settings.evergreen_max_bytes,
        max_pending_actions=settings.evergreen_max_pending_actions,
        max_depth=settings.evergreen_max_depth,
        files_allowed=settings.evergreen_file_root is not None,
    )


def abort_message(exc: SwitchboardError) -> service_pb.SessionMessage:
    status = struct_pb2.Struct()
    status.update({"code": exc.evergreen_reason, "message": exc.message})
    action = pb.Action(name=ABORT_ACTION)
    action.configs.add().Pack(status)
    return service_pb.SessionMessage(actions=[action])


def _read_file(root: Path, ref: FileRef, limit: int) -> bytes:
    """The file a ref names, if it is a regular file inside `root` once every symlink is
    followed."""
    base = root.resolve(strict=True)
    try:
        path = (base / ref.relative_path).resolve(strict=True)
    except (FileNotFoundError, RuntimeError) as exc:
        raise InvalidRequest(f"file ref {ref.relative_path!r}: no such file") from exc
    except OSError as exc:  # a file where a directory should be, a name too long, ...
        raise InvalidRequest(f"file ref {ref.relative_path!r}: {exc.strerror}") from exc
    if not path.is_relative_to(base):
        raise InvalidRequest(f"file ref {ref.relative_path!r} leads outside the file root")
    if not path.is_file():
        raise InvalidRequest(f"file ref {ref.relative_path!r} is not a regular file")
    try:
        if path.stat().st_size > limit:
            raise ResourceExhausted(f"file ref {ref.relative_path!r} is larger than {limit} bytes")
        return path.read_bytes()
    except OSError as exc:  # unreadable: the client named it, the server is fine
        raise InvalidRequest(f"file ref {ref.relative_path!r}: {exc.strerror}") from exc


class _Connection:
    """One socket, one session: the frame codec, the running actions, the ending."""

    def __init__(self, websocket: WebSocket, engine: Engine, settings: Settings) -> None:
        self.websocket = websocket
        self.engine = engine
        self.settings = settings
        self.session: Session[GeneratePlan] = Session(
            _limits(settings), lambda action: plan_action(action, engine.info, engine.has_model)
        )
        self.binary = False  # set by the client's first frame
        self._seen_frame = False
        self.actions: dict[int, asyncio.Task[None]] = {}
        self.failure: SwitchboardError | None = None
        self._failed = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self.open = True

    # -- frames ----------------------------------------------------------------------

    def decode(self, message: Mapping[str, Any]) -> service_pb.SessionMessage:
        data = message.get("bytes")
        if not self._seen_frame:
            self._seen_frame, self.binary = True, data is not None
        if data is not None:
            try:
                return service_pb.SessionMessage.FromString(data)
            except DecodeError as exc:
                raise InvalidRequest(f"not an evergreen.v2.SessionMessage: {exc}") from exc
        try:
            return json_format.Parse(message.get("text") or "", service_pb.SessionMessage())
        except json_format.ParseError as exc:
            raise InvalidRequest(f"not a SessionMessage in protobuf's JSON mapping: {exc}") from exc

    async def send(self, message: service_pb.SessionMessage) -> None:
        if not self.open:
            return
        try:
            async with self._send_lock:
                if self.binary:
                    await self.websocket.send_bytes(message.SerializeToString())
                else:
                    body = json_format.MessageToDict(message)
                    await self.websocket.send_text(orjson.dumps(body).decode())
        except (WebSocketDisconnect, RuntimeError):
            self.open = False

    # -- the session -----------------------------------------------------------------

    async def serve(self) -> None:
        reader = asyncio.create_task(self._read())
        failed = asyncio.create_task(self._failed.wait())
        try:
            await asyncio.wait({reader, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Ended here, before any await: no action can start after the snapshot of
            # the tasks to cancel. Shielded: even when this handler is cancelled (server
            # shutdown), every engine request of the session is aborted.
            self.session.end(self.failure)
            await asyncio.shield(self._end([reader, failed, *self.actions.values()]))
        if self.failure is not None:
            await self.abort(self.failure)

    async def _end(self, tasks: Sequence[asyncio.Task[Any]]) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.session.end(self.failure)

    async def _read(self) -> None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                self.open = False
                self.session.end()  # running actions stop at their next fragment
                return
            try:
                ready = self.session.receive(self.decode(message))
            except SwitchboardError as exc:
                self.fail(exc)
                return
            except Exception as exc:  # a bug must end the session in the protocol's shape
                logger.exception("Evergreen message failed")
                self.fail(EngineError(f"internal error: {exc!r}"))
                return
            self.start(ready)

    def start(self, ready: Sequence[Ready[GeneratePlan]]) -> None:
        if self.session.ended is not None:
            return
        for action in ready:
            task = asyncio.create_task(self._run(action))
            self.actions[action.index] = task
            task.add_done_callback(functools.partial(self._forget, action.index))

    def _forget(self, index: int, _: asyncio.Task[None]) -> None:
        self.actions.pop(index, None)

    def fail(self, exc: SwitchboardError) -> None:
        """Abort the session. It ends at once, not when `serve` gets to it: a message
        the reader takes meanwhile must not start actions, nor a running one emit.
        Nothing to report once the client has left."""
        if self.failure is None and self.open:
            self.failure = exc
            self.session.end(exc)
            self._failed.set()

    async def abort(self, exc: SwitchboardError) -> None:
        await self.send(abort_message(exc))
        reason = exc.message.encode()[:_CLOSE_REASON_BYTES].decode(errors="ignore")
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # the client left first
            await self.websocket.close(code=exc.evergreen_close_code, reason=reason)

    # -- one action ------------------------------------------------------------------

    async def _run(self, ready: Ready[GeneratePlan]) -> None:
        plan = ready.plan
        try:
            chunks = await self._chunks(self.session.leaves(plan.input_ids[0]))
            ids, sampling = prompt_token_ids(plan, chunks, self.engine.tokenizer, self.engine.info)
            if plan.output_ids:
                request = GenerationRequest(
                    request_id=f"evg-{uuid.uuid4().hex}",
                    prompt_token_ids=ids,
                    sampling=sampling,
                    lora_name=plan.lora_name,
                )
                stream = self.engine.generate(request)
                try:
                    async for event in stream:
                        await self._output(plan.output_ids[0], event)
                finally:
                    await stream.aclose()
            self.start(self.session.finish(ready.index))
        except SwitchboardError as exc:
            self.fail(exc)
        except Exception as exc:  # a bug must end the session in the protocol's shape
            logger.exception("Evergreen action #%d failed", ready.index)
            self.fail(EngineError(f"internal error: {exc!r}"))

    async def _output(self, node_id: str, event: TokenEvent) -> None:
        if event.finish_reason == "abort":
            raise Aborted("the engine aborted the generation")
        final = event.finish_reason is not None
        data = event.text.encode()
        if data or final:
            fragment = self.session.emit(node_id, data, final, OUTPUT_METADATA)
            await self.send(service_pb.SessionMessage(node_fragments=[fragment]))

    async def _chunks(self, leaves: Sequence[Leaf]) -> list[Chunk]:
        root = self.settings.evergreen_file_root
        budget = self.settings.evergreen_max_bytes
        out: list[Chunk] = []
        for leaf in leaves:
            parts: list[bytes] = []
            for part in leaf.parts:
                if isinstance(part, FileRef):
                    assert root is not None  # the session refuses file refs without a root
                    part = await asyncio.to_thread(_read_file, root, part, budget)
                budget -= len(part)
                if budget < 0:
                    raise ResourceExhausted(
                        f"the input is larger than {self.settings.evergreen_max_bytes} bytes"
                    )
                parts.append(part)
            out.append(Chunk(leaf.node_id, leaf.metadata, b"".join(parts)))
        return out


@router.websocket("/evergreen/ws")
async def evergreen_socket(websocket: WebSocket) -> None:
    await websocket.accept()
    connection = _Connection(websocket, get_engine(websocket), get_settings(websocket))
    try:
        check_credentials(websocket)
    except SwitchboardError as exc:
        await connection.abort(exc)
        return
    await connection.serve()
