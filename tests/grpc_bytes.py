"""gRPC methods called with the bytes that go on the wire (hostile or hand-made messages),
not with messages a stub serializes: the callables of a channel whose requests and replies
are `bytes` as they are (grpcio's default when given no serializer, which its type stubs
cannot express)."""

from __future__ import annotations

import grpc


def _as_is(data: bytes) -> bytes:
    return data


def unary_unary(
    channel: grpc.aio.Channel, method: str
) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary(method, request_serializer=_as_is, response_deserializer=_as_is)


def unary_stream(
    channel: grpc.aio.Channel, method: str
) -> grpc.aio.UnaryStreamMultiCallable[bytes, bytes]:
    return channel.unary_stream(method, request_serializer=_as_is, response_deserializer=_as_is)


def stream_stream(
    channel: grpc.aio.Channel, method: str
) -> grpc.aio.StreamStreamMultiCallable[bytes, bytes]:
    return channel.stream_stream(method, request_serializer=_as_is, response_deserializer=_as_is)
