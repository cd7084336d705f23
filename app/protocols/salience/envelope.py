"""Salience's websocket envelope: many calls on one socket, each frame naming its call by a
client-chosen id. Sans-IO.

Text frames are JSON: `{"id", "method", "request"}` (the request in protobuf's JSON
mapping) or `{"id", "cancel": true}` from the client; `{"id", "response"}`,
`{"id", "event"}` or `{"id", "error": {"code", "message"}}` from the server. Binary frames
are `salience.v1.ClientFrame` / `ServerFrame` (`schemas/salience_ws.proto`). A call is
answered in the encoding it was made in (`Call.binary`).

`parse` raises `BadFrame` (INVALID_ARGUMENT, carrying the call id when it could be read,
and the frame's encoding) for anything that is not a call or a cancel. `CallIds` holds
one connection's running Generates by call id, for `cancel`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from app.errors import InvalidRequest, SwitchboardError
from app.protocols.salience.service import METHODS, Generation
from schemas import salience_ws_pb2 as ws_pb

# method -> (its field in ClientFrame, its response's field in ServerFrame)
_FIELDS: Mapping[str, tuple[str, str]] = {
    "OpenSession": ("open_session", "open_session"),
    "CloseSession": ("close_session", "close_session"),
    "ForkSession": ("fork_session", "fork_session"),
    "Generate": ("generate", "event"),
    "GetReadoutManifest": ("get_readout_manifest", "readout_manifest"),
    "DumpSession": ("dump_session", "dump_session"),
}
_METHOD_OF_FIELD = {field: method for method, (field, _) in _FIELDS.items()}


@dataclass(frozen=True, slots=True)
class Call:
    call_id: str
    binary: bool
    method: str
    request: Any  # the method's request message


@dataclass(frozen=True, slots=True)
class Cancel:
    call_id: str
    binary: bool


class BadFrame(InvalidRequest):
    """A frame that is no call: answered under `call_id` ("" if unread), in its encoding."""

    def __init__(self, call_id: str, binary: bool, message: str) -> None:
        super().__init__(message)
        self.call_id = call_id
        self.binary = binary


def parse(frame: bytes | str) -> Call | Cancel:
    return _parse_binary(frame) if isinstance(frame, bytes) else _parse_json(frame)


def _parse_binary(frame: bytes) -> Call | Cancel:
    try:
        message = ws_pb.ClientFrame.FromString(frame)
    except DecodeError as exc:
        raise BadFrame("", True, f"not a salience.v1.ClientFrame: {exc}") from exc
    field = message.WhichOneof("call")
    if field is None:
        raise BadFrame(message.id, True, "the frame names no call")
    if field == "cancel":
        return Cancel(message.id, True)
    return Call(message.id, True, _METHOD_OF_FIELD[field], getattr(message, field))


def _parse_json(frame: str) -> Call | Cancel:
    try:
        body = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise BadFrame("", False, f"not JSON: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
        raise BadFrame("", False, 'a frame is a JSON object with a string "id"')
    call_id = body["id"]
    if body.get("cancel") is True:
        return Cancel(call_id, False)
    name = body.get("method")
    method = METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        raise BadFrame(
            call_id, False, f"unknown method {body.get('method')!r}; one of {list(METHODS)}"
        )
    fields = body.get("request", {})
    if not isinstance(fields, dict):
        # ParseDict checks nested values but trusts its top level to be an object.
        raise BadFrame(call_id, False, f'the "request" of {method.name} must be a JSON object')
    request = method.request()
    try:
        json_format.ParseDict(fields, request)
    except json_format.ParseError as exc:
        raise BadFrame(call_id, False, f"bad {method.name} request: {exc}") from exc
    return Call(call_id, False, method.name, request)


def _frame(call_id: str, binary: bool, field: str, message: Message) -> bytes | str:
    if binary:
        frame = ws_pb.ServerFrame(id=call_id)
        getattr(frame, field).CopyFrom(message)
        data: bytes = frame.SerializeToString()
        return data
    key = field if field in ("event", "error") else "response"
    return orjson.dumps({"id": call_id, key: json_format.MessageToDict(message)}).decode()


def response(call: Call, message: Message) -> bytes | str:
    """A unary call's response, or one event of a Generate's stream."""
    return _frame(call.call_id, call.binary, _FIELDS[call.method][1], message)


def error(call_id: str, binary: bool, exc: SwitchboardError) -> bytes | str:
    """The call failed; nothing more comes for its id."""
    return _frame(
        call_id, binary, "error", ws_pb.CallError(code=exc.grpc_status, message=exc.message)
    )


class CallIds:
    """One connection's running Generates by call id."""

    def __init__(self) -> None:
        self._running: dict[str, Generation] = {}

    def add(self, call: Call, generation: Generation) -> None:
        """Raises `BadFrame` if a Generate of the same id still runs (check first with
        `check`, before the session is touched)."""
        self.check(call)
        self._running[call.call_id] = generation

    def check(self, call: Call) -> None:
        if call.call_id in self._running:
            raise BadFrame(
                call.call_id, call.binary, f"call id {call.call_id!r} is already running"
            )

    def forget(self, call_id: str, generation: Generation) -> None:
        # The id may be in use again by the time this runs.
        if self._running.get(call_id) is generation:
            del self._running[call_id]

    def cancel(self, call_id: str) -> None:
        generation = self._running.get(call_id)
        if generation is not None:
            generation.cancel()
