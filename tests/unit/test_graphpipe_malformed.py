"""Malformed GraphPipe requests, built by hand with flatbuffers' Builder (and byte patches
for what no Builder would write): each is refused by the core with a message naming the
problem, and over HTTP answers a decodable `InferResponse` carrying that `Error`, read
here with the flatc-generated classes."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import numpy as np
import pytest

from app.config import Settings
from app.errors import InvalidRequest, PayloadTooLarge
from app.main import create_app
from app.protocols.graphpipe.decode import decode_request
from app.protocols.graphpipe.tensors import TensorType as T
from tests.fake_engine import FakeEngine
from tests.graphpipe_client import (
    Infer,
    RawTensor,
    infer_request,
    read_infer_response,
    request_with_union,
)

LIMIT = 1 << 20
PATTERN = b"\xab\xcd" * 8  # a payload the patches below can find in the buffer


def one(tensor: RawTensor, **kwargs: Any) -> Callable[[], bytes]:
    return lambda: infer_request(Infer([tensor], **kwargs))


def valid() -> bytes:
    return infer_request(Infer([RawTensor(T.Uint8, [16], PATTERN)], config="CONFIG"))


def patched(at: Callable[[bytes], int], value: bytes) -> Callable[[], bytes]:
    def build() -> bytes:
        buffer = bytearray(valid())
        position = at(bytes(buffer))
        buffer[position : position + len(value)] = value
        return bytes(buffer)

    return build


def _root(buffer: bytes) -> int:
    return int(struct.unpack_from("<I", buffer, 0)[0])


CASES: dict[str, tuple[Callable[[], bytes], str]] = {
    # Not a Request at all.
    "empty body": (lambda: b"", "0 bytes is too short"),
    "garbage": (lambda: b"\xff" * 64, "outside the 64-byte buffer"),
    "truncated": (lambda: valid()[:24], "Not a valid GraphPipe flatbuffer"),
    "root offset past the end": (
        patched(lambda b: 0, struct.pack("<I", 1 << 30)),
        "Request: table at byte 1073741824 is outside",
    ),
    "vtable outside the buffer": (
        patched(_root, struct.pack("<i", -(1 << 30))),
        "Request: vtable at byte",
    ),
    "vector longer than the buffer": (
        patched(lambda b: b.index(PATTERN) - 4, struct.pack("<I", 1 << 31)),
        "input_tensors[0].data: vector of 2147483648 elements runs past the buffer",
    ),
    "string without its NUL": (
        patched(lambda b: b.index(b"CONFIG") + 6, b"!"),
        "InferRequest.config: string is not NUL-terminated",
    ),
    "union type NONE": (lambda: request_with_union(0, None), "Request.req_type: is NONE"),
    "union type unknown": (
        lambda: request_with_union(7, "infer"),
        "Request.req_type: 7 is not a Req type",
    ),
    "InferRequest missing": (lambda: request_with_union(1, None), "req is missing"),
    "name not UTF-8": (
        lambda: infer_request(Infer([np.array(["a"])], input_names=[b"\xff"])),
        "InferRequest.input_names[0]: not valid UTF-8",
    ),
    # Tensors whose fields disagree.
    "shape product disagrees with data": (
        one(RawTensor(T.Float32, [2, 3], bytes(20))),
        "shape [2, 3] of Float32 needs 24 bytes but data has 20",
    ),
    "shape product disagrees with string_val": (
        one(RawTensor(T.String, [3], None, [b"a"])),
        "shape [3] holds 3 strings but string_val has 1",
    ),
    "data and string_val both set": (
        one(RawTensor(T.String, [1], b"x", [b"a"])),
        "both data and string_val are set",
    ),
    "String tensor in data": (
        one(RawTensor(T.String, [4], b"abcd")),
        "String tensors keep their elements in string_val",
    ),
    "numeric tensor in string_val": (
        one(RawTensor(T.Int32, [1], None, [b"abcd"])),
        "Int32 tensors keep their elements in data",
    ),
    "unknown type id": (one(RawTensor(13, [1], b"x")), "unknown type id 13"),
    "type id 255": (one(RawTensor(255, [1], b"x")), "unknown type id 255"),
    "type Null": (one(RawTensor(T.Null, [1], b"x")), "type Null (0) is not a tensor type"),
    "negative dimension": (
        one(RawTensor(T.Int64, [2, -1], bytes(16))),
        "input_tensors[0].shape: dimension 1 is -1",
    ),
    "too many dimensions": (
        one(RawTensor(T.Uint8, [1] * 33, b"x")),
        "33 dimensions is over the limit of 32",
    ),
    "shape too large for numpy": (
        one(RawTensor(T.Uint8, [0, 1 << 62, 1 << 62], b"")),
        "is too large",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_core_refuses_with_a_message_naming_the_problem(case: str) -> None:
    build, message = CASES[case]
    with pytest.raises(InvalidRequest) as raised:
        decode_request(build(), max_bytes=LIMIT)
    assert message in raised.value.message


def test_core_refuses_a_buffer_over_the_limit() -> None:
    buffer = valid()
    decode_request(buffer, max_bytes=len(buffer))
    with pytest.raises(PayloadTooLarge, match=f"{len(buffer)} bytes is over .* {len(buffer) - 1}"):
        decode_request(buffer, max_bytes=len(buffer) - 1)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(model="fake", graphpipe_max_request_bytes=LIMIT), engine=FakeEngine())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://t"
    ) as c:
        yield c


@pytest.mark.parametrize("case", list(CASES))
async def test_http_answers_an_infer_response_with_the_error(
    client: httpx.AsyncClient, case: str
) -> None:
    build, message = CASES[case]
    response = await client.post("/graphpipe", content=build())
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/octet-stream"
    answer = read_infer_response(response.content)
    assert answer.outputs == []
    assert len(answer.errors) == 1
    code, text = answer.errors[0]
    assert code == 400
    assert message in text


async def test_http_refuses_a_body_over_the_limit_declared_or_streamed(
    client: httpx.AsyncClient,
) -> None:
    body = infer_request(Infer([np.zeros(LIMIT, np.uint8)]))
    declared = await client.post("/graphpipe", content=body)

    # No Content-Length: the limit must hold while reading.
    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 65536):
            yield body[start : start + 65536]

    streamed = await client.post("/graphpipe", content=chunks())
    assert "content-length" not in streamed.request.headers
    for response in (declared, streamed):
        assert response.status_code == 413
        [(code, text)] = read_infer_response(response.content).errors
        assert code == 413 and f"over this server's limit of {LIMIT} bytes" in text
    assert "body of at least" in read_infer_response(streamed.content).errors[0][1]
