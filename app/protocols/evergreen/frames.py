"""Evergreen's websocket frames: one `SessionMessage` per frame. Sans-IO.

A binary frame is a serialized message; a text frame is the same message in protobuf's
JSON mapping (so a browser can speak it). The server answers in the encoding of the
client's first frame (`Encoding`). A frame that does not decode is INVALID_ARGUMENT.
"""

from __future__ import annotations

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from app.errors import InvalidRequest
from schemas import evergreen_service_pb2 as service_pb


def decode(frame: bytes | str) -> service_pb.SessionMessage:
    if isinstance(frame, bytes):
        try:
            return service_pb.SessionMessage.FromString(frame)
        except DecodeError as exc:
            raise InvalidRequest(f"not an evergreen.v2.SessionMessage: {exc}") from exc
    try:
        return json_format.Parse(frame, service_pb.SessionMessage())
    except json_format.ParseError as exc:
        raise InvalidRequest(f"not a SessionMessage in protobuf's JSON mapping: {exc}") from exc


def encode(message: service_pb.SessionMessage, binary: bool) -> bytes | str:
    if binary:
        data: bytes = message.SerializeToString()
        return data
    return orjson.dumps(json_format.MessageToDict(message)).decode()


class Encoding:
    """The server's encoding: the one of the client's first frame (JSON until then)."""

    def __init__(self) -> None:
        self.binary: bool | None = None

    def decode(self, frame: bytes | str) -> service_pb.SessionMessage:
        if self.binary is None:
            self.binary = isinstance(frame, bytes)
        return decode(frame)

    def encode(self, message: service_pb.SessionMessage) -> bytes | str:
        return encode(message, bool(self.binary))
